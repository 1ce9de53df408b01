# The entry points named in the README. Each sets everything up first (ci/setup.sh is idempotent).
.PHONY: setup demo demo-np2 test bench lint docs

setup:
	bash ci/setup.sh

# The demo: train a DLRM on Criteo-shaped data, dump it, serve it through HPS (build/demo), tour the storages.
demo: setup
	.venv/bin/sok demo

# The same training on two Horovod ranks (data- and model-parallel), then serving in one process.
demo-np2: setup
	TF_NUM_INTRAOP_THREADS=1 HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=600 .venv/bin/horovodrun -np 2 -H localhost:2 --gloo .venv/bin/sok demo --part train --output build/demo-np2
	.venv/bin/sok demo --part serve --output build/demo-np2

test: setup
	bash ci/test.sh

bench: setup
	.venv/bin/python benchmarks/storage_cpu.py
	.venv/bin/python benchmarks/dynamic_train_cpu.py
	.venv/bin/python benchmarks/lookup_sparse_cpu.py

lint: setup
	.venv/bin/ruff check packages benchmarks

# The documentation site, built strictly (as ci/test.sh does) into build/site; open build/site/index.html.
docs: setup
	NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict
