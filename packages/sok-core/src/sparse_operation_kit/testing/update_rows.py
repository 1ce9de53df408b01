"""Tests of the C ABI's optional ``update_rows`` (in-place row updates) for backends that have it.

A native backend whose CPU tables implement ``update_rows`` subclasses :class:`UpdateRowsConformance`
in its tests and overrides the ``var_type`` fixture, as for
:class:`~sparse_operation_kit.testing.StorageConformance`::

    class TestMyBackendUpdateRows(UpdateRowsConformance):
        @pytest.fixture
        def var_type(self):
            return "mine"

The tests drive ``update_rows`` through the native table's swapping visitor (``Table.update_rows``,
see :func:`update_rows`), with the backend's default eviction policy, whose scores are times.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from sparse_operation_kit.storage import Storage, create_storage
from sparse_operation_kit.testing.model import assert_same_contents, snapshot

__all__ = ["UpdateRowsConformance", "update_rows"]

WIDTH = 4


def update_rows(
    storage: Storage, keys: Any, new_values: Any, columns: tuple[int, int] | None = None, scores: Any = None
) -> tuple[np.ndarray, np.ndarray, int]:
    """Swap rows of ``storage`` in place through its C ABI's ``update_rows``.

    Args:
        storage: a storage of a native backend on the CPU.
        keys: ``(n,)`` keys.
        new_values: ``(n, w)`` rows to write to columns ``columns`` (default: the whole row).
        columns: ``(begin, end)``.
        scores: ``(n,)`` caller scores (policies that take them), or None.

    Returns:
        ``(old, found, missing)``: the columns the visits read ``(n, w)`` (zeros where nothing was
        visited), which keys are present, and how many are missing (0: every row was visited).

    Example::

        storage.insert_or_assign([7], [[1.0, 2.0]])
        old, found, missing = update_rows(storage, [7], [[3.0, 4.0]])
        # old == [[1, 2]], found == [True], missing == 0; find([7]) now gives [[3, 4]]
    """
    keys = np.ascontiguousarray(keys, dtype=storage.key_dtype)
    begin, end = columns if columns is not None else (0, storage.row_width)
    new = np.ascontiguousarray(new_values, np.float32).reshape(keys.size, end - begin)
    old = np.zeros_like(new)
    found = np.zeros(keys.size, np.uint8)
    caller = None if scores is None else np.ascontiguousarray(scores, np.uint64)
    missing = storage.table.update_rows(keys, begin, end, old, new, found, caller)
    return old, found.astype(bool), missing


def _rows(keys: np.ndarray, offset: float = 0.0) -> np.ndarray:
    return (keys[:, None] * 10.0 + np.arange(WIDTH) + offset).astype(np.float32)


def _scores(storage: Storage) -> dict[int, int]:
    keys, _, scores = storage.export()
    return dict(zip(keys.tolist(), scores.tolist(), strict=True))


class UpdateRowsConformance:
    """``update_rows`` of one backend's CPU tables; subclasses override ``var_type``."""

    @pytest.fixture
    def var_type(self) -> str:
        raise NotImplementedError("override the var_type fixture with the backend's var_type")

    @pytest.fixture
    def storage(self, var_type: str) -> Storage:
        """A table of keys 0..99, row ``k`` = ``10 k + [0, 1, 2, 3]``."""
        storage = create_storage(var_type, row_width=WIDTH)
        keys = np.arange(100)
        storage.insert_or_assign(keys, _rows(keys))
        return storage

    def test_visits_read_and_write_the_rows_in_place(self, storage: Storage) -> None:
        keys = np.array([31, 7, 99])
        old, found, missing = update_rows(storage, keys, -_rows(keys))
        assert missing == 0 and found.all()
        np.testing.assert_array_equal(old, _rows(keys))
        np.testing.assert_array_equal(storage.find(keys)[0], -_rows(keys))
        others = np.setdiff1d(np.arange(100), keys)
        np.testing.assert_array_equal(storage.find(others)[0], _rows(others))
        assert storage.size() == 100

    def test_a_column_range_leaves_the_other_columns(self, storage: Storage) -> None:
        keys = np.array([3, 4])
        old, _, _ = update_rows(storage, keys, np.zeros((2, 2)), columns=(1, 3))
        np.testing.assert_array_equal(old, _rows(keys)[:, 1:3])
        expected = _rows(keys)
        expected[:, 1:3] = 0.0
        np.testing.assert_array_equal(storage.find(keys)[0], expected)

    def test_duplicates_are_visited_in_batch_order(self, storage: Storage) -> None:
        keys = np.array([5, 6, 5, 5])
        new = _rows(keys, offset=np.arange(4)[:, None] + 1000.0)
        old, _, missing = update_rows(storage, keys, new)
        assert missing == 0
        np.testing.assert_array_equal(old, np.stack([_rows(keys)[0], _rows(keys)[1], new[0], new[2]]))
        np.testing.assert_array_equal(storage.find(np.array([5, 6]))[0], new[[3, 1]])

    def test_scores_become_those_of_insert_or_assign(self, storage: Storage) -> None:
        """The default policies score a write with its time: visited rows get the call's time,
        the others keep theirs."""
        before = _scores(storage)
        start = time.time_ns()
        update_rows(storage, [8, 9], np.zeros((2, WIDTH)))
        end = time.time_ns()
        after = _scores(storage)
        assert all(max(start, before.pop(k)) <= after.pop(k) <= end + 10**6 for k in (8, 9))
        assert after == before

    def test_a_missing_key_leaves_the_table_unchanged(self, storage: Storage) -> None:
        contents, scores = snapshot(storage), _scores(storage)
        keys = np.array([1, 1000, 2, 2000])
        old, found, missing = update_rows(storage, keys, np.zeros((4, WIDTH)))
        assert missing == 2
        assert found.tolist() == [True, False, True, False]
        np.testing.assert_array_equal(old, np.zeros((4, WIDTH)))  # nothing was visited
        assert_same_contents(snapshot(storage), contents)
        assert _scores(storage) == scores and storage.size() == 100

    def test_an_empty_batch_visits_nothing(self, storage: Storage) -> None:
        assert update_rows(storage, np.zeros(0, np.int64), np.zeros((0, WIDTH)))[2] == 0

    def test_a_batch_for_the_parallel_path(self, var_type: str) -> None:
        storage = create_storage(var_type, row_width=WIDTH, init_capacity=1 << 17)
        keys = np.random.default_rng(0).permutation(50_000) * 3 - 70_000
        storage.insert_or_assign(keys, _rows(keys))
        batch = np.concatenate([keys[::2], keys[:2000:2]])  # 26 000 keys, 1 000 repeated
        new = _rows(batch, offset=0.5)
        old, found, missing = update_rows(storage, batch, new)
        assert missing == 0 and found.all()
        np.testing.assert_array_equal(old[:25_000], _rows(batch[:25_000]))
        last = {k: row for k, row in zip(batch.tolist(), new, strict=True)}
        np.testing.assert_array_equal(storage.find(keys[::2])[0], [last[k] for k in keys[::2].tolist()])
        np.testing.assert_array_equal(storage.find(keys[1::2])[0], _rows(keys[1::2]))

    def test_a_bad_column_range_is_refused(self, storage: Storage) -> None:
        with pytest.raises(ValueError, match=r"column range \[2, 9\)"):
            update_rows(storage, [1], np.zeros((1, 7)), columns=(2, 9))
