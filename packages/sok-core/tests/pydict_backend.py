"""pydict: a pure-Python storage backend (var_type ``"pydict"``), registered as a plugin.

It proves that a third party can add a backend with nothing but the plugin hook and the
:class:`~sparse_operation_kit.storage.Table` protocol: rows live in NumPy arrays indexed by a
dict, new rows come from :func:`~sparse_operation_kit.initializers.init_rows` (the reference of
the native backends' random stream), scores are the time in ns of the last write, strictly
increasing per table, and nothing is evicted (the table grows).

This module is the plugin: register it with
``get_registry().register_plugin(pydict_backend, name="pydict")``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np
from sparse_operation_kit import initializers as inits
from sparse_operation_kit.plugins import BackendSpec, Capabilities, hookimpl

VAR_TYPE = "pydict"
OPTIONS = ("init_capacity",)

InitTuple = tuple[int, int, int, float, float, int]


def _initializers(tuples: Sequence[InitTuple]) -> list[inits.Initializer]:
    return [
        inits.Initializer(inits.InitKind(kind), a, b, seed, (begin, end)) for kind, begin, end, a, b, seed in tuples
    ]


class PyDictTable:
    """A growing table of float32 rows: a dict from key to slot over slot-indexed arrays.

    Slots are handed out in order and reused after erases, so ``export_batch`` scans a stable
    slot order. One lock serialises every call.

    Args:
        key_dtype: ``"int64"``, ``"uint64"`` or ``"int32"``.
        row_width: floats per row.
        options: ``init_capacity`` (slots, default 64).
    """

    def __init__(self, key_dtype: str, row_width: int, options: dict[str, str]) -> None:
        options = dict(options)
        text = options.pop("init_capacity", "64")
        if options:
            raise ValueError(
                f"unknown option {next(iter(options))!r} for backend pydict; valid options: {', '.join(OPTIONS)}"
            )
        try:
            capacity = int(text)
        except ValueError:
            raise ValueError(f"init_capacity={text!r} is not an integer") from None
        if capacity < 1:
            raise ValueError(f"init_capacity={capacity} must be >= 1")
        self.key_dtype = key_dtype
        self.row_width = row_width
        self._lock = threading.Lock()
        self._slot_of: dict[int, int] = {}
        self._keys = np.zeros(capacity, dtype=key_dtype)
        self._live = np.zeros(capacity, dtype=bool)
        self._rows = np.zeros((capacity, row_width), dtype=np.float32)
        self._scores = np.zeros(capacity, dtype=np.uint64)
        self._free: list[int] = []
        self._next_slot = 0
        self._last_score = 0

    # -- internals (called with the lock held) ---------------------------------------------------
    def _tick(self) -> int:
        self._last_score = max(time.time_ns(), self._last_score + 1)
        return self._last_score

    @staticmethod
    def _refuse_scores(scores: np.ndarray | None) -> None:
        if scores is not None:
            raise ValueError("pydict computes scores itself (the time of the last write); pass no scores")

    def _grow(self) -> None:
        capacity = 2 * self._keys.size
        self._keys = np.resize(self._keys, capacity)
        self._live = np.concatenate([self._live, np.zeros(capacity - self._live.size, bool)])
        self._rows = np.concatenate(
            [self._rows, np.zeros((capacity - self._rows.shape[0], self.row_width), np.float32)]
        )
        self._scores = np.concatenate([self._scores, np.zeros(capacity - self._scores.size, np.uint64)])

    def _new_slot(self, key: int) -> int:
        if self._free:
            slot = self._free.pop()
        else:
            if self._next_slot == self._keys.size:
                self._grow()
            slot = self._next_slot
            self._next_slot += 1
        self._slot_of[key] = slot
        self._keys[slot] = key
        self._live[slot] = True
        return slot

    def _slots(self, keys: np.ndarray, init_tuples: Sequence[InitTuple]) -> tuple[np.ndarray, np.ndarray]:
        """Slots of keys, inserting missing ones with initial rows; and the mask of new slots."""
        found = np.array([int(k) in self._slot_of for k in keys], dtype=bool)
        missing = list(dict.fromkeys(int(k) for k in keys[~found]))
        if missing:
            rows = inits.init_rows(np.array(missing, dtype=self.key_dtype), _initializers(init_tuples), self.row_width)
            for key, row in zip(missing, rows, strict=True):
                slot = self._new_slot(key)  # may grow (replace) the arrays
                self._rows[slot] = row
        slots = np.array([self._slot_of[int(k)] for k in keys], dtype=np.int64)
        return slots, found

    # -- the Table protocol ---------------------------------------------------------------------
    def size(self) -> int:
        with self._lock:
            return len(self._slot_of)

    def capacity(self) -> int:
        with self._lock:
            return int(self._keys.size)

    def find(self, keys, col_begin: int, col_end: int, values_out, default_row, found_out) -> None:
        with self._lock:
            for i, key in enumerate(keys):
                slot = self._slot_of.get(int(key))
                found_out[i] = slot is not None
                if slot is not None:
                    values_out[i] = self._rows[slot, col_begin:col_end]
                else:
                    values_out[i] = 0.0 if default_row is None else default_row

    def find_or_insert(
        self, keys, col_begin: int, col_end: int, values_out, found_out, scores, inits: Sequence[InitTuple]
    ) -> None:
        self._refuse_scores(scores)
        with self._lock:
            slots, found = self._slots(keys, inits)
            found_out[:] = found
            values_out[:] = self._rows[slots, col_begin:col_end]
            self._scores[slots] = self._tick()

    def _write(
        self,
        keys,
        col_begin: int,
        col_end: int,
        values,
        scores,
        inits: Sequence[InitTuple],
        accumulate: bool,
        imported: bool = False,
    ) -> None:
        if not imported:
            self._refuse_scores(scores)
        with self._lock:
            slots, found = self._slots(keys, inits)
            if accumulate:
                self._rows[slots[~found], col_begin:col_end] = 0.0  # a new key takes the batch's sum
            for slot, value in zip(slots, values, strict=True):  # in batch order: last wins, sums in order
                if accumulate:
                    self._rows[slot, col_begin:col_end] += value
                else:
                    self._rows[slot, col_begin:col_end] = value
            self._scores[slots] = scores if imported else self._tick()

    def import_batch(self, keys, col_begin: int, col_end: int, values, scores, inits: Sequence[InitTuple]) -> None:
        self._write(keys, col_begin, col_end, values, scores, inits, accumulate=False, imported=True)

    def insert_or_assign(self, keys, col_begin: int, col_end: int, values, scores, inits: Sequence[InitTuple]) -> None:
        self._write(keys, col_begin, col_end, values, scores, inits, accumulate=False)

    def accum_or_assign(self, keys, col_begin: int, col_end: int, values, scores, inits: Sequence[InitTuple]) -> None:
        self._write(keys, col_begin, col_end, values, scores, inits, accumulate=True)

    def erase(self, keys) -> int:
        with self._lock:
            erased = 0
            for key in keys:
                slot = self._slot_of.pop(int(key), None)
                if slot is not None:
                    self._live[slot] = False
                    self._free.append(slot)
                    erased += 1
            return erased

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
    ) -> int:
        with self._lock:
            end = min(self._keys.size, offset + limit)
            picked = np.flatnonzero(self._live[offset:end]) + offset
            if threshold is not None:
                picked = picked[self._scores[picked] >= np.uint64(threshold)]
            count = picked.size
            keys_out[:count] = self._keys[picked]
            values_out[:count] = self._rows[picked, col_begin:col_end]
            scores_out[:count] = self._scores[picked]
            return count

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
    ) -> int:
        self.insert_or_assign(keys, col_begin, col_end, values, scores, inits)
        return 0  # the table grows instead of evicting

    def clear(self) -> None:
        with self._lock:
            self._slot_of.clear()
            self._live[:] = False
            self._free.clear()
            self._next_slot = 0

    def set_global_epoch(self, epoch: int) -> None:
        raise NotImplementedError("pydict has no epoch-based eviction policy (epoch_lru, epoch_lfu)")

    def describe(self) -> str:
        with self._lock:
            return (
                f"pydict (Python): {len(self._slot_of)} keys, {self._keys.size} slots, "
                f"row width {self.row_width}, key {self.key_dtype}"
            )


SPEC = BackendSpec(
    name="pydict",
    var_types=(VAR_TYPE,),
    factory=PyDictTable,
    capabilities=Capabilities(eviction=False, export_if=True, devices=("cpu",)),
    package="sok-core tests",
    version="0",
)


@hookimpl
def sok_register_backends(registry) -> None:
    """Register the pydict backend."""
    registry.register(SPEC)
