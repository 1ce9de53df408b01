"""Launch a worker under ``horovodrun -np N --gloo`` and read its per-rank check results.

Workers print one line per check and rank, ``CHECK <name> rank=<r> PASS|FAIL <detail>``; a launch
that runs past its timeout is killed with every rank it started and fails the test (no test hangs).

The ranks run on the CPU (``CUDA_VISIBLE_DEVICES`` empty) unless :data:`ON_GPUS` is set to 1 in the
environment (``ci/gpu_test.sh --multi-gpu``): then each rank sees the host's GPUs, ``sok.init``
pins it to its own, and Horovod moves GPU tensors through NCCL (``NCCL_NVLS_ENABLE=0`` in every
rank's environment: NVLink multicast can take shared hosts' GPUs out of service).

Example::

    returncode, output = launch(WORKER, 2, "--fast", env={"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "30"})
    found = results(output)
    assert_passed(found, "lookup", 2, returncode, output)
"""

from __future__ import annotations

import faulthandler
import os
import re
import shutil
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
#: The environment variable that runs the ranks on the host's GPUs (1) instead of the CPU.
ON_GPUS = "SOK_MULTIPROCESS_ON_GPUS"


def on_gpus() -> bool:
    """Whether the launches run their ranks on GPUs (:data:`ON_GPUS`)."""
    return os.environ.get(ON_GPUS) == "1"


def horovodrun() -> Path:
    """The horovodrun next to this interpreter, else on PATH (a ``pip install --target`` folder's
    ``bin``); skips the test when Horovod is not installed."""
    path = Path(sys.executable).parent / "horovodrun"
    found = path if path.exists() else shutil.which("horovodrun")
    if found is None:
        pytest.skip(
            f"horovodrun is neither next to {sys.executable} nor on PATH (install Horovod with TensorFlow: "
            "ci/setup.sh, or ci/build_horovod.sh)"
        )
    return Path(found)


def gpu_count() -> int:
    """The GPUs ``nvidia-smi -L`` lists on this host (0 without it)."""
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in listing.splitlines())


def rank_environment(stacks_after: int | None = None, ranks: int | None = None) -> dict[str, str]:
    """The environment of the ranks a test launches: this one, quiet, on the CPU or (:func:`on_gpus`)
    every GPU of the host (no ``CUDA_VISIBLE_DEVICES``: ``sok.init`` pins each rank) with NVLink
    multicast off. More ``ranks`` than the host has GPUs run on the CPU: NCCL refuses two ranks
    of one communicator on one GPU ("ncclCommInitRank failed: invalid usage")."""
    gpus = on_gpus() and (ranks is None or ranks <= gpu_count())
    devices = {"NCCL_NVLS_ENABLE": "0"} if gpus else {"CUDA_VISIBLE_DEVICES": ""}
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **devices)
    if gpus:
        env.pop("CUDA_VISIBLE_DEVICES", None)
    if stacks_after is not None:
        env[STACKS_AFTER] = str(stacks_after)
    return env


def launch(worker: Path, np_: int, *args: str, env: dict | None = None, timeout: int = 300) -> tuple[int, str]:
    """Run ``worker`` on ``np_`` ranks (Gloo controller; CPU ranks, or GPU ranks with NCCL data where
    :func:`on_gpus` and the host has ``np_`` GPUs); ``(exit status, stdout and stderr)``."""
    full_env = rank_environment(stacks_after=max(1, timeout - STACKS_BEFORE_TIMEOUT), ranks=np_)
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
