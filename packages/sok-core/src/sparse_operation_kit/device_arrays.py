"""Arrays on a CUDA device, as :class:`~sparse_operation_kit.storage.Storage` takes them.

A storage on a GPU (``create_storage(..., device="cuda:0")``) accepts host data (NumPy arrays,
lists) and device arrays from any library: CuPy arrays, Torch CUDA tensors, and any object with
``__cuda_array_interface__`` (v2/v3) or ``__dlpack__`` on a CUDA device. This module tells them
apart and brings them to one form, a C-contiguous CuPy array on the table's GPU, checking dtypes
and shapes on the device: nothing is copied to the host to check it (range checks of keys and
scores of another integer dtype read two numbers, the minimum and the maximum).

This module owns the conversions of device data for the Storage facade (through CuPy, which reads
the producer's interface); the pointers, streams and devices of the arrays a table receives are
read by sok-core's binding of the C ABI (``csrc/table/py_table.hpp``) alone.

CuPy is imported on first use (:func:`cupy_module`), so CPU-only installations never need it.

Example::

    >>> import cupy, numpy as np, torch
    >>> is_device_array(cupy.arange(3)), is_device_array(np.arange(3))
    (True, False)
    >>> as_device(torch.arange(3, device="cuda"), "keys", device_id=0)  # a CuPy view, over DLPack
    array([0, 1, 2])
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import numpy as np

__all__ = [
    "CUPY_INSTALL_HINT",
    "as_device",
    "cupy_module",
    "device_floats",
    "device_integers",
    "is_device_array",
    "parse_device",
    "to_host",
]

#: How to install CuPy, for messages.
CUPY_INSTALL_HINT = "install a CuPy build matching your CUDA, e.g. pip install cupy-cuda13x"

#: DLPack device types of memory a CUDA kernel can read: kDLCUDA, kDLCUDAManaged.
_DLPACK_CUDA_DEVICES = (2, 13)

_DEVICE = re.compile(r"(cpu|cuda)(?::(\d+))?")


def parse_device(device: Any) -> tuple[str, int]:
    """``("cpu", 0)`` or ``("cuda", N)`` for ``"cpu"``, ``"cuda"`` (GPU 0) or ``"cuda:N"``.

    Raises:
        ValueError: for anything else (named, with the valid forms).
    """
    match = _DEVICE.fullmatch(device) if isinstance(device, str) else None
    if match is None or (match[1] == "cpu" and match[2] is not None):
        raise ValueError(f"device {device!r} is not valid; valid: 'cpu', 'cuda' (GPU 0) or 'cuda:N' (N >= 0)")
    return match[1], int(match[2] or 0)


def cupy_module() -> Any:
    """The ``cupy`` module, imported on first use.

    Raises:
        ImportError: CuPy is not installed (the message says how to install it).
    """
    try:
        import cupy
    except ImportError as error:
        raise ImportError(f"a storage on a CUDA device needs CuPy: {CUPY_INSTALL_HINT} ({error})") from error
    return cupy


def _dlpack_device_type(obj: Any) -> int | None:
    method = getattr(type(obj), "__dlpack_device__", None)
    if method is None:
        return None
    try:
        return int(method(obj)[0])
    except Exception:  # a broken or refusing producer: not an array we can read as a device array
        return None


def is_device_array(obj: Any) -> bool:
    """Whether ``obj`` is an array in CUDA device memory (CuPy, Torch CUDA, ``__dlpack__`` on a
    CUDA device, or anything with ``__cuda_array_interface__``). NumPy arrays, lists, scalars and
    CPU tensors are not."""
    if obj is None or isinstance(obj, (np.ndarray, np.generic, list, tuple, int, float)):
        return False
    if _dlpack_device_type(obj) in _DLPACK_CUDA_DEVICES:
        return True
    try:
        return hasattr(obj, "__cuda_array_interface__")  # Torch raises AttributeError off the GPU
    except Exception:  # e.g. a Torch tensor that requires grad: on the device, but unreadable
        return True


def as_device(obj: Any, what: str, device_id: int) -> Any:
    """``obj`` (a device array) as a CuPy array on GPU ``device_id``, without copying when it
    already lives there; an array on another GPU is copied there (as ``cupy.asarray`` does).

    DLPack is preferred to ``__cuda_array_interface__`` when an object has both, since DLPack
    orders the producer's stream before the current CuPy stream (Torch's interface names no
    stream); a v3 interface's stream is waited for by CuPy.

    Raises:
        ValueError: ``obj`` cannot be read as a device array (the message names ``what``).
    """
    cupy = cupy_module()
    with on_device(device_id):
        try:
            if isinstance(obj, cupy.ndarray):
                return cupy.asarray(obj)
            if _dlpack_device_type(obj) in _DLPACK_CUDA_DEVICES:
                return cupy.asarray(cupy.from_dlpack(obj))
            return cupy.asarray(obj)
        except Exception as error:
            raise ValueError(f"{what} could not be read as a CUDA device array: {error}") from error


@contextlib.contextmanager
def on_device(device_id: int) -> Iterator[None]:
    """Make GPU ``device_id`` current for this thread (CuPy's ``with cupy.cuda.Device(i)``, but a
    thread that had no current CUDA context is not switched back to device 0 on leaving: that would
    open a context on another rank's GPU where each rank sees every GPU of the host).

    Example::

        with on_device(1):
            keys = cupy.arange(4)   # on GPU 1
    """
    cuda = cupy_module().cuda
    had_context = cuda.driver.ctxGetCurrent() != 0
    previous = cuda.runtime.getDevice() if had_context else None
    if previous != device_id:
        cuda.runtime.setDevice(device_id)
    try:
        yield
    finally:
        if previous is not None and previous != device_id:
            cuda.runtime.setDevice(previous)


def to_host(array: Any) -> np.ndarray:
    """A device array as a NumPy array (waits for the current stream's work on it)."""
    return array.get()


def device_integers(array: Any, what: str, dtype: np.dtype) -> Any:
    """The device array ``array`` as a C-contiguous CuPy array of the integer ``dtype``: the
    checks and messages of the host path (non-integers refused, values that do not fit named).

    Only a lossy cast (e.g. uint64 to int64) reads anything back: the minimum and the maximum.
    """
    cupy = cupy_module()
    if array.size == 0:  # an empty batch has no dtype to check
        return cupy.empty(array.shape, dtype=dtype)
    if array.dtype.kind not in "iu":
        raise TypeError(f"{what} must be integers ({dtype.name}), got dtype {array.dtype}")
    if array.dtype != dtype and not np.can_cast(array.dtype, dtype, "safe"):
        info = np.iinfo(dtype)
        low, high = int(array.min()), int(array.max())
        if low < info.min or high > info.max:
            bad = low if low < info.min else high
            raise ValueError(f"{what} value {bad} does not fit {dtype.name} (valid: {info.min} .. {info.max})")
    return cupy.ascontiguousarray(array, dtype=dtype)


def device_floats(array: Any, what: str) -> Any:
    """The device array ``array`` of real numbers as a C-contiguous float32 CuPy array."""
    if array.dtype.kind not in "fiu":
        raise TypeError(f"{what} must be real numbers, got dtype {array.dtype}")
    return cupy_module().ascontiguousarray(array, dtype=np.float32)
