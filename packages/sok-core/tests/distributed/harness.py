"""Launch a worker under ``horovodrun -np N --gloo`` and read its per-rank check results.

Workers print one line per check and rank, ``CHECK <name> rank=<r> PASS|FAIL <detail>``; a launch
that runs past its timeout is killed with every rank it started and fails the test (no test hangs).

Example::

    returncode, output = launch(WORKER, 2, "--fast", env={"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "30"})
    found = results(output)
    assert_passed(found, "lookup", 2, returncode, output)
"""

from __future__ import annotations

import faulthandler
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[4]
LINE = re.compile(r"CHECK (\S+) rank=(\d+) (PASS|FAIL)(.*)$")
#: Seconds before a launch's timeout at which each rank prints the stacks of its threads.
STACKS_BEFORE_TIMEOUT = 20
STACKS_AFTER = "SOK_TEST_STACKS_AFTER_S"


def horovodrun() -> Path:
    """The horovodrun next to this interpreter; skips the test when Horovod is not installed."""
    path = Path(sys.executable).parent / "horovodrun"
    if not path.exists():
        pytest.skip(f"horovodrun not found next to {sys.executable} (install Horovod with TensorFlow: ci/setup.sh)")
    return path


def launch(worker: Path, np_: int, *args: str, env: dict | None = None, timeout: int = 300) -> tuple[int, str]:
    """Run ``worker`` on ``np_`` Gloo ranks (CPU); ``(exit status, stdout and stderr)``."""
    stacks_after = str(max(1, timeout - STACKS_BEFORE_TIMEOUT))
    full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", **{STACKS_AFTER: stacks_after})
    full_env.update(env or {})
    command = [str(horovodrun()), "-np", str(np_), "-H", f"localhost:{np_}", "--gloo", sys.executable, str(worker)]
    command += list(args)
    proc = subprocess.Popen(
        command,
        cwd=REPO,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # horovodrun and the ranks it started
        output, _ = proc.communicate()
        pytest.fail(f"{' '.join(command)} did not finish in {timeout} s (a rank hangs); output tail:\n{output[-6000:]}")
    return proc.returncode, output


def print_stacks_before_timeout() -> None:
    """In a worker: print every thread's Python stack to stderr shortly before :func:`launch` kills
    the job, so that a hang's output tail says where each rank waits."""
    seconds = os.environ.get(STACKS_AFTER)
    if seconds:
        faulthandler.dump_traceback_later(int(seconds), exit=False)


def results(output: str) -> dict[str, dict[int, tuple[str, str]]]:
    """``{check: {rank: (PASS|FAIL, detail)}}`` from a launch's output."""
    found: dict[str, dict[int, tuple[str, str]]] = {}
    for line in output.splitlines():
        match = LINE.search(line)
        if match:
            name, rank, status, detail = match.groups()
            found.setdefault(name, {})[int(rank)] = (status, detail.strip())
    return found


def assert_passed(found: dict, name: str, np_: int, returncode: int, output: str) -> None:
    """Check ``name`` reported PASS on every one of the ``np_`` ranks."""
    ranks = found.get(name, {})
    missing = [r for r in range(np_) if r not in ranks]
    assert not missing, (
        f"no result of {name} from rank(s) {missing} (worker exit status {returncode}); output tail:\n{output[-6000:]}"
    )
    failed = {rank: detail for rank, (status, detail) in sorted(ranks.items()) if status != "PASS"}
    assert not failed, "\n".join(f"rank {rank}: {detail}" for rank, detail in failed.items())
