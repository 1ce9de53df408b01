"""A dict-based reference model of a storage, the oracle of the conformance suite.

:class:`DictModel` holds rows in a Python dict and follows the documented semantics of
:class:`~sparse_operation_kit.storage.Storage` operations (new rows from
:func:`~sparse_operation_kit.initializers.init_rows`, last duplicate wins for
``insert_or_assign``, duplicates accumulate for ``accum_or_assign``, ...). It has no capacity and
no scores: compare it with backends only where nothing is evicted.

Example::

    >>> import numpy as np
    >>> from sparse_operation_kit import initializers as inits
    >>> model = DictModel(row_width=2, key_dtype="int64", initializers=[inits.constant(1.0)])
    >>> model.find_or_insert(np.array([3, 3]))
    (array([[1., 1.],
           [1., 1.]], dtype=float32), array([False, False]))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from sparse_operation_kit import initializers as inits

__all__ = ["DictModel", "snapshot", "assert_same_contents"]


class DictModel:
    """Rows by key, updated as a storage documents it.

    Args:
        row_width: floats per row.
        key_dtype: the NumPy name of the key dtype (keys are kept as Python ints of that dtype).
        initializers: how new rows are filled (zeros when empty).
    """

    def __init__(
        self, row_width: int, key_dtype: str = "int64", initializers: Sequence[inits.Initializer] = ()
    ) -> None:
        self.row_width = row_width
        self.key_dtype = np.dtype(key_dtype)
        self.initializers = list(initializers)
        self.rows: dict[int, np.ndarray] = {}

    def _cols(self, columns: tuple[int, int] | None) -> slice:
        begin, end = columns if columns is not None else (0, self.row_width)
        return slice(begin, end)

    def new_row(self, key: int) -> np.ndarray:
        """The initial row of ``key``."""
        return inits.init_rows(np.array([key], dtype=self.key_dtype), self.initializers, self.row_width)[0]

    def __len__(self) -> int:
        return len(self.rows)

    def find(self, keys: Any, columns: tuple[int, int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(values, found)``; missing keys read zeros."""
        cols = self._cols(columns)
        width = cols.stop - cols.start
        values = np.zeros((len(keys), width), dtype=np.float32)
        found = np.zeros(len(keys), dtype=bool)
        for i, key in enumerate(int(k) for k in keys):
            row = self.rows.get(key)
            if row is not None:
                values[i] = row[cols]
                found[i] = True
        return values, found

    def find_or_insert(self, keys: Any, columns: tuple[int, int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(values, found)``; ``found`` is False for every key absent before the call."""
        cols = self._cols(columns)
        found = np.array([int(k) in self.rows for k in keys], dtype=bool)
        values = np.zeros((len(keys), cols.stop - cols.start), dtype=np.float32)
        for i, key in enumerate(int(k) for k in keys):
            if key not in self.rows:
                self.rows[key] = self.new_row(key)
            values[i] = self.rows[key][cols]
        return values, found

    def insert_or_assign(self, keys: Any, values: np.ndarray, columns: tuple[int, int] | None = None) -> None:
        """Assign in batch order: the last duplicate wins."""
        cols = self._cols(columns)
        for key, value in zip((int(k) for k in keys), np.asarray(values, dtype=np.float32), strict=True):
            if key not in self.rows:
                self.rows[key] = self.new_row(key)
            self.rows[key][cols] = value

    def accum_or_assign(self, keys: Any, values: np.ndarray, columns: tuple[int, int] | None = None) -> None:
        """Add in batch order (float32); a new key starts its columns from zero."""
        cols = self._cols(columns)
        for key, value in zip((int(k) for k in keys), np.asarray(values, dtype=np.float32), strict=True):
            if key not in self.rows:
                row = self.new_row(key)
                row[cols] = 0.0
                self.rows[key] = row
            self.rows[key][cols] += value

    def erase(self, keys: Any) -> int:
        """Remove keys; the number that were present (each counted once)."""
        return sum(self.rows.pop(key, None) is not None for key in {int(k) for k in keys})

    def clear(self) -> None:
        self.rows.clear()

    def contents(self) -> tuple[np.ndarray, np.ndarray]:
        """``(keys, rows)`` sorted by key."""
        keys = sorted(self.rows)
        rows = np.array([self.rows[k] for k in keys], dtype=np.float32).reshape(len(keys), self.row_width)
        return np.array(keys, dtype=self.key_dtype), rows


def snapshot(storage: Any, columns: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """Every row of ``storage`` as ``(keys, rows)`` sorted by key, read with ``export``."""
    keys, values, _ = storage.export(columns)
    order = np.argsort(keys, kind="stable")
    return keys[order], values[order]


def assert_same_contents(actual: tuple[np.ndarray, np.ndarray], expected: tuple[np.ndarray, np.ndarray]) -> None:
    """Two ``(keys, rows)`` pairs (as from :func:`snapshot`) are equal, keys and rows exactly."""
    np.testing.assert_array_equal(actual[0], expected[0], err_msg="keys differ")
    np.testing.assert_array_equal(actual[1], expected[1], err_msg="rows differ")
