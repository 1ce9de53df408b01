"""Type stub of the native extension (see sok/python_table.hpp in sok-core)."""

from collections.abc import Sequence
from typing import Any

import numpy as np

BUILD_INFO: dict[str, Any]

def storage_api() -> Any:
    """The ``sok_storage_api`` function table as a PyCapsule."""

class Table:
    def __init__(self, key_dtype: str, row_width: int, options: dict[str, str]) -> None: ...
    @property
    def row_width(self) -> int: ...
    @property
    def key_dtype(self) -> str: ...
    def size(self) -> int: ...
    def capacity(self) -> int: ...
    def find(
        self,
        keys: np.ndarray,
        col_begin: int,
        col_end: int,
        values: np.ndarray,
        default_row: np.ndarray | None,
        found: np.ndarray,
    ) -> None: ...
    def find_or_insert(
        self,
        keys: np.ndarray,
        col_begin: int,
        col_end: int,
        values: np.ndarray,
        found: np.ndarray,
        scores: np.ndarray | None,
        inits: Sequence[tuple[int, int, int, float, float, int]],
    ) -> None: ...
    def insert_or_assign(
        self,
        keys: np.ndarray,
        col_begin: int,
        col_end: int,
        values: np.ndarray,
        scores: np.ndarray | None,
        inits: Sequence[tuple[int, int, int, float, float, int]],
    ) -> None: ...
    def accum_or_assign(
        self,
        keys: np.ndarray,
        col_begin: int,
        col_end: int,
        values: np.ndarray,
        scores: np.ndarray | None,
        inits: Sequence[tuple[int, int, int, float, float, int]],
    ) -> None: ...
    def erase(self, keys: np.ndarray) -> int: ...
    def export_batch(
        self,
        offset: int,
        limit: int,
        col_begin: int,
        col_end: int,
        keys: np.ndarray,
        values: np.ndarray | None,
        scores: np.ndarray | None,
        threshold: int | None,
    ) -> int: ...
    def insert_and_evict(
        self,
        keys: np.ndarray,
        col_begin: int,
        col_end: int,
        values: np.ndarray,
        scores: np.ndarray | None,
        inits: Sequence[tuple[int, int, int, float, float, int]],
        evicted_keys: np.ndarray,
        evicted_values: np.ndarray,
        evicted_scores: np.ndarray,
    ) -> int: ...
    def clear(self) -> None: ...
    def set_global_epoch(self, epoch: int) -> None: ...
    def describe(self) -> str: ...
    def handle_capsule(self) -> Any: ...
