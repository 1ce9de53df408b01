"""SOK's own NCCL collectives of the lookup's exchange on GPU ranks (ci/gpu_test.sh --multi-gpu).

One ``horovodrun -np N --gloo`` launch of ``distributed/nccl_exchange_worker.py`` with N the host's
GPUs (at most 4): the exchange is NCCL's under ``SOK_EXCHANGE=auto``; uneven all-to-alls of floats
and int64 (eager, and two in one tf.function with their gradients), an empty one and an allgather
give what every rank sent; the allreduce (floats, int32) and the allgather of rows of uneven counts
(sok.allreduce_dense_gradients' collectives) give what every rank gave; counts of the wrong length
are refused before anything moves. The lookup's own oracle tests
(test_lookup_sparse_multiprocess.py) run through the same collectives on GPU ranks. Skipped unless
the ranks run on GPUs (``SOK_MULTIPROCESS_ON_GPUS=1``) and the host has two or more.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "distributed"))
from harness import assert_passed, gpu_count, launch, on_gpus, results  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.gpu]

WORKER = Path(__file__).parent / "distributed" / "nccl_exchange_worker.py"
CHECKS = [
    "exchange_is_nccl",
    "alltoall_uneven_eager",
    "alltoall_int64",
    "alltoall_in_function_with_gradient",
    "alltoall_empty",
    "allgather",
    "allreduce_sum",
    "allgather_rows",
    "bad_counts_refused",
]


@pytest.fixture(scope="module")
def worker_run() -> tuple[int, int, str, dict]:
    if not on_gpus():
        pytest.skip("the ranks run on the CPU here (set SOK_MULTIPROCESS_ON_GPUS=1 on a multi-GPU host)")
    ranks = min(gpu_count(), 4)
    if ranks < 2:
        pytest.skip(f"needs a host with 2 or more GPUs; nvidia-smi lists {ranks}")
    returncode, output = launch(WORKER, ranks, env={"SOK_EXCHANGE": "auto"}, timeout=240)
    return ranks, returncode, output, results(output)


@pytest.mark.parametrize("check", CHECKS)
def test_check_on_every_rank(worker_run, check):
    ranks, returncode, output, found = worker_run
    assert_passed(found, check, ranks, returncode, output)
