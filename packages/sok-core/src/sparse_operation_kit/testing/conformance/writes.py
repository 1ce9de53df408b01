"""The storage conformance suite, writes: ``insert_or_assign`` (inserts, overwrites, the last
duplicate wins, a column range leaves the other columns or initializes them for a new key, values
become float32; with ``unique_keys=True`` the same rows, and a broken promise stores each key
once), ``accum_or_assign`` (adds, duplicates accumulate, a new key gets its initial row
plus the sum) and ``import_batch`` (stores the caller's scores).
"""

from __future__ import annotations

import numpy as np
import pytest

from sparse_operation_kit import initializers as inits
from sparse_operation_kit.storage import Storage
from sparse_operation_kit.testing.conformance.base import _RANDOM, ConformanceFixtures, MakeStorage, _keys, _rows_for

__all__ = ["WriteConformance"]


class WriteConformance(ConformanceFixtures):
    """``insert_or_assign``, ``accum_or_assign`` and ``import_batch``: a concern of
    :class:`StorageConformance`, also usable alone."""

    # -- insert_or_assign -----------------------------------------------------------------------
    def test_insert_or_assign_inserts_rows(self, storage: Storage) -> None:
        keys = _keys([3, 1, 2])
        storage.insert_or_assign(keys, _rows_for(keys, 4))
        assert storage.size() == 3
        np.testing.assert_array_equal(storage.find(keys)[0], _rows_for(keys, 4))

    def test_insert_or_assign_overwrites_existing_rows(self, storage: Storage) -> None:
        keys = _keys([3, 1])
        storage.insert_or_assign(keys, _rows_for(keys, 4))
        storage.insert_or_assign(keys, -_rows_for(keys, 4))
        np.testing.assert_array_equal(storage.find(keys)[0], -_rows_for(keys, 4))
        assert storage.size() == 2

    def test_insert_or_assign_last_duplicate_wins(self, storage: Storage) -> None:
        keys = _keys([6, 8, 6, 6])
        values = np.arange(16, dtype=np.float32).reshape(4, 4)
        storage.insert_or_assign(keys, values)
        np.testing.assert_array_equal(storage.find(_keys([6, 8]))[0], values[[3, 1]])

    def test_insert_or_assign_column_range_leaves_other_columns(self, make_storage: MakeStorage) -> None:
        storage = make_storage(row_width=6)
        keys = _keys([1, 2])
        storage.insert_or_assign(keys, _rows_for(keys, 6))
        storage.insert_or_assign(keys, np.full((2, 2), -1.0, np.float32), columns=(2, 4))
        expected = _rows_for(keys, 6)
        expected[:, 2:4] = -1.0
        np.testing.assert_array_equal(storage.find(keys)[0], expected)

    def test_insert_or_assign_column_range_of_new_key_initializes_the_rest(self, make_storage: MakeStorage) -> None:
        storage = make_storage(row_width=6, initializer=_RANDOM)
        keys = _keys([1, 2])
        storage.insert_or_assign(keys, np.full((2, 2), -1.0, np.float32), columns=slice(2, 4))
        expected = inits.init_rows(keys, [_RANDOM], 6)
        expected[:, 2:4] = -1.0
        np.testing.assert_array_equal(storage.find(keys)[0], expected)

    def test_insert_or_assign_converts_values_to_float32(self, storage: Storage) -> None:
        storage.insert_or_assign(_keys([1]), np.array([[1, 2, 3, 4]], dtype=np.int64))
        np.testing.assert_array_equal(storage.find(_keys([1]))[0], [[1, 2, 3, 4]])

    def test_insert_or_assign_unique_keys_writes_as_without_the_hint(self, make_storage: MakeStorage) -> None:
        hinted, plain = make_storage(row_width=6), make_storage(row_width=6)
        present = _keys([5, 1, 9])
        for storage in (hinted, plain):
            storage.insert_or_assign(present, _rows_for(present, 6))
        keys = _keys([9, 4, 1, 7])  # two present, two new
        values = -_rows_for(keys, 2)
        hinted.insert_or_assign(keys, values, columns=(2, 4), unique_keys=True)
        plain.insert_or_assign(keys, values, columns=(2, 4))
        everything = _keys([1, 4, 5, 7, 9])
        np.testing.assert_array_equal(hinted.find(everything)[0], plain.find(everything)[0])
        assert hinted.size() == plain.size() == 5

    def test_insert_or_assign_broken_unique_promise_keeps_each_key_once(self, storage: Storage) -> None:
        storage.insert_or_assign(_keys([6]), _rows_for(_keys([6]), 4))
        keys = _keys([6, 8, 6, 8, 2])  # 6 present, 8 new: both repeated
        values = np.arange(20, dtype=np.float32).reshape(5, 4)
        storage.insert_or_assign(keys, values, unique_keys=True)
        assert storage.size() == 3
        exported = storage.export()[0]
        assert sorted(exported.tolist()) == sorted(_keys([2, 6, 8]).tolist())
        rows = storage.find(_keys([6, 8, 2]))[0]
        assert any(np.array_equal(rows[0], values[i]) for i in (0, 2))
        assert any(np.array_equal(rows[1], values[i]) for i in (1, 3))
        np.testing.assert_array_equal(rows[2], values[4])

    def test_insert_or_assign_unique_keys_must_be_a_bool(self, storage: Storage) -> None:
        with pytest.raises(TypeError, match="unique_keys must be True or False, got 'yes'"):
            storage.insert_or_assign(_keys([1]), _rows_for(_keys([1]), 4), unique_keys="yes")  # type: ignore[arg-type]
        assert storage.size() == 0

    # -- accum_or_assign ------------------------------------------------------------------------
    def test_accum_or_assign_adds_to_existing_rows(self, storage: Storage) -> None:
        keys = _keys([1, 2])
        storage.insert_or_assign(keys, _rows_for(keys, 4))
        storage.accum_or_assign(keys, np.full((2, 4), 0.5, np.float32))
        np.testing.assert_array_equal(storage.find(keys)[0], _rows_for(keys, 4) + np.float32(0.5))

    def test_accum_or_assign_duplicates_accumulate(self, storage: Storage) -> None:
        storage.insert_or_assign(_keys([1]), np.ones((1, 4), np.float32))
        storage.accum_or_assign(_keys([1, 1, 1]), np.array([[1.0] * 4, [2.0] * 4, [4.0] * 4], np.float32))
        np.testing.assert_array_equal(storage.find(_keys([1]))[0], [[8.0] * 4])

    def test_accum_or_assign_new_key_gets_the_sum(self, make_storage: MakeStorage) -> None:
        storage = make_storage(row_width=2, initializer=100.0)
        storage.accum_or_assign(_keys([5, 5, 6]), np.array([[1, 2], [3, 4], [5, 6]], np.float32))
        np.testing.assert_array_equal(storage.find(_keys([5, 6]))[0], [[4, 6], [5, 6]])

    def test_accum_or_assign_column_range_of_new_key_initializes_the_rest(self, make_storage: MakeStorage) -> None:
        storage = make_storage(row_width=4, initializer=_RANDOM)
        keys = _keys([5, 5])
        storage.accum_or_assign(keys, np.array([[1, 2], [3, 4]], np.float32), columns=(2, 4))
        expected = inits.init_rows(_keys([5]), [_RANDOM], 4)
        expected[:, 2:4] = [4, 6]
        np.testing.assert_array_equal(storage.find(_keys([5]))[0], expected)

    def test_accum_or_assign_column_range_leaves_other_columns(self, make_storage: MakeStorage) -> None:
        storage = make_storage(row_width=6)
        keys = _keys([1, 2])
        storage.insert_or_assign(keys, _rows_for(keys, 6))
        storage.accum_or_assign(keys, np.full((2, 2), 10.0, np.float32), columns=(2, 4))
        expected = _rows_for(keys, 6)
        expected[:, 2:4] += 10.0
        np.testing.assert_array_equal(storage.find(keys)[0], expected)

    # -- import_batch ---------------------------------------------------------------------------
    def test_import_batch_stores_the_given_scores(self, storage: Storage) -> None:
        keys = _keys(np.arange(1, 6))
        scores = np.array([7, 2**63, 5, 0, 2**64 - 1], dtype=np.uint64)
        storage.import_batch(keys, _rows_for(keys, storage.row_width), scores)
        exported, values, got = storage.export()
        order = np.argsort(exported)
        np.testing.assert_array_equal(exported[order], keys)
        np.testing.assert_array_equal(got[order], scores)
        np.testing.assert_array_equal(values[order], _rows_for(keys, storage.row_width))
        storage.import_batch(keys[:2], _rows_for(keys[:2], storage.row_width), np.array([1, 1], np.uint64))
        assert sorted(storage.export_if(2)[0].tolist()) == [3, 5]
