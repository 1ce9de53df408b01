"""The storage facade: :class:`Storage` turns what the user gives into what every table takes,
checks it (see the package's docstring for who checks what) and calls the backend's table."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from sparse_operation_kit import _table
from sparse_operation_kit import initializers as inits
from sparse_operation_kit.device_arrays import (
    is_device_array,
)
from sparse_operation_kit.dtypes import SCORE_DTYPE, VALUE_DTYPE
from sparse_operation_kit.plugins.registry import BackendSpec
from sparse_operation_kit.progress import Callback, NoOpCallback
from sparse_operation_kit.storage.table import InitTuple, Table


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
