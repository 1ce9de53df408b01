"""sok.lookup_sparse and sok.all2all_dense_embedding on two Horovod ranks (Gloo, CPU).

One ``horovodrun -np 2`` launch (about 10 s of start-up) runs every check of
``distributed/lookup_checks.py`` through ``distributed/lookup_worker.py``; each test below reads the
result of one check on every rank. The checks and what they compare are described there (oracle:
``tf.nn.embedding_lookup_sparse`` on the full tables, each rank with its own batch; gradients
summed over ranks with ``hvd.allreduce``).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("horovod.tensorflow")

sys.path.insert(0, str(Path(__file__).parent / "distributed"))
import lookup_checks  # noqa: E402

pytestmark = pytest.mark.multiprocess

REPO = Path(__file__).resolve().parents[3]
WORKER = Path(__file__).parent / "distributed" / "lookup_worker.py"
NP = 2
TIMEOUT_S = 240
LINE = re.compile(r"CHECK (\S+) rank=(\d+) (PASS|FAIL)(.*)$")

#: Checks that fail at np 2 because of library bugs (see the final report of the test suite's
#: author and each reason): strict, so a fix turns them into failures to remove from here.
KNOWN_BUGS: dict[str, str] = {}  # check name -> reason, for checks that are expected to fail


@dataclass
class WorkerRun:
    returncode: int
    output: str
    results: dict[str, dict[int, tuple[str, str]]]

    def tail(self, chars: int = 6000) -> str:
        return self.output[-chars:]


def _horovodrun() -> Path:
    return Path(sys.executable).parent / "horovodrun"


@pytest.fixture(scope="module")
def worker_run() -> WorkerRun:
    horovodrun = _horovodrun()
    if not horovodrun.exists():
        pytest.skip(f"horovodrun not found next to {sys.executable} (install Horovod with TensorFlow: ci/setup.sh)")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    command = [str(horovodrun), "-np", str(NP), "-H", f"localhost:{NP}", "--gloo", sys.executable, str(WORKER)]
    proc = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # horovodrun and the ranks it started
        output, _ = proc.communicate()
        pytest.fail(f"{' '.join(command)} did not finish in {TIMEOUT_S} s; output tail:\n{output[-6000:]}")
    results: dict[str, dict[int, tuple[str, str]]] = {}
    for line in output.splitlines():
        found = LINE.search(line)
        if found:
            name, rank, status, detail = found.groups()
            results.setdefault(name, {})[int(rank)] = (status, detail.strip())
    return WorkerRun(proc.returncode, output, results)


def _params() -> list:
    params = []
    for name in lookup_checks.CHECKS:
        marks = [pytest.mark.xfail(reason=KNOWN_BUGS[name], strict=True)] if name in KNOWN_BUGS else []
        params.append(pytest.param(name, marks=marks, id=name))
    return params


@pytest.mark.parametrize("name", _params())
def test_check_passes_on_every_rank(worker_run: WorkerRun, name: str) -> None:
    ranks = worker_run.results.get(name, {})
    missing = [r for r in range(NP) if r not in ranks]
    assert not missing, (
        f"no result of {name} from rank(s) {missing} (worker exit status {worker_run.returncode}); "
        f"output tail:\n{worker_run.tail()}"
    )
    failed = {rank: detail for rank, (status, detail) in sorted(ranks.items()) if status != "PASS"}
    assert not failed, "\n".join(f"rank {rank}: {detail}" for rank, detail in failed.items())


def test_worker_reports_only_known_checks(worker_run: WorkerRun) -> None:
    """The worker ran the checks this file knows (no stale or renamed names)."""
    assert set(worker_run.results) <= set(lookup_checks.CHECKS)
