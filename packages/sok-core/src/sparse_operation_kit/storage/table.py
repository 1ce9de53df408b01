"""What a backend's table is to sok-core: the :class:`Table` protocol (a pure-Python backend
implements it; native backends' tables are the C ABI's binding) and the limits of a row."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

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
