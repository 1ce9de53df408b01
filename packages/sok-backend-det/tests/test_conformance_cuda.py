"""det (var_type "hbm") against the storage conformance suite on a GPU (``device="cuda:0"``).

Runs where CuPy, a CUDA build of sok-backend-det and a GPU are found (``ci/gpu_test.sh``); skipped,
with the reason, elsewhere.
"""

from __future__ import annotations

import pytest
from sok_backend_det import _core
from sparse_operation_kit.testing import StorageConformance
from sparse_operation_kit.testing.device import DEVICE, cuda_skip_reason

pytestmark = pytest.mark.gpu
if (reason := cuda_skip_reason(_core)) is not None:
    pytest.skip(reason, allow_module_level=True)


class TestDetConformanceCuda(StorageConformance):
    @pytest.fixture
    def var_type(self) -> str:
        return "hbm"

    @pytest.fixture
    def device(self) -> str:
        return DEVICE


class TestDetConformanceCudaWideBuckets(TestDetConformanceCuda):
    """The suite again with max_load_factor 0.9: buckets of 128 slots, each split into four home
    windows of 32 (lookups read the key's window first, the whole bucket where the window spilled),
    through growth and rehashing."""

    @pytest.fixture
    def storage_options(self) -> dict[str, str]:
        return {"max_load_factor": "0.9"}
