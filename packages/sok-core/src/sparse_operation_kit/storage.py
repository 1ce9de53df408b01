"""Storages: one embedding-table shard in one process, over any backend.

:func:`create_storage` picks the backend by ``var_type`` through the registry and returns a
:class:`Storage`, which checks every argument (dtypes, shapes, column ranges) once for all
backends and then calls the backend's *table*. A table follows the protocol :class:`Table`
(arrays in, caller-allocated arrays out); native backends implement it over their C ABI, and a
pure-Python backend can implement it directly.

A row holds ``row_width`` floats: ``[embedding | optimizer state]``. Reads and writes name a
column range (``columns=(begin, end)``, default the whole row) so a lookup never touches optimizer
state. Every value of the key dtype is a valid key.

Example::

    >>> import numpy as np
    >>> from sparse_operation_kit.storage import create_storage
    >>> s = create_storage("hbm", row_width=4, initializer="13")
    >>> values, found = s.find_or_insert(np.array([0, 1, 2**40]))
    >>> values[:, 0], found, s.size()
    (array([13., 13., 13.], dtype=float32), array([False, False, False]), 3)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from sparse_operation_kit import initializers as inits
from sparse_operation_kit.dtypes import SCORE_DTYPE, VALUE_DTYPE, normalize_key_dtype
from sparse_operation_kit.plugins.registry import BackendSpec, get_registry
from sparse_operation_kit.progress import Callback, NoOpCallback

logger = logging.getLogger(__name__)

__all__ = ["NativeTable", "Storage", "Table", "create_storage"]

#: Slots scanned per export_batch call by :meth:`Storage.export`.
EXPORT_CHUNK = 1 << 18

InitTuple = tuple[int, int, int, float, float, int]


class Table(Protocol):
    """What a backend's factory returns. Arguments arrive validated by :class:`Storage`: keys are
    1-D C-contiguous arrays of the table's key dtype, values C-contiguous float32 ``(n, w)`` with
    ``w = col_end - col_begin``, scores uint64 ``(n,)`` or None, outputs preallocated."""

    row_width: int
    key_dtype: str

    def size(self) -> int: ...
    def capacity(self) -> int: ...
    def find(self, keys, col_begin: int, col_end: int, values_out, default_row, found_out) -> None: ...
    def find_or_insert(
        self, keys, col_begin: int, col_end: int, values_out, found_out, scores, inits: Sequence[InitTuple]
    ) -> None: ...
    def insert_or_assign(
        self, keys, col_begin: int, col_end: int, values, scores, inits: Sequence[InitTuple]
    ) -> None: ...
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
    """The table class of a native backend (``sok/python_table.hpp``, the same in every backend): a
    :class:`Table` driven through the C ABI, constructed as ``Table(key_dtype, row_width, options)``."""

    def handle_capsule(self) -> Any:
        """The ``sok_storage*`` of this table as a PyCapsule (valid while the table lives)."""
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


def _integers(values: Any, what: str, dtype: np.dtype) -> np.ndarray:
    """``values`` as a C-contiguous array of ``dtype``, refusing non-integers and values that do not
    fit (named in the message). Python lists are read as exact ints (NumPy would make a list with
    values beyond int64 float64 or object)."""
    array = np.asarray(values)
    if array.size == 0:  # [] is float64 to NumPy; an empty batch has no dtype to check
        return np.empty(array.shape, dtype=dtype)
    if not isinstance(values, np.ndarray) and array.dtype.kind in "fO":
        items = np.asarray(values, dtype=object).ravel().tolist()
        if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in items):
            array = np.array([int(v) for v in items], dtype=object).reshape(array.shape)
    if array.dtype.kind not in "iuO" or (
        array.dtype == object and not all(isinstance(v, (int, np.integer)) for v in array.ravel().tolist())
    ):
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
    """

    def __init__(
        self, table: Table, spec: BackendSpec, var_type: str, initializers: Sequence[inits.Initializer] = ()
    ) -> None:
        self.table = table
        self.spec = spec
        self.var_type = var_type
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
        array = np.asarray(values)
        if array.dtype.kind not in "fiu":
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

    # -- operations -----------------------------------------------------------------------------
    def size(self) -> int:
        """Number of keys stored."""
        return int(self.table.size())

    def __len__(self) -> int:
        return self.size()

    def capacity(self) -> int:
        """Number of slots (the range of :meth:`export_batch` offsets)."""
        return int(self.table.capacity())

    def find(self, keys: Any, columns: Any = None, default: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """Rows of ``keys`` (``default`` row or zeros for missing keys) and a found mask.

        Does not insert and does not change scores.
        """
        k = self._keys(keys)
        begin, end = self._columns(columns)
        width = end - begin
        default_row = None
        if default is not None:
            given = np.asarray(default, dtype=VALUE_DTYPE)
            if given.shape not in ((), (width,)):
                raise ValueError(f"default must be a number or a row of {width} values, got shape {given.shape}")
            default_row = np.ascontiguousarray(np.broadcast_to(given, (width,)))
        values = np.empty((k.size, width), dtype=VALUE_DTYPE)
        found = np.empty(k.size, dtype=np.bool_)
        self.table.find(k, begin, end, values, default_row, found)
        return values, found

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
        k = self._keys(keys)
        begin, end = self._columns(columns)
        values = np.empty((k.size, end - begin), dtype=VALUE_DTYPE)
        found = np.empty(k.size, dtype=np.bool_)
        self.table.find_or_insert(k, begin, end, values, found, self._scores(scores, k.size), self._inits(initializers))
        return values, found

    def insert_or_assign(self, keys: Any, values: Any, columns: Any = None, scores: Any = None) -> None:
        """Write ``values`` to the columns of ``keys``, inserting new keys (other columns
        initialised). For duplicate keys the last one wins."""
        k = self._keys(keys)
        begin, end = self._columns(columns)
        v = self._values(values, k.size, end - begin)
        self.table.insert_or_assign(k, begin, end, v, self._scores(scores, k.size), self._init_tuples)

    def accum_or_assign(self, keys: Any, values: Any, columns: Any = None, scores: Any = None) -> None:
        """Add ``values`` to existing keys' columns; insert new keys with ``values``.
        Duplicate keys accumulate."""
        k = self._keys(keys)
        begin, end = self._columns(columns)
        v = self._values(values, k.size, end - begin)
        self.table.accum_or_assign(k, begin, end, v, self._scores(scores, k.size), self._init_tuples)

    def erase(self, keys: Any) -> int:
        """Remove ``keys``; returns how many were present."""
        return int(self.table.erase(self._keys(keys)))

    def insert_and_evict(
        self, keys: Any, values: Any, columns: Any = None, scores: Any = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`insert_or_assign` that returns what it displaced: ``(keys, rows, scores)`` of
        evicted rows (whole rows, optimizer state included) and of inputs the policy refused."""
        k = self._keys(keys)
        begin, end = self._columns(columns)
        v = self._values(values, k.size, end - begin)
        ev_keys = np.empty(k.size, dtype=self.key_dtype)
        ev_values = np.empty((k.size, self.row_width), dtype=VALUE_DTYPE)
        ev_scores = np.empty(k.size, dtype=SCORE_DTYPE)
        count = int(
            self.table.insert_and_evict(
                k, begin, end, v, self._scores(scores, k.size), self._init_tuples, ev_keys, ev_values, ev_scores
            )
        )
        return ev_keys[:count], ev_values[:count], ev_scores[:count]

    def export_batch(
        self, offset: int, limit: int, columns: Any = None, threshold: int | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Live rows in slots ``[offset, offset + limit)``: ``(keys, values, scores)``; with
        ``threshold``, only rows whose score is at least ``threshold``."""
        offset, limit = int(offset), int(limit)
        if offset < 0 or limit < 0:
            raise ValueError(f"offset and limit must be >= 0, got offset={offset}, limit={limit}")
        if threshold is not None and not 0 <= int(threshold) < 2**64:
            raise ValueError(f"threshold must be in [0, 2**64), got {threshold!r}")
        begin, end = self._columns(columns)
        limit = min(limit, max(0, self.capacity() - offset))
        keys = np.empty(limit, dtype=self.key_dtype)
        values = np.empty((limit, end - begin), dtype=VALUE_DTYPE)
        scores = np.empty(limit, dtype=SCORE_DTYPE)
        count = int(
            self.table.export_batch(
                offset, limit, begin, end, keys, values, scores, None if threshold is None else int(threshold)
            )
        )
        return keys[:count], values[:count], scores[:count]

    def export(
        self, columns: Any = None, threshold: int | None = None, callback: Callback | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every live row (with ``threshold``: every row scored at least that), in slot order.

        ``callback`` (see :mod:`sparse_operation_kit.progress`) is told the slots scanned.
        """
        callback = callback or NoOpCallback()
        capacity = self.capacity()
        callback.set_size(capacity)
        parts = []
        for offset in range(0, capacity, EXPORT_CHUNK):
            parts.append(self.export_batch(offset, EXPORT_CHUNK, columns, threshold))
            callback.relative_update(min(EXPORT_CHUNK, capacity - offset))
        if not parts:
            begin, end = self._columns(columns)
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
        k = self._keys(keys)
        begin, end = self._columns(columns)
        v = self._values(values, k.size, end - begin)
        s = self._scores(scores, k.size)
        if s is None:
            raise ValueError("import_batch needs scores (one per key)")
        self.table.import_batch(k, begin, end, v, s, self._init_tuples)

    def clear(self) -> None:
        """Remove every key (capacity stays)."""
        self.table.clear()

    def set_global_epoch(self, epoch: int) -> None:
        """The epoch of the epoch_lru / epoch_lfu policies."""
        self.table.set_global_epoch(int(epoch))

    def describe(self) -> str:
        """The backend's one-line summary of the table's state."""
        return str(self.table.describe())

    def __repr__(self) -> str:
        return f"Storage(var_type={self.var_type!r}, {self.describe()})"


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
    **options: Any,
) -> Storage:
    """A new storage of the backend serving ``var_type``.

    Args:
        var_type: ``"hbm"`` (det), ``"hybrid"`` (hkv) or a plugin's name.
        row_width: floats per row (embedding width plus optimizer state), >= 1.
        key_dtype: ``"int64"``, ``"uint64"`` or ``"int32"`` (or a NumPy/TF dtype).
        initializer: how new rows are filled: a string (``"random"`` = U[-0.05, 0.05),
            ``"normal"``, ``"zeros"``, ``"ones"``, ``"13"``), a number, or Initializer objects.
        seed: seed of random initializers given as strings.
        factory: use this table factory instead of the registry's (tests, tools).
        **options: backend options (``init_capacity``, ``max_capacity``, ``evict_strategy``, ...),
            validated by the backend.

    Example::

        >>> s = create_storage("hybrid", row_width=8, evict_strategy="lfu", max_capacity=1024,
        ...                    init_capacity=1024)
    """
    registry = get_registry()
    spec = registry.spec(var_type)
    if isinstance(row_width, bool) or not isinstance(row_width, (int, np.integer)) or row_width < 1:
        raise ValueError(f"row_width must be an integer >= 1, got {row_width!r}")
    dtype = normalize_key_dtype(key_dtype)
    if dtype.name not in spec.capabilities.key_dtypes:
        raise ValueError(
            f"backend {spec.name!r} (var_type {var_type!r}) does not take {dtype.name} keys; "
            f"valid: {', '.join(spec.capabilities.key_dtypes)}"
        )
    init_list = _initializers(initializer, int(row_width), seed)
    make = factory or registry.factory(var_type)
    table = make(dtype.name, int(row_width), _options_as_strings(options))
    logger.debug("created %s storage: %s", var_type, table.describe())
    return Storage(table, spec, var_type, init_list)
