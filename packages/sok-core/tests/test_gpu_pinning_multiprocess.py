"""sok.init() pins each rank of a multi-GPU host to its own GPU (ci/gpu_test.sh --multi-gpu).

One ``horovodrun -np N --gloo`` launch of ``distributed/gpu_pinning_worker.py`` with N the host's
GPUs (at most 4), every rank seeing every GPU: each rank's table and lookup run on its GPU, a
Horovod allreduce of a GPU tensor (NCCL) sums over the ranks, and no rank holds a CUDA context on
another rank's GPU. Skipped unless the ranks run on GPUs (``SOK_MULTIPROCESS_ON_GPUS=1``) and the
host has two or more.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "distributed"))
from harness import assert_passed, gpu_count, launch, on_gpus, results  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.gpu]

WORKER = Path(__file__).parent / "distributed" / "gpu_pinning_worker.py"
CHECKS = ["table_on_own_gpu", "nccl_allreduce", "contexts_on_own_gpu_only"]


@pytest.fixture(scope="module")
def worker_run(tmp_path_factory) -> tuple[int, int, str, dict]:
    if not on_gpus():
        pytest.skip("the ranks run on the CPU here (set SOK_MULTIPROCESS_ON_GPUS=1 on a multi-GPU host)")
    ranks = min(gpu_count(), 4)
    if ranks < 2:
        pytest.skip(f"needs a host with 2 or more GPUs; nvidia-smi lists {ranks}")
    returncode, output = launch(WORKER, ranks, timeout=240)
    return ranks, returncode, output, results(output)


@pytest.mark.parametrize("check", CHECKS)
def test_check_on_every_rank(worker_run, check):
    ranks, returncode, output, found = worker_run
    assert_passed(found, check, ranks, returncode, output)
