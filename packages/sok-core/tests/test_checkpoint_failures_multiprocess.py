"""A failure on one of two ranks inside sok.dump / sok.load stops the call on both, and no rank hangs;
ranks passing different paths are refused on both.

One ``horovodrun -np 2 --gloo`` launch of ``distributed/ckpt_failure_worker.py`` runs every scenario
(its docstring says what each checks); each test below reads one scenario's result on both ranks.
The launch has a timeout: a hang fails the tests instead of blocking the suite.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("horovod.tensorflow")

sys.path.insert(0, str(Path(__file__).parent / "distributed"))
import ckpt_failure_worker as worker  # noqa: E402
from harness import assert_passed, launch, results  # noqa: E402

pytestmark = pytest.mark.multiprocess

WORKER = Path(__file__).parent / "distributed" / "ckpt_failure_worker.py"
NP = 2
TIMEOUT_S = 180
#: A collective one rank never joins ends the job with Horovod's stall report (the tensors waiting
#: and the ranks missing) well before the timeout, instead of a silent wait.
STALL = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "20", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "90"}


@pytest.fixture(scope="module")
def worker_run(tmp_path_factory) -> tuple[int, str, dict]:
    returncode, output = launch(WORKER, NP, str(tmp_path_factory.mktemp("failures")), env=STALL, timeout=TIMEOUT_S)
    return returncode, output, results(output)


@pytest.mark.parametrize("scenario", list(worker.SCENARIOS))
def test_scenario_on_both_ranks(worker_run, scenario):
    returncode, output, found = worker_run
    assert_passed(found, scenario, NP, returncode, output)
