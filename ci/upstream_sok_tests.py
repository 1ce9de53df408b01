#!/usr/bin/env python
"""Run NVIDIA's own SOK 2.x function tests (github.com/NVIDIA-Merlin/HugeCTR) against this project.

The scripts are NVIDIA's code: they are read from a HugeCTR git repository you have (a clone, or the
git directory of a mirror) at a pinned commit, written to a temporary directory and run there
unchanged, never copied into this project. Each runs in a fresh working directory (they write
``./weight``), under tf_keras (``TF_USE_LEGACY_KERAS=1``: the Keras 2 they were written for), on the
CPU, as ``python SCRIPT`` (np 1) and ``horovodrun -np 2 --gloo python SCRIPT`` (np 2), with Horovod's
stall shutdown set so that no run hangs. PASS means exit status 0 (the scripts assert their own
results against TensorFlow). One shim (``NUMPY_SHIM``): ``np.in1d``, which NumPy 2.4 removed, is
restored as ``np.isin`` in the scripts' processes.

In scope: the TF2 function tests of HugeCTR at ``--commit`` (``test/function_test/tf2``), those of the
older ``sparse_operation_kit.experiment`` namespace at ``--experiment-commit`` (the last commit that
had them) and the incremental-dump example. The TF1 scripts (``tf.compat.v1`` sessions) are out of
scope: this project supports TensorFlow 2 only.

Usage::

    python ci/upstream_sok_tests.py --hugectr /path/to/HugeCTR            # every script, np 1 and 2
    python ci/upstream_sok_tests.py --hugectr ... --only sp_weight --np 2  # a subset
    python ci/upstream_sok_tests.py --hugectr ... --markdown results.md    # the table for the README

Exit status: 0 when every run passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from upstream import Run, base_env, conclude, execute, git, markdown, report, write_script

#: HugeCTR's newest commit (2025-09-15) and the last one with the experiment namespace's tests.
COMMIT = "2f2016fa897916717d7193c4c1b5f4f5701bff4b"
EXPERIMENT_COMMIT = "fb582afd0"
TESTS = "sparse_operation_kit/sparse_operation_kit/test/function_test/tf2"
EXPERIMENT_TESTS = "sparse_operation_kit/sparse_operation_kit/experiment/test/function_test/tf2"
EXAMPLE = "sparse_operation_kit/example/sok_incremental_dump/incremental_dump_test.py"
#: What the results table leaves out of the scripts' paths.
PREFIX = "sparse_operation_kit/sparse_operation_kit/"
#: Seconds a collective may wait for a rank that never joins before Horovod ends the run.
STALL_SHUTDOWN_S = "120"
#: Scripts for one process only, not run at np > 1: those NVIDIA's run_function_test*.sh start in one
#: process, and lookup_sparse_distributed_dynamic_with_sample_key_zero_test.py, which no runner of
#: NVIDIA's starts and which indexes its local output with positions in the global batch.
SINGLE_PROCESS = ("/variable/", "sparse_read_evict.py", "sok_incremental_dump/", "with_sample_key_zero_test.py")
#: Scripts that cannot run on the development machines, and why.
CANNOT_RUN = {
    "dump_load_distribute_static_big_table.py": (
        "builds a 40,960,000 x 128 float64 table (39 GiB) in every process; the CPU machines have 24 GiB"
    ),
}
#: Put on the scripts' path as sitecustomize.py: NumPy 2.4 (TensorFlow 2.21's) removed ``np.in1d``, a
#: deprecated alias of ``np.isin`` that sparse_read_evict.py's own checks call. The script is unchanged.
NUMPY_SHIM = """import numpy
if not hasattr(numpy, "in1d"):
    numpy.in1d = numpy.isin
"""


def scripts(repo: str, commit: str, experiment_commit: str) -> list[tuple[str, str]]:
    """(path, commit) of every in-scope script, in a stable order."""
    found = []
    for prefix, at in ((TESTS, commit), (EXPERIMENT_TESTS, experiment_commit)):
        names = git(repo, "ls-tree", "-r", "--name-only", at, "--", prefix).split()
        found += [(n, at) for n in sorted(names) if n.endswith(".py")]
    found.append((EXAMPLE, commit))
    return found


def run_one(repo: str, run: Run, timeout: float, python: str, horovodrun: str) -> None:
    reason = CANNOT_RUN.get(Path(run.script).name)
    if reason:
        run.status, run.tail = "SKIP", reason
        return
    with tempfile.TemporaryDirectory(prefix="sok-upstream-") as work:
        script = write_script(repo, run, work)
        shim = Path(work) / "shim"
        shim.mkdir()
        (shim / "sitecustomize.py").write_text(NUMPY_SHIM)
        env = base_env(
            PYTHONPATH=os.pathsep.join(filter(None, [str(shim), os.environ.get("PYTHONPATH")])),
            HOROVOD_STALL_CHECK_TIME_SECONDS="60",
            HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=STALL_SHUTDOWN_S,
        )
        command = [python, str(script)]
        if run.np > 1:
            command = [horovodrun, "-np", str(run.np), "-H", f"localhost:{run.np}", "--gloo", *command]
        execute(run, command, work, env, timeout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hugectr", help="a HugeCTR git repository (clone or bare mirror)")
    parser.add_argument("--commit", default=COMMIT, help=f"commit of the current tests (default {COMMIT[:9]})")
    parser.add_argument("--experiment-commit", default=EXPERIMENT_COMMIT, help="commit of the experiment tests")
    parser.add_argument("--np", type=int, nargs="+", default=[1, 2], help="ranks per run (default 1 2)")
    parser.add_argument("--only", nargs="+", default=[], help="run the scripts whose path contains any of these")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per run (default 900)")
    parser.add_argument("--json", help="write every run (with the end of the output of failures) here")
    parser.add_argument("--markdown", help="write the results table here")
    parser.add_argument(
        "--table-from", nargs="+", metavar="JSON", help="print the table of earlier --json files; run nothing"
    )
    args = parser.parse_args(argv)
    if args.table_from:
        saved = [Run(**r) for path in args.table_from for r in json.loads(Path(path).read_text())]
        kept = [r for r in saved if r.np == 1 or not any(p in r.script for p in SINGLE_PROCESS)]
        print(markdown(kept, PREFIX), end="")
        return 0
    if not args.hugectr:
        parser.error("--hugectr is required (a HugeCTR clone or git directory)")
    bin_dir = Path(sys.executable).parent
    horovodrun = shutil.which("horovodrun", path=str(bin_dir)) or "horovodrun"
    runs = [
        Run(path, commit, np_)
        for path, commit in scripts(args.hugectr, args.commit, args.experiment_commit)
        if not args.only or any(part in path for part in args.only)
        for np_ in args.np
        if np_ == 1 or not any(part in path for part in SINGLE_PROCESS)
    ]
    for i, run in enumerate(runs, 1):
        run_one(args.hugectr, run, args.timeout, sys.executable, horovodrun)
        report(i, len(runs), run)
    return conclude(runs, "runs", args.json, args.markdown, PREFIX)


if __name__ == "__main__":
    sys.exit(main())
