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
from pathlib import Path

from upstream import Run, base_env, conclude, execute, git, report, write_script

#: The last HugeCTR commit with hps_tf (its next, d4fecdb3f "Changes for 25.03", removed it).
COMMIT = "af9025667eb3f66b959fc861061cfa3ac721a887"
TESTS = ("hps_tf/test/integration", "hps_tf/test/unit")
NOTEBOOKS = "hps_tf/notebooks"
#: What the results table leaves out of the tests' paths.
PREFIX = "hps_tf/test/"
#: Tests that cannot run with this project, and why.
CANNOT_RUN = {
    "hps_tensorflow_triton_deployment_demo.ipynb": "deploys to a Triton Inference Server, which is not installed here",
    "sok_to_hps_dlrm_demo.ipynb": "trains with SOK 1.x (its unit-test utils, sok.Saver), which SOK 2.x replaced",
    "sok_train_demo.ipynb": "trains with SOK 1.x (sok.Saver: embedding_saver), which SOK 2.x replaced",
}


def tests(repo: str, commit: str) -> tuple[list[str], list[str]]:
    """(the test files, the other scripts of their folders) at ``commit``, in a stable order."""
    listed = git(repo, "ls-tree", "-r", "--name-only", commit, "--", *TESTS).split()
    names = sorted(n for n in listed if n.endswith(".py"))
    is_test = [Path(n).name.startswith("test_") for n in names]
    return [n for n, t in zip(names, is_test) if t], [n for n, t in zip(names, is_test) if not t]


def notebooks(repo: str, commit: str) -> list[str]:
    """The notebooks at ``commit``, in a stable order."""
    return sorted(
        n for n in git(repo, "ls-tree", "-r", "--name-only", commit, "--", NOTEBOOKS).split() if n.endswith(".ipynb")
    )


def notebook_script(text: str) -> str:
    """A notebook's code cells as one Python script, run as Jupyter's IPython kernel runs them: a
    ``%%writefile PATH`` cell writes the rest of the cell to PATH, a ``!command`` line runs in the
    shell (stopping the script where it fails). Any other magic is refused (ValueError)."""
    lines = ["import subprocess"]
    for cell in json.loads(text)["cells"]:
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        head, _, body = source.partition("\n")
        if head.startswith("%%writefile "):
            lines.append(f"open({head.split(maxsplit=1)[1].strip()!r}, 'w').write({body + chr(10)!r})")
            continue
        for line in source.splitlines():
            stripped = line.lstrip()
            if stripped.startswith("!"):
                indent = line[: len(line) - len(stripped)]
                lines.append(f"{indent}subprocess.run({stripped[1:]!r}, shell=True, check=True)")
            elif stripped.startswith("%"):
                raise ValueError(f"a magic this runner does not run: {stripped!r}")
            else:
                lines.append(line)
    return "\n".join(lines) + "\n"


def run_one(repo: str, run: Run, helpers: list[str], timeout: float, python: str) -> None:
    reason = CANNOT_RUN.get(Path(run.script).name)
    if reason:
        run.status, run.tail = "SKIP", reason
        return
    with tempfile.TemporaryDirectory(prefix="hps-upstream-") as work:
        env = base_env(PATH=os.pathsep.join([str(Path(python).parent), os.environ.get("PATH", "")]))
        if run.script.endswith(".ipynb"):
            script = Path(work) / (Path(run.script).stem + ".py")
            try:
                script.write_text(notebook_script(git(repo, "show", f"{run.commit}:{run.script}")))
            except ValueError as error:
                run.status, run.tail = "FAIL", str(error)
                return
            execute(run, [python, str(script)], work, env, timeout)
            return
        script = write_script(repo, run, work)
        for helper in helpers:
            if Path(helper).parent == Path(run.script).parent:
                write_script(repo, Run(helper, run.commit, 1), work)
        command = [python, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", str(script)]
        execute(run, command, work, env, timeout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hugectr", required=True, help="a HugeCTR git repository (clone or bare mirror)")
    parser.add_argument("--commit", default=COMMIT, help=f"commit of the tests (default {COMMIT[:9]})")
    parser.add_argument("--only", nargs="+", default=[], help="run the tests whose path contains any of these")
    parser.add_argument("--notebooks", action="store_true", help="also run the notebooks (hps_tf/notebooks)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per test file (default 900)")
    parser.add_argument("--json", help="write every run (with the end of the output of failures) here")
    parser.add_argument("--markdown", help="write the results table here")
    args = parser.parse_args(argv)
    found, helpers = tests(args.hugectr, args.commit)
    found += notebooks(args.hugectr, args.commit) if args.notebooks else []
    runs = [Run(path, args.commit, 1) for path in found if not args.only or any(part in path for part in args.only)]
    for i, run in enumerate(runs, 1):
        run_one(args.hugectr, run, helpers, args.timeout, sys.executable)
        report(i, len(runs), run)
    return conclude(runs, "test files", args.json, args.markdown, PREFIX)


if __name__ == "__main__":
    sys.exit(main())
