# The entry points named in the README. Each sets everything up first (ci/setup.sh is idempotent).
.PHONY: setup demo test bench lint

setup:
	bash ci/setup.sh

demo: setup
	.venv/bin/sok demo

test: setup
	bash ci/test.sh

bench: setup
	.venv/bin/python benchmarks/storage_cpu.py

lint: setup
	.venv/bin/ruff check packages benchmarks
