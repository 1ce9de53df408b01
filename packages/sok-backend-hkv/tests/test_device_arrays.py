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
