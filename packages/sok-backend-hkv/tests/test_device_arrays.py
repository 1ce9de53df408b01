"""hkv's CUDA tables with device arrays: CuPy, Torch, ``__cuda_array_interface__``, DLPack, streams.

Runs where CuPy, a CUDA build of sok-backend-hkv and a GPU are found (``ci/gpu_test.sh``); skipped,
with the reason, elsewhere.
"""

from __future__ import annotations

import pytest
from sok_backend_hkv import _core
from sparse_operation_kit.testing.device import cuda_skip_reason
from sparse_operation_kit.testing.device_conformance import DeviceArrayConformance

pytestmark = pytest.mark.gpu
if (reason := cuda_skip_reason(_core)) is not None:
    pytest.skip(reason, allow_module_level=True)


class TestHkvDeviceArrays(DeviceArrayConformance):
    @pytest.fixture
    def var_type(self) -> str:
        return "hybrid"

    @pytest.fixture
    def wide_table_options(self) -> list[dict[str, str]]:
        """A pure device table, and a hybrid one of 128 buckets of 128 slots with about 0.5 MB of
        rows in device memory (8 slots a bucket at 128 floats), the rest in pinned host memory."""
        hybrid = {
            "init_capacity": "16384",
            "max_capacity": "16384",
            "max_bucket_size": "128",
            "max_hbm_for_vectors": "0.0005",
        }
        return [{}, hybrid]
