#!/usr/bin/env python
"""Run NVIDIA's own HPS TensorFlow plugin tests (github.com/NVIDIA-Merlin/HugeCTR, ``hps_tf/test``)
against this project's ``hierarchical_parameter_server``.

The tests are NVIDIA's code, read from a HugeCTR git repository you have at ``--commit`` (the last
commit that had ``hps_tf``; HugeCTR removed it after) and run unchanged (``upstream.py`` says how),
each with ``python -m pytest`` in a fresh working directory (they write their ps_config, model files
and SavedModels there) together with the integration folder's helper scripts, which the table-fusion
test starts with a bare ``python``: this interpreter's folder leads ``PATH``. HPS runs on the CPU
here; NVIDIA's tests take the GPU where they name one.

Usage::

    python ci/upstream_hps_tests.py --hugectr /path/to/HugeCTR             # every test
    python ci/upstream_hps_tests.py --hugectr ... --only naive_dnn          # a subset
    python ci/upstream_hps_tests.py --hugectr ... --markdown results.md     # the table for the docs

Exit status: 0 when every test passed (or cannot run here, CANNOT_RUN), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from upstream import Run, base_env, execute, git, markdown, report, write_script

#: The last HugeCTR commit with hps_tf (its next, d4fecdb3f "Changes for 25.03", removed it).
COMMIT = "af9025667eb3f66b959fc861061cfa3ac721a887"
TESTS = ("hps_tf/test/integration", "hps_tf/test/unit")
#: What the results table leaves out of the tests' paths.
PREFIX = "hps_tf/test/"
#: Tests that cannot run with this project, and why.
CANNOT_RUN = {
    "test_multi_gpu_hps.py": (
        "one process serving 4 GPUs (deployed_device_list [0, 1, 2, 3] under MirroredStrategy): HPS here "
        "serves one replica per process, on the first GPU it sees"
    ),
}


def tests(repo: str, commit: str) -> tuple[list[str], list[str]]:
    """(the test files, the other scripts of their folders) at ``commit``, in a stable order."""
    listed = git(repo, "ls-tree", "-r", "--name-only", commit, "--", *TESTS).split()
    names = sorted(n for n in listed if n.endswith(".py"))
    is_test = [Path(n).name.startswith("test_") for n in names]
    return [n for n, t in zip(names, is_test) if t], [n for n, t in zip(names, is_test) if not t]


def run_one(repo: str, run: Run, helpers: list[str], timeout: float, python: str) -> None:
    reason = CANNOT_RUN.get(Path(run.script).name)
    if reason:
        run.status, run.tail = "SKIP", reason
        return
    with tempfile.TemporaryDirectory(prefix="hps-upstream-") as work:
        script = write_script(repo, run, work)
        for helper in helpers:
            if Path(helper).parent == Path(run.script).parent:
                write_script(repo, Run(helper, run.commit, 1), work)
        env = base_env(PATH=os.pathsep.join([str(Path(python).parent), os.environ.get("PATH", "")]))
        command = [python, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", str(script)]
        execute(run, command, work, env, timeout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hugectr", required=True, help="a HugeCTR git repository (clone or bare mirror)")
    parser.add_argument("--commit", default=COMMIT, help=f"commit of the tests (default {COMMIT[:9]})")
    parser.add_argument("--only", nargs="+", default=[], help="run the tests whose path contains any of these")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per test file (default 900)")
    parser.add_argument("--json", help="write every run (with the end of the output of failures) here")
    parser.add_argument("--markdown", help="write the results table here")
    args = parser.parse_args(argv)
    found, helpers = tests(args.hugectr, args.commit)
    runs = [Run(path, args.commit, 1) for path in found if not args.only or any(part in path for part in args.only)]
    for i, run in enumerate(runs, 1):
        run_one(args.hugectr, run, helpers, args.timeout, sys.executable)
        report(i, len(runs), run)
    passed = sum(r.status == "PASS" for r in runs)
    skipped = sum(r.status == "SKIP" for r in runs)
    print(f"\n{passed} of {len(runs)} test files passed, {skipped} skipped (CANNOT_RUN)")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in runs], indent=2))
    if args.markdown:
        Path(args.markdown).write_text(markdown(runs, PREFIX))
    return 0 if passed + skipped == len(runs) else 1


if __name__ == "__main__":
    sys.exit(main())
