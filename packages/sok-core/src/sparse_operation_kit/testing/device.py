"""Helpers of the GPU tests: when to skip them, and arrays that speak one interchange protocol only.

A backend's GPU test module skips itself as a whole, with the reason (one line in ``pytest -rs``),
where CUDA tables cannot be made::

    import pytest
    from sok_backend_mine import _core
    from sparse_operation_kit.testing.device import cuda_skip_reason

    pytestmark = pytest.mark.gpu
    if (reason := cuda_skip_reason(_core)) is not None:  # here, so -rs names this module
        pytest.skip(reason, allow_module_level=True)

Nothing here imports CuPy or Torch at import time, so CPU-only runs collect these modules and skip.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from sparse_operation_kit.device_arrays import CUPY_INSTALL_HINT

__all__ = [
    "DEVICE",
    "CudaArrayInterfaceOnly",
    "DLPackOnly",
    "cuda_skip_reason",
    "requires_cuda",
    "skip_unless_gpu_tensorflow",
]

#: The device of the GPU tests.
DEVICE = "cuda:0"


def cuda_skip_reason(core: ModuleType) -> str | None:
    """Why CUDA tables of the backend whose native module is ``core`` cannot be tested here, or
    None: CuPy missing, a backend or a binding (``sparse_operation_kit._table``) built without CUDA,
    no GPU."""
    try:
        import cupy  # noqa: F401
    except Exception as error:  # ImportError, or a CuPy that cannot load its CUDA libraries
        return f"needs CuPy ({CUPY_INSTALL_HINT}): {type(error).__name__}: {error}"
    name = core.__name__
    if not dict(getattr(core, "BUILD_INFO", {})).get("cuda", False):
        return f"{name} was built without CUDA (BUILD_INFO['cuda'] is False): rebuild it where nvcc is found"
    from sparse_operation_kit import _table

    if not _table.WITH_CUDA:
        return "sparse_operation_kit._table (sok-core's binding) was built without CUDA: rebuild sok-core where nvcc is"
        " found"
    if _table.cuda_device_count() == 0:
        return "no CUDA device (sparse_operation_kit._table.cuda_device_count() == 0)"
    return None


def requires_cuda(core: ModuleType) -> pytest.MarkDecorator:
    """A ``skipif`` mark (with :func:`cuda_skip_reason`) for single GPU tests in a CPU module."""
    reason = cuda_skip_reason(core)
    return pytest.mark.skipif(reason is not None, reason=reason or "")


class CudaArrayInterfaceOnly:
    """An array that exposes only ``__cuda_array_interface__``: that of a CuPy ``array``, read
    under CuPy's current stream (so v3's ``stream`` names it), or naming ``stream`` when given.

    The wrapper keeps ``array`` alive; it has no ``__dlpack__`` and no ``__array__``.
    """

    def __init__(self, array: Any, stream: int | None = None) -> None:
        self._array = array
        interface = dict(array.__cuda_array_interface__)
        if stream is not None:
            interface["stream"] = stream
        self.__cuda_array_interface__ = interface

    def __repr__(self) -> str:
        interface = self.__cuda_array_interface__
        return f"CudaArrayInterfaceOnly(shape={interface['shape']}, typestr={interface['typestr']!r})"


class DLPackOnly:
    """An array that exposes only ``__dlpack__`` and ``__dlpack_device__`` (those of ``array``)."""

    def __init__(self, array: Any) -> None:
        self._array = array

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self._array.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._array.__dlpack_device__()

    def __repr__(self) -> str:
        return f"DLPackOnly(shape={self._array.shape}, dtype={self._array.dtype})"


def skip_unless_gpu_tensorflow() -> None:
    """Skip the calling test unless sok-core has its GPU kernels and TensorFlow sees a GPU; then turn
    on memory growth (SOK's GPU tables allocate beside TensorFlow's allocator) where TensorFlow has
    not set up its GPUs yet. For the TensorFlow-level GPU tests (sok-core's test_*_gpu.py)."""
    import tensorflow as tf

    from sparse_operation_kit import tf_ops

    build = tf_ops.gpu_build()
    if build in (None, "none"):
        pytest.skip(f"sok-core was built without its GPU kernels (gpu_build: {build!r})")
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        pytest.skip("TensorFlow sees no GPU (a CPU build of TensorFlow, or no device)")
    for gpu in gpus:
        try:
            tf.config.experimental.set_memory_growth(gpu, True)
        except RuntimeError:  # TensorFlow has set its GPUs up already (TF_FORCE_GPU_ALLOW_GROWTH did it)
            pass
