"""sok.lookup_sparse and sok.all2all_dense_embedding on two Horovod ranks (Gloo, CPU).

One ``horovodrun -np 2`` launch (its start-up is slow, so one for all) runs every check of
``distributed/lookup_checks.py`` through ``distributed/lookup_worker.py``; each test below reads the
result of one check on every rank. The checks and what they compare are described there (oracle:
``tf.nn.embedding_lookup_sparse`` on the full tables, each rank with its own batch; gradients
summed over ranks with ``hvd.allreduce``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("horovod.tensorflow")

sys.path.insert(0, str(Path(__file__).parent / "distributed"))
import lookup_checks  # noqa: E402
from harness import assert_passed, launch, results  # noqa: E402

pytestmark = pytest.mark.multiprocess

WORKER = Path(__file__).parent / "distributed" / "lookup_worker.py"
NP = 2
TIMEOUT_S = 240

#: Checks that fail at np 2 because of library bugs (see the final report of the test suite's
#: author and each reason): strict, so a fix turns them into failures to remove from here.
KNOWN_BUGS: dict[str, str] = {}  # check name -> reason, for checks that are expected to fail


@pytest.fixture(scope="module", params=["holders", "routed"], ids=["ids-to-holders", "ids-routed"])
def worker_run(request: pytest.FixtureRequest) -> tuple[int, str, dict]:
    """One launch per way the ids of a call of static tables travel (``SOK_ID_EXCHANGE``): to every
    holder sized by shapes (the default on CPU ranks), and routed to their owners (the default with
    SOK's NCCL collectives, and calls with dynamic tables always)."""
    returncode, output = launch(WORKER, NP, env={"SOK_ID_EXCHANGE": request.param}, timeout=TIMEOUT_S)
    return returncode, output, results(output)


def _params() -> list:
    params = []
    for name in lookup_checks.CHECKS:
        marks = [pytest.mark.xfail(reason=KNOWN_BUGS[name], strict=True)] if name in KNOWN_BUGS else []
        params.append(pytest.param(name, marks=marks, id=name))
    return params


@pytest.mark.parametrize("name", _params())
def test_check_passes_on_every_rank(worker_run: tuple[int, str, dict], name: str) -> None:
    returncode, output, found = worker_run
    assert_passed(found, name, NP, returncode, output)


def test_worker_reports_only_known_checks(worker_run: tuple[int, str, dict]) -> None:
    """The worker ran the checks this file knows (no stale or renamed names)."""
    assert set(worker_run[2]) <= set(lookup_checks.CHECKS)
