"""A storage on a GPU: :class:`CudaStorage` takes NumPy arrays, lists or device arrays and runs
the table's calls on its stream."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from sparse_operation_kit import initializers as inits
from sparse_operation_kit.device_arrays import (
    as_device,
    cupy_module,
    device_floats,
    device_integers,
    is_device_array,
    on_device,
    parse_device,
    to_host,
)
from sparse_operation_kit.dtypes import SCORE_DTYPE, VALUE_DTYPE
from sparse_operation_kit.plugins.registry import BackendSpec
from sparse_operation_kit.storage.facade import (
    Storage,
    _check_out,
)
from sparse_operation_kit.storage.table import Table


class CudaStorage(Storage):
    """A :class:`Storage` whose table lives on a GPU: ``create_storage(..., device="cuda:N")``.

    Every method takes host data (NumPy arrays, lists) or device arrays (CuPy arrays, Torch CUDA
    tensors, anything with ``__cuda_array_interface__`` or ``__dlpack__``), with the checks and
    messages of the CPU path, done on the device. Work is enqueued on CuPy's current stream of the
    table's GPU (``with cupy.cuda.Stream(): ...`` picks another). Results are NumPy arrays when the
    keys were host data, CuPy arrays on the table's GPU when they were device arrays (ready in the
    order of that stream); :meth:`export_batch` and :meth:`export` return NumPy arrays. Device
    arrays on another GPU are copied to the table's.

    Example::

        >>> import cupy
        >>> s = create_storage("hbm", row_width=4, initializer="13", device="cuda")
        >>> values, found = s.find_or_insert(cupy.arange(3))   # CuPy in, CuPy out
        >>> values, found = s.find_or_insert([0, 1, 2])        # lists/NumPy in, NumPy out

    Args:
        table: the backend's table object, made with ``device=device``.
        spec: the backend's registry entry.
        var_type: the var_type it was created for.
        initializers: how new rows are filled (zeros when empty).
        device: ``"cuda:N"``.
        distinct_lookups: as for :class:`Storage`.
        adjustments: as for :class:`Storage`.
    """

    def __init__(
        self,
        table: Table,
        spec: BackendSpec,
        var_type: str,
        initializers: Sequence[inits.Initializer] = (),
        device: str = "cuda:0",
        distinct_lookups: bool = False,
        adjustments: tuple[str, ...] = (),
    ) -> None:
        kind, self.device_id = parse_device(device)
        if kind != "cuda":
            raise ValueError(f"a CudaStorage lives on a GPU, not on {device!r}")
        self._cupy = cupy_module()
        super().__init__(table, spec, var_type, initializers, f"cuda:{self.device_id}", distinct_lookups, adjustments)

    # -- arguments to the device ----------------------------------------------------------------
    def _keys(self, keys: Any) -> Any:
        if not is_device_array(keys):
            return self._cupy.asarray(super()._keys(keys))
        array = device_integers(as_device(keys, "keys", self.device_id), "keys", self.key_dtype)
        if array.ndim != 1:
            raise ValueError(f"keys must be a 1-D array, got shape {array.shape}")
        return array

    def _values(self, values: Any, n: int, width: int) -> Any:
        if not is_device_array(values):
            return self._cupy.asarray(super()._values(values, n, width))
        array = device_floats(as_device(values, "values", self.device_id), "values")
        if array.shape != (n, width):
            raise ValueError(
                f"values must have shape ({n}, {width}) for {n} keys and {width} columns, got {array.shape}"
            )
        return array

    def _scores(self, scores: Any, n: int) -> Any:
        if scores is None:
            return None
        if not is_device_array(scores):
            return self._cupy.asarray(super()._scores(scores, n))
        array = device_integers(as_device(scores, "scores", self.device_id), "scores", np.dtype(SCORE_DTYPE))
        if array.shape != (n,):
            raise ValueError(f"scores must hold one integer per key ({n}), got shape {array.shape}")
        return array

    def _out(self, out: Any, n: int, width: int) -> tuple[Any, Callable[[], None]]:
        cp = self._cupy
        if isinstance(out, np.ndarray):
            _check_out(out, n, width)
            staged = cp.asarray(out)
            return staged, lambda: staged.get(out=out)
        if not isinstance(out, cp.ndarray) or out.device.id != self.device_id:
            raise TypeError(
                f"out must be a CuPy array on cuda:{self.device_id} or a NumPy array, got "
                f"{type(out).__name__}" + (f" on cuda:{out.device.id}" if isinstance(out, cp.ndarray) else "")
            )
        _check_out(out, n, width)
        return out, lambda: None

    def _default_row(self, default: Any, width: int) -> Any:
        cp = self._cupy
        if is_device_array(default):
            given = as_device(default, "default", self.device_id).astype(VALUE_DTYPE, copy=False)
        else:
            given = np.asarray(default, dtype=VALUE_DTYPE)
        if given.shape not in ((), (width,)):
            raise ValueError(f"default must be a number or a row of {width} values, got shape {given.shape}")
        return cp.ascontiguousarray(cp.broadcast_to(cp.asarray(given), (width,)))

    # -- where the arrays live ------------------------------------------------------------------
    def _scope(self) -> contextlib.AbstractContextManager:
        return on_device(self.device_id)

    def _empty(self, shape: Any, dtype: Any) -> Any:
        return self._cupy.empty(shape, dtype=dtype)

    def _call_options(self) -> dict[str, Any]:
        return {"stream": int(self._cupy.cuda.get_current_stream().ptr)}

    def _synchronize(self) -> None:
        """Wait for the current stream: calls that read host state (capacity, describe) see its work."""
        self._cupy.cuda.get_current_stream().synchronize()

    def _keys_on_host(self, keys: Any) -> bool:
        return not is_device_array(keys)

    def _returned(self, host: bool, *arrays: Any) -> tuple:
        return tuple(to_host(a) for a in arrays) if host else arrays
