"""Storages: one embedding-table shard in one process, over any backend.

:func:`create_storage` picks the backend by ``var_type`` through the registry and returns a
:class:`Storage`, which turns what the user gives (lists, arrays of other dtypes, slices, numbers)
into what every table takes and then calls the backend's *table*. A table follows the protocol
:class:`Table` (arrays in, caller-allocated arrays out); native backends' tables are sok-core's
binding of the C ABI (``sparse_operation_kit._table``), and a pure-Python backend implements the
protocol directly.

Intake, one owner per check:

- this facade: conversions (lists and other integer dtypes to the key dtype, with the values that
  do not fit named; values to float32; ``columns`` as a slice or pair; initializers; the outputs it
  allocates) and the checks of what it converts (shapes of the user's arrays, the column range
  against the row, offsets), which are all a pure-Python table gets; where a backend can put
  tables (``Capabilities.devices``, declared by the backend);
- the binding (``csrc/table/py_table.hpp``): Python objects to (pointer, count): dtype, C order,
  writability, device and stream of each array (NumPy, ``__cuda_array_interface__``, ``__dlpack__``:
  read there and nowhere else) and the matching lengths of the arrays of one call;
- the ABI adapter (``sok/kit/abi_adapter.hpp``) of a first-party backend: the semantic checks of
  every C ABI call, whoever the caller (counts, column ranges, initializers, scores against the
  eviction policy, the execution context's device).

A row holds ``row_width`` floats: ``[embedding | optimizer state]``. Reads and writes name a
column range (``columns=(begin, end)``, default the whole row) so a lookup never touches optimizer
state. Every value of the key dtype is a valid key.

A storage lives on the CPU (the default) or on a GPU: ``create_storage(..., device="cuda:0")``
returns a :class:`CudaStorage`, whose methods take NumPy arrays, lists or device arrays (CuPy,
Torch CUDA tensors, anything with ``__cuda_array_interface__`` or ``__dlpack__``) and need CuPy.

Example::

    >>> import numpy as np
    >>> from sparse_operation_kit.storage import create_storage
    >>> s = create_storage("hbm", row_width=4, initializer="13")
    >>> values, found = s.find_or_insert(np.array([0, 1, 2**40]))
    >>> values[:, 0], found, s.size()
    (array([13., 13., 13.], dtype=float32), array([False, False, False]), 3)
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from sparse_operation_kit import _table
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
from sparse_operation_kit.dtypes import SCORE_DTYPE, VALUE_DTYPE, normalize_key_dtype
from sparse_operation_kit.plugins.registry import BackendSpec, get_registry
from sparse_operation_kit.progress import Callback, NoOpCallback
from sparse_operation_kit.validate import positive_int

logger = logging.getLogger(__name__)

__all__ = ["MAX_ROW_WIDTH", "CudaStorage", "NativeTable", "Storage", "Table", "create_storage"]

#: The widest row a storage takes, in floats: ``sok_storage_config.row_width`` and the column
#: bounds of every call are ``int32_t`` in the C ABI (``sok/storage_api.h``).
MAX_ROW_WIDTH = 2**31 - 1

InitTuple = tuple[int, int, int, float, float, int]


class Table(Protocol):
    """What a backend's factory returns. Arguments arrive validated by :class:`Storage`: keys are
    1-D C-contiguous arrays of the table's key dtype, values C-contiguous float32 ``(n, w)`` with
    ``w = col_end - col_begin``, scores uint64 ``(n,)`` or None, outputs preallocated.

    The factory of a backend whose ``Capabilities.devices`` lists ``"cuda"`` takes a fourth
    argument, ``device="cuda:N"`` (passed only for GPU storages, so a three-argument factory serves
    CPU storages); such a table reports ``device``, takes CuPy arrays (inputs and outputs, on its
    GPU) and a keyword-only ``stream`` (a ``cudaStream_t`` as int) in every method."""

    row_width: int
    key_dtype: str

    def size(self) -> int: ...
    def capacity(self) -> int: ...
    def find(self, keys, col_begin: int, col_end: int, values_out, default_row, found_out) -> None: ...
    # Optional: find_hits(keys, col_begin, col_end, values_out, found_out) writes only the rows of
    # present keys (Storage.find_hits falls back to find where a table lacks it).
    def find_or_insert(
        self, keys, col_begin: int, col_end: int, values_out, found_out, scores, inits: Sequence[InitTuple]
    ) -> None: ...
    def insert_or_assign(
        self, keys, col_begin: int, col_end: int, values, scores, inits: Sequence[InitTuple]
    ) -> None: ...
    # Optional: insert_or_assign_hinted(keys, col_begin, col_end, values, scores, inits, hints)
    # with the C ABI's sok_hint bits (Storage.insert_or_assign(unique_keys=True) falls back to
    # insert_or_assign where a table lacks it: a hint only allows shortcuts).
    def accum_or_assign(
        self, keys, col_begin: int, col_end: int, values, scores, inits: Sequence[InitTuple]
    ) -> None: ...
    def erase(self, keys) -> int: ...
    def export_batch(
        self,
        offset: int,
        limit: int,
        col_begin: int,
        col_end: int,
        keys_out,
        values_out,
        scores_out,
        threshold: int | None,
    ) -> int: ...
    def insert_and_evict(
        self,
        keys,
        col_begin: int,
        col_end: int,
        values,
        scores,
        inits: Sequence[InitTuple],
        evicted_keys,
        evicted_values,
        evicted_scores,
    ) -> int: ...
    def import_batch(self, keys, col_begin: int, col_end: int, values, scores, inits: Sequence[InitTuple]) -> None: ...
    def clear(self) -> None: ...
    def set_global_epoch(self, epoch: int) -> None: ...
    def describe(self) -> str: ...


class NativeTable(Table, Protocol):
    """The table of a native backend: sok-core's one binding of the C ABI
    (``sparse_operation_kit._table.Table``, the same class for every backend), a :class:`Table`
    driven through the backend's ``sok_storage_api``. The registry's factory of a native backend
    makes it as ``factory(key_dtype, row_width, options, device="cpu")``; ``device`` is ``"cpu"`` or
    ``"cuda:N"`` (CUDA builds), and every method takes a keyword-only ``stream: int = 0``."""

    def handle_capsule(self) -> Any:
        """The ``sok_storage*`` of this table as a PyCapsule (valid while the table lives)."""
        ...

    def update_rows(self, keys, col_begin: int, col_end: int, old_values, new_values, found, scores) -> int:
        """The C ABI's ``update_rows`` with a visitor that swaps rows: when every key is present,
        columns ``[col_begin, col_end)`` of each go to ``old_values`` ``(n, w)`` and the key's row of
        ``new_values`` ``(n, w)`` takes their place, scored as by ``insert_or_assign``; else nothing
        changes. ``found`` ``(n,)`` marks the present keys; returns the number of missing ones.
        NotImplementedError where the backend lacks ``update_rows``."""
        ...

    def insert_or_assign_hinted(
        self, keys, col_begin: int, col_end: int, values, scores, inits: Sequence[InitTuple], hints: int
    ) -> None:
        """The C ABI's ``insert_or_assign_hinted``: ``insert_or_assign`` with the caller's promises
        as ``sok_hint`` bits (``_table.HINT_UNIQUE_KEYS``: no key repeats). ValueError for bits the
        ABI does not define; ``insert_or_assign`` where the backend lacks the function."""
        ...


def _options_as_strings(options: dict[str, Any]) -> dict[str, str]:
    out = {}
    for name, value in options.items():
        if isinstance(value, bool):
            out[name] = "true" if value else "false"
        elif isinstance(value, (int, float, str, np.integer, np.floating)):
            out[name] = str(value)
        else:
            raise TypeError(f"backend option {name}={value!r} must be a number, string or bool")
    return out


def _check_out(out: Any, n: int, width: int) -> None:
    """Raise unless ``out`` (NumPy or CuPy) can take ``n`` rows of ``width`` float32 in place."""
    if out.dtype != VALUE_DTYPE:
        raise TypeError(f"out must be a float32 array (it is written in place), got dtype {out.dtype}")
    if out.shape != (n, width):
        raise ValueError(f"out must have shape ({n}, {width}) for {n} keys and {width} columns, got {out.shape}")
    if not out.flags.c_contiguous:
        raise ValueError("out must be C-contiguous (it is written in place)")
    if isinstance(out, np.ndarray) and not out.flags.writeable:
        raise ValueError("out is read-only; pass a writable array")


def _refuse_device_array(values: Any, what: str) -> None:
    """Raise a ValueError that says what to do if ``values`` is a device array (a CPU storage got it)."""
    if is_device_array(values):
        raise ValueError(
            f"{what} is a CUDA device array ({type(values).__name__}) but the storage is on the CPU; pass "
            f"host data (NumPy), or create the storage on the GPU: create_storage(..., device='cuda')"
        )


def _integers(values: Any, what: str, dtype: np.dtype) -> np.ndarray:
    """``values`` as a C-contiguous array of ``dtype``, refusing non-integers and values that do not
    fit (named in the message). Python lists are read as exact ints (NumPy would make a list with
    values beyond int64 float64 or object)."""
    try:
        array = np.asarray(values)
    except Exception:
        _refuse_device_array(values, what)
        raise
    if array.size == 0:  # [] is float64 to NumPy; an empty batch has no dtype to check
        return np.empty(array.shape, dtype=dtype)
    if not isinstance(values, np.ndarray) and array.dtype.kind in "fO":
        items = np.asarray(values, dtype=object).ravel().tolist()
        if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in items):
            array = np.array([int(v) for v in items], dtype=object).reshape(array.shape)
    if array.dtype.kind not in "iuO" or (
        array.dtype == object and not all(isinstance(v, (int, np.integer)) for v in array.ravel().tolist())
    ):
        _refuse_device_array(values, what)
        raise TypeError(f"{what} must be integers ({dtype.name}), got dtype {array.dtype}")
    if array.dtype != dtype:
        info = np.iinfo(dtype)
        low, high = array.min(), array.max()
        if int(low) < info.min or int(high) > info.max:
            bad = low if int(low) < info.min else high
            raise ValueError(f"{what} value {int(bad)} does not fit {dtype.name} (valid: {info.min} .. {info.max})")
    return np.ascontiguousarray(array, dtype=dtype)


class Storage:
    """A storage table with argument checking, over a backend table.

    Args:
        table: the backend's table object.
        spec: the backend's registry entry.
        var_type: the var_type it was created for.
        initializers: how new rows are filled (zeros when empty).
        device: where the table lives: ``"cpu"`` here, ``"cuda:N"`` for a :class:`CudaStorage`.
        distinct_lookups: lookups may pass each distinct key once (the backend's
            ``Capabilities.lookups_distinct`` for this table's options).
        adjustments: what the backend changed in the options it was given
            (``Capabilities.adjusted_options``' notes; shown in a DynamicVariable's ``repr``).
    """

    def __init__(
        self,
        table: Table,
        spec: BackendSpec,
        var_type: str,
        initializers: Sequence[inits.Initializer] = (),
        device: str = "cpu",
        distinct_lookups: bool = False,
        adjustments: tuple[str, ...] = (),
    ) -> None:
        self.table = table
        self.spec = spec
        self.var_type = var_type
        self.device = device
        self.distinct_lookups = distinct_lookups
        self.adjustments = tuple(adjustments)
        self.row_width = int(table.row_width)
        self.key_dtype = np.dtype(table.key_dtype)
        self.initializers = tuple(initializers)
        self._init_tuples = [i.resolve(self.row_width) for i in self.initializers]

    # -- argument checks ------------------------------------------------------------------------
    def _keys(self, keys: Any) -> np.ndarray:
        array = _integers(keys, "keys", self.key_dtype)
        if array.ndim != 1:
            raise ValueError(f"keys must be a 1-D array, got shape {array.shape}")
        return array

    def _columns(self, columns: Any) -> tuple[int, int]:
        if columns is None:
            return 0, self.row_width
        if isinstance(columns, slice):
            if columns.step not in (None, 1):
                raise ValueError(f"columns must be a contiguous range, got step {columns.step}")
            begin, end, _ = columns.indices(self.row_width)
        else:
            try:
                begin, end = (int(c) for c in columns)
            except (TypeError, ValueError):
                raise TypeError(f"columns must be None, a slice or (begin, end), got {columns!r}") from None
        if not 0 <= begin < end <= self.row_width:
            raise ValueError(f"columns {columns!r} is not a non-empty range within the row width {self.row_width}")
        return begin, end

    def _values(self, values: Any, n: int, width: int) -> np.ndarray:
        try:
            array = np.asarray(values)
        except Exception:
            _refuse_device_array(values, "values")
            raise
        if array.dtype.kind not in "fiu":
            _refuse_device_array(values, "values")
            raise TypeError(f"values must be real numbers, got dtype {array.dtype}")
        if array.shape != (n, width):
            raise ValueError(
                f"values must have shape ({n}, {width}) for {n} keys and {width} columns, got {array.shape}"
            )
        return np.ascontiguousarray(array, dtype=VALUE_DTYPE)

    def _scores(self, scores: Any, n: int) -> np.ndarray | None:
        if scores is None:
            return None
        array = _integers(scores, "scores", np.dtype(SCORE_DTYPE))
        if array.shape != (n,):
            raise ValueError(f"scores must hold one integer per key ({n}), got shape {array.shape}")
        return array

    def _inits(self, initializers: Sequence[inits.Initializer] | None) -> list[InitTuple]:
        if initializers is None:
            return self._init_tuples
        return [i.resolve(self.row_width) for i in initializers]

    def _out(self, out: Any, n: int, width: int) -> tuple[Any, Callable[[], None]]:
        """The array the table writes ``out``'s rows into, and what copies them to ``out`` afterwards."""
        if not isinstance(out, np.ndarray):
            _refuse_device_array(out, "out")
            raise TypeError(f"out must be a NumPy float32 array, got {type(out).__name__}")
        _check_out(out, n, width)
        return out, lambda: None

    def _default_row(self, default: Any, width: int) -> np.ndarray:
        given = np.asarray(default, dtype=VALUE_DTYPE)
        if given.shape not in ((), (width,)):
            raise ValueError(f"default must be a number or a row of {width} values, got shape {given.shape}")
        return np.ascontiguousarray(np.broadcast_to(given, (width,)))

    # -- where the arrays live: host memory here; CudaStorage overrides these -------------------
    def _scope(self) -> contextlib.AbstractContextManager:
        """Entered around every operation (a CudaStorage makes its GPU the current device)."""
        return contextlib.nullcontext()

    def _empty(self, shape: Any, dtype: Any) -> np.ndarray:
        """An output array for the table to fill."""
        return np.empty(shape, dtype=dtype)

    def _call_options(self) -> dict[str, Any]:
        """Keyword arguments of every table call (a CudaStorage passes its stream)."""
        return {}

    def _synchronize(self) -> None:
        """Wait for enqueued work before reading the table's host state (nothing to wait for here)."""
        # A statement, not only the docstring: AutoGraph cannot convert a body it strips to nothing
        # and warns when a tf.function traces a caller (capacity, describe).
        return

    def _keys_on_host(self, keys: Any) -> bool:
        """Whether results go back as host arrays (always, here)."""
        return True

    def _returned(self, host: bool, *arrays: Any) -> tuple:
        return arrays

    # -- operations -----------------------------------------------------------------------------
    def size(self) -> int:
        """Number of keys stored."""
        with self._scope():
            return int(self.table.size(**self._call_options()))

    def __len__(self) -> int:
        return self.size()

    def capacity(self) -> int:
        """Number of slots (also the range of :meth:`export_batch` positions)."""
        with self._scope():
            self._synchronize()
            return int(self.table.capacity())

    def find(self, keys: Any, columns: Any = None, default: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """Rows of ``keys`` (``default`` row or zeros for missing keys) and a found mask.

        Does not insert and does not change scores.
        """
        with self._scope():
            host = self._keys_on_host(keys)
            k = self._keys(keys)
            begin, end = self._columns(columns)
            width = end - begin
            default_row = None if default is None else self._default_row(default, width)
            values = self._empty((k.size, width), VALUE_DTYPE)
            found = self._empty(k.size, np.bool_)
            self.table.find(k, begin, end, values, default_row, found, **self._call_options())
            return self._returned(host, values, found)

    def find_hits(self, keys: Any, out: Any, columns: Any = None) -> np.ndarray:
        """Copies the rows of present keys into ``out`` and leaves the rows of missing keys as they
        are (HierarchicalKV's ``find``): a caller that filled ``out`` beforehand keeps its own
        values for misses, and a batch with many misses moves fewer bytes than :meth:`find`.

        Does not insert and does not change scores.

        Args:
            keys: ``(n,)`` keys.
            out: ``(n, w)`` C-contiguous float32 array written in place (``w`` = the column range's
                width): NumPy for a host storage; CuPy on the storage's GPU, or NumPy (copied there
                and back), for a GPU storage.
            columns: the column range, as for :meth:`find`.

        Returns:
            The found mask ``(n,)`` (a host array when ``keys`` is one).

        Example:
            >>> out = np.full((2, 4), -1.0, np.float32)
            >>> found = storage.find_hits([7, 8], out)   # rows of 7 and 8 where found, -1 elsewhere
        """
        with self._scope():
            host = self._keys_on_host(keys)
            k = self._keys(keys)
            begin, end = self._columns(columns)
            target, write_back = self._out(out, k.size, end - begin)
            found = self._empty(k.size, np.bool_)
            find_hits = getattr(self.table, "find_hits", None)
            try:
                if find_hits is None:
                    raise NotImplementedError(f"{self.var_type} tables have no find_hits")
                find_hits(k, begin, end, target, found, **self._call_options())
            except NotImplementedError:  # a backend without find_hits: find, then keep the hits
                values = self._empty(target.shape, VALUE_DTYPE)
                self.table.find(k, begin, end, values, None, found, **self._call_options())
                target[found] = values[found]
            write_back()
            return self._returned(host, found)[0]

    def find_or_insert(
        self,
        keys: Any,
        columns: Any = None,
        scores: Any = None,
        initializers: Sequence[inits.Initializer] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Rows of ``keys``, inserting missing keys with initialised rows first.

        Returns ``(values, found)``; ``found`` is True for keys that existed before the call.
        ``initializers`` overrides the storage's for this call.
        """
        with self._scope():
            host = self._keys_on_host(keys)
            k = self._keys(keys)
            begin, end = self._columns(columns)
            s = self._scores(scores, k.size)
            values = self._empty((k.size, end - begin), VALUE_DTYPE)
            found = self._empty(k.size, np.bool_)
            self.table.find_or_insert(
                k, begin, end, values, found, s, self._inits(initializers), **self._call_options()
            )
            return self._returned(host, values, found)

    def _write(self, write: Callable[..., None], keys: Any, values: Any, columns: Any, scores: Any) -> None:
        """insert_or_assign / accum_or_assign through the table method ``write``."""
        with self._scope():
            k = self._keys(keys)
            begin, end = self._columns(columns)
            v = self._values(values, k.size, end - begin)
            write(k, begin, end, v, self._scores(scores, k.size), self._init_tuples, **self._call_options())

    def insert_or_assign(
        self, keys: Any, values: Any, columns: Any = None, scores: Any = None, *, unique_keys: bool = False
    ) -> None:
        """Write ``values`` to the columns of ``keys``, inserting new keys (other columns
        initialised). For duplicate keys the last one wins.

        Args:
            keys: ``(n,)`` keys.
            values: ``(n, w)`` rows for the column range.
            columns: the column range, as for :meth:`find`.
            scores: ``(n,)`` caller scores, for policies that take them.
            unique_keys: the caller's promise that no key repeats in ``keys`` (HierarchicalKV's
                ``unique_key``), as after ``np.unique``: a backend may then skip deduplicating
                the keys already present (the GPU tables do). If the promise is broken, which
                occurrence's row a repeated key keeps is unspecified; the table stays whole (no
                key stored twice, the size right). Tables without the hint ignore it.

        Example:
            >>> storage.insert_or_assign(np.array([3, 9]), np.ones((2, 4), np.float32), unique_keys=True)
        """
        if not isinstance(unique_keys, (bool, np.bool_)):
            raise TypeError(f"unique_keys must be True or False, got {unique_keys!r}")
        hinted = getattr(self.table, "insert_or_assign_hinted", None) if unique_keys else None
        if hinted is None:
            self._write(self.table.insert_or_assign, keys, values, columns, scores)
        else:
            self._write(functools.partial(hinted, hints=_table.HINT_UNIQUE_KEYS), keys, values, columns, scores)

    def accum_or_assign(self, keys: Any, values: Any, columns: Any = None, scores: Any = None) -> None:
        """Add ``values`` to existing keys' columns; insert new keys with ``values``.
        Duplicate keys accumulate."""
        self._write(self.table.accum_or_assign, keys, values, columns, scores)

    def erase(self, keys: Any) -> int:
        """Remove ``keys``; returns how many were present."""
        with self._scope():
            return int(self.table.erase(self._keys(keys), **self._call_options()))

    def insert_and_evict(
        self, keys: Any, values: Any, columns: Any = None, scores: Any = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`insert_or_assign` that returns what it displaced: ``(keys, rows, scores)`` of
        evicted rows (whole rows, optimizer state included) and of inputs the policy refused."""
        with self._scope():
            host = self._keys_on_host(keys)
            k = self._keys(keys)
            begin, end = self._columns(columns)
            v = self._values(values, k.size, end - begin)
            s = self._scores(scores, k.size)
            ev_keys = self._empty(k.size, self.key_dtype)
            ev_values = self._empty((k.size, self.row_width), VALUE_DTYPE)
            ev_scores = self._empty(k.size, SCORE_DTYPE)
            count = int(
                self.table.insert_and_evict(
                    k, begin, end, v, s, self._init_tuples, ev_keys, ev_values, ev_scores, **self._call_options()
                )
            )
            return self._returned(host, ev_keys[:count], ev_values[:count], ev_scores[:count])

    def export_batch(
        self,
        offset: int,
        limit: int,
        columns: Any = None,
        threshold: int | None = None,
        out: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Live rows at positions ``[offset, offset + limit)`` of the backend's export order (slots,
        or row storage; :meth:`capacity` positions in all): ``(keys, values, scores)`` (NumPy
        arrays); with ``threshold``, only rows whose score is at least ``threshold``.

        ``out``: NumPy arrays ``(keys [limit], values [limit, columns])`` to fill instead of new
        ones (a CPU storage; reused chunk after chunk, they save a page fault per 4 KiB); the
        results are views of them, and scores are not exported (None).
        """
        offset, limit = int(offset), int(limit)
        if offset < 0 or limit < 0:
            raise ValueError(f"offset and limit must be >= 0, got offset={offset}, limit={limit}")
        if threshold is not None and not 0 <= int(threshold) < 2**64:
            raise ValueError(f"threshold must be in [0, 2**64), got {threshold!r}")
        if out is not None and self.device != "cpu":
            raise ValueError(f"out= takes host arrays, for CPU storages; this one lives on {self.device}")
        with self._scope():
            begin, end = self._columns(columns)
            limit = min(limit, max(0, self.capacity() - offset))
            if out is None:
                keys = self._empty(limit, self.key_dtype)
                values = self._empty((limit, end - begin), VALUE_DTYPE)
                scores = self._empty(limit, SCORE_DTYPE)
            else:
                keys, values = out[0][:limit], out[1][:limit]
                scores = None
            count = int(
                self.table.export_batch(
                    offset,
                    limit,
                    begin,
                    end,
                    keys,
                    values,
                    scores,
                    None if threshold is None else int(threshold),
                    **self._call_options(),
                )
            )
            return self._returned(True, keys[:count], values[:count], None if scores is None else scores[:count])

    def export(
        self, columns: Any = None, threshold: int | None = None, callback: Callback | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every live row (with ``threshold``: every row scored at least that), in export order.

        ``callback`` (see :mod:`sparse_operation_kit.progress`) is told the slots scanned.
        """
        callback = callback or NoOpCallback()
        capacity = self.capacity()
        callback.set_size(capacity)
        begin, end = self._columns(columns)
        chunk = _table.export_chunk_slots(np.dtype(self.key_dtype).itemsize + 4 * (end - begin) + 8)
        parts = []
        for offset in range(0, capacity, chunk):
            parts.append(self.export_batch(offset, chunk, columns, threshold))
            callback.relative_update(min(chunk, capacity - offset))
        if not parts:
            return (np.empty(0, self.key_dtype), np.empty((0, end - begin), VALUE_DTYPE), np.empty(0, SCORE_DTYPE))
        return tuple(np.concatenate(p) for p in zip(*parts, strict=True))  # type: ignore[return-value]

    def export_if(
        self, threshold: int, columns: Any = None, callback: Callback | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every row whose score is at least ``threshold`` (e.g. updated since a time in ns)."""
        return self.export(columns, threshold, callback)

    def import_batch(self, keys: Any, values: Any, scores: Any, columns: Any = None) -> None:
        """:meth:`insert_or_assign` that stores ``scores`` as the rows' scores, whatever the policy:
        the inverse of :meth:`export_batch` (restoring a table, copying one into another)."""
        with self._scope():
            k = self._keys(keys)
            begin, end = self._columns(columns)
            v = self._values(values, k.size, end - begin)
            s = self._scores(scores, k.size)
            if s is None:
                raise ValueError("import_batch needs scores (one per key)")
            self.table.import_batch(k, begin, end, v, s, self._init_tuples, **self._call_options())

    def clear(self) -> None:
        """Remove every key (capacity stays)."""
        with self._scope():
            self.table.clear(**self._call_options())

    def set_global_epoch(self, epoch: int) -> None:
        """The epoch of the epoch_lru / epoch_lfu policies (host state, read by the calls after this one)."""
        self.table.set_global_epoch(int(epoch))

    def describe(self) -> str:
        """The backend's one-line summary of the table's state."""
        with self._scope():
            self._synchronize()
            return str(self.table.describe())

    def __repr__(self) -> str:
        where = "" if self.device == "cpu" else f", device={self.device!r}"
        return f"{type(self).__name__}(var_type={self.var_type!r}{where}, {self.describe()})"


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


def _initializers(initializer: Any, row_width: int, seed: int) -> list[inits.Initializer]:
    if initializer is None:
        return []
    if isinstance(initializer, str):
        return [inits.from_string(initializer, seed=seed)]
    if isinstance(initializer, (int, float)) and not isinstance(initializer, bool):
        return [inits.constant(float(initializer))]
    if isinstance(initializer, inits.Initializer):
        return [initializer]
    if isinstance(initializer, (list, tuple)) and all(isinstance(i, inits.Initializer) for i in initializer):
        return list(initializer)
    raise TypeError(
        f"initializer {initializer!r} is not valid; valid: a string ('random', 'normal', 'zeros', "
        f"'ones', '0.5'), a number, or sparse_operation_kit.initializers.Initializer objects"
    )


def create_storage(
    var_type: str = "hbm",
    row_width: int = 1,
    key_dtype: Any = "int64",
    initializer: Any = None,
    seed: int = 0,
    factory: Callable[..., Any] | None = None,
    device: str = "cpu",
    name: str | None = None,
    **options: Any,
) -> Storage:
    """A new storage of the backend serving ``var_type``.

    Args:
        var_type: ``"hbm"`` (det), ``"hybrid"`` (hkv) or a plugin's name.
        row_width: floats per row (embedding width plus optimizer state), 1 .. :data:`MAX_ROW_WIDTH`.
        key_dtype: ``"int64"``, ``"uint64"`` or ``"int32"`` (or a NumPy/TF dtype).
        initializer: how new rows are filled: a string (``"random"`` = U[-0.05, 0.05),
            ``"normal"``, ``"zeros"``, ``"ones"``, ``"13"``), a number, or Initializer objects.
        seed: seed of random initializers given as strings.
        factory: use this table factory instead of the registry's (tests, tools).
        device: where the table lives: ``"cpu"``, ``"cuda"`` (GPU 0) or ``"cuda:N"``. A GPU table
            needs a backend built with CUDA and CuPy; its storage is a :class:`CudaStorage`.
        name: what the log line names the table by (a DynamicVariable passes its name), if any.
        **options: backend options (``init_capacity``, ``max_capacity``, ``evict_strategy``, ...),
            validated by the backend. Options the backend serves in another form (hkv rounds
            capacities up to powers of two) are changed as it says: one INFO log line names the
            table and each change, and :attr:`Storage.adjustments` keeps them.

    Raises:
        ValueError: an argument or backend option is not valid (the message names it).
        MemoryError: the table could not be allocated; the message gives its capacity and the
            bytes it needed.

    Example::

        >>> s = create_storage("hybrid", row_width=8, evict_strategy="lfu", max_capacity=1024,
        ...                    init_capacity=1024)
    """
    kind, device_id = parse_device(device)
    registry = get_registry()
    spec = registry.spec(var_type)
    row_width = positive_int(row_width, "row_width")
    if row_width > MAX_ROW_WIDTH:
        raise ValueError(
            f"row_width {row_width!r} is too wide; valid: 1 .. {MAX_ROW_WIDTH} (2**31 - 1: the storage C ABI "
            f"holds a row width in an int32); pass a smaller row_width"
        )
    dtype = normalize_key_dtype(key_dtype)
    if dtype.name not in spec.capabilities.key_dtypes:
        raise ValueError(
            f"backend {spec.name!r} (var_type {var_type!r}) does not take {dtype.name} keys; "
            f"valid: {', '.join(spec.capabilities.key_dtypes)}"
        )
    init_list = _initializers(initializer, int(row_width), seed)
    make = factory or registry.factory(var_type)
    texts, adjustments = spec.capabilities.adjusted_options(_options_as_strings(options))
    if adjustments:
        named = "" if name is None else f" {name!r}"
        logger.info("%s table%s (backend %s): %s", var_type, named, spec.name, "; ".join(adjustments))
    distinct = spec.capabilities.lookups_distinct(texts)
    if kind == "cpu":  # no device argument: three-argument factories keep working
        try:
            table = make(dtype.name, int(row_width), texts)
        except MemoryError as error:
            raise _out_of_memory(error, make, spec, var_type, dtype.name, int(row_width), texts, adjustments) from error
        except ValueError as error:
            raise _with_adjustments(error, adjustments) from error
        logger.debug("created %s storage: %s", var_type, table.describe())
        return Storage(table, spec, var_type, init_list, distinct_lookups=distinct, adjustments=adjustments)
    device = f"cuda:{device_id}"
    if "cuda" not in spec.capabilities.devices:
        raise NotImplementedError(
            f"backend {spec.name!r} (var_type {var_type!r}) has no GPU support: its Capabilities.devices is "
            f"{spec.capabilities.devices}, so its tables cannot live on {device!r}; use device='cpu', or install a "
            f"version of {spec.package or spec.name} with GPU support"
        )
    try:
        table = make(dtype.name, int(row_width), texts, device=device)
    except MemoryError as error:
        raise _out_of_memory(
            error, make, spec, var_type, dtype.name, int(row_width), texts, adjustments, device
        ) from error
    except ValueError as error:
        raise _with_adjustments(error, adjustments) from error
    reported = getattr(table, "device", device)
    if reported != device:
        raise RuntimeError(f"backend {spec.name!r} made a table on {reported!r} when asked for one on {device!r}")
    storage = CudaStorage(table, spec, var_type, init_list, device, distinct_lookups=distinct, adjustments=adjustments)
    if logger.isEnabledFor(logging.DEBUG):  # describe() waits for the GPU
        logger.debug("created %s storage on %s: %s", var_type, device, storage.describe())
    return storage


def _adjusted_text(adjustments: tuple[str, ...]) -> str:
    """What a refusal of adjusted options adds, so that it names the values the caller gave (the
    backend's message names the adjusted ones): ``""`` when nothing was adjusted."""
    return f" (the options given were adjusted first: {'; '.join(adjustments)})" if adjustments else ""


def _with_adjustments(error: ValueError, adjustments: tuple[str, ...]) -> ValueError:
    """The backend's refusal of adjusted options, saying what was adjusted from what the caller
    gave; the error itself when nothing was adjusted."""
    if not adjustments:
        return error
    return ValueError(f"{error}{_adjusted_text(adjustments)}")


def _bytes_text(n: int) -> str:
    """``n`` bytes as ``"68,719,476,736 bytes (64.0 GiB)"``."""
    size, unit = float(n), "bytes"
    for next_unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        if size < 1024:
            break
        size, unit = size / 1024, next_unit
    return f"{n:,} bytes" + ("" if unit == "bytes" else f" ({size:.1f} {unit})")


def _out_of_memory(
    error: MemoryError,
    make: Callable[..., Any],
    spec: BackendSpec,
    var_type: str,
    key_dtype: str,
    row_width: int,
    options: dict[str, str],
    adjustments: tuple[str, ...],
    device: str = "cpu",
) -> MemoryError:
    """The MemoryError of a table that could not be allocated, with its size and what to change.

    The capacity is what the backend gives a table of these options (read from a one-float-wide
    table made with them on the CPU), else the ``init_capacity`` option it was given; the message
    also names what the backend adjusted in the options the caller gave."""
    capacity: int | None = None
    try:
        capacity = int(make(key_dtype, 1, options).capacity())
    except Exception:  # noqa: BLE001 (only for the message: the options as given are named instead)
        logger.debug("could not read the capacity of a %s table with options %r", var_type, options, exc_info=True)
    row_bytes = row_width * np.dtype(VALUE_DTYPE).itemsize
    rows = f"rows of {row_width:,} floats ({row_bytes:,} bytes)"
    if capacity is not None:
        size = f"capacity {capacity:,} x {rows} = about {_bytes_text(capacity * row_bytes)}"
    else:
        given = options.get("init_capacity")
        size = f"init_capacity={given}" if given is not None else f"the {spec.name} backend's default init_capacity"
        size += f" x {rows}"
    where = "" if device == "cpu" else f" on {device}"
    return MemoryError(
        f"out of memory allocating a var_type {var_type!r} table ({spec.name} backend){where}: {size} "
        f"(backend: {error}){_adjusted_text(adjustments)}; pass a smaller init_capacity (a backend option) or a "
        f"smaller dimension / row_width"
    )
