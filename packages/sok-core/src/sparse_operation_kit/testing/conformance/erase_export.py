"""The storage conformance suite, erase, export and the table's size: ``erase`` (counts present
keys once, removes rows, is idempotent; an erased key comes back with a fresh row),
``export_batch`` and ``export`` (every row once over all slots, at most ``limit`` rows per batch,
column ranges, no erased rows) and ``size``, ``capacity``, ``clear``.
"""

from __future__ import annotations

import numpy as np

from sparse_operation_kit import initializers as inits
from sparse_operation_kit.storage import Storage
from sparse_operation_kit.testing.conformance.base import _RANDOM, ConformanceFixtures, MakeStorage, _keys, _rows_for

__all__ = ["EraseExportConformance"]


class EraseExportConformance(ConformanceFixtures):
    """``erase``, ``export_batch``/``export``, ``size``, ``capacity`` and ``clear``: a concern of
    :class:`StorageConformance`, also usable alone."""

    # -- erase ----------------------------------------------------------------------------------
    def test_erase_returns_the_number_of_present_keys(self, storage: Storage) -> None:
        storage.find_or_insert(_keys([1, 2, 3]))
        assert storage.erase(_keys([2, 3, 4, 5])) == 2

    def test_erase_counts_a_duplicated_key_once(self, storage: Storage) -> None:
        storage.find_or_insert(_keys([1, 2]))
        assert storage.erase(_keys([1, 1, 1])) == 1
        assert storage.size() == 1

    def test_erase_removes_rows(self, storage: Storage) -> None:
        storage.find_or_insert(_keys([1, 2, 3]))
        storage.erase(_keys([1, 3]))
        assert storage.size() == 1
        np.testing.assert_array_equal(storage.find(_keys([1, 2, 3]))[1], [False, True, False])
        np.testing.assert_array_equal(storage.export()[0], [2])

    def test_erase_is_idempotent(self, storage: Storage) -> None:
        storage.find_or_insert(_keys([1, 2]))
        assert storage.erase(_keys([1])) == 1
        assert storage.erase(_keys([1])) == 0
        assert storage.size() == 1

    def test_erased_key_comes_back_with_a_fresh_row(self, make_storage: MakeStorage) -> None:
        storage = make_storage(row_width=2, initializer=_RANDOM)
        storage.insert_or_assign(_keys([4]), [[9.0, 9.0]])
        storage.erase(_keys([4]))
        values, found = storage.find_or_insert(_keys([4]))
        np.testing.assert_array_equal(values, inits.init_rows(_keys([4]), [_RANDOM], 2))
        assert not found[0]

    # -- export ---------------------------------------------------------------------------------
    def test_export_batch_over_all_slots_returns_every_row_once(self, make_storage: MakeStorage) -> None:
        storage = make_storage(row_width=3)
        keys = _keys(np.arange(300) * 31 - 4000)
        storage.insert_or_assign(keys, _rows_for(keys, 3))
        parts = [storage.export_batch(offset, 97) for offset in range(0, storage.capacity(), 97)]
        got_keys = np.concatenate([p[0] for p in parts])
        got_values = np.concatenate([p[1] for p in parts])
        assert got_keys.dtype == np.int64 and got_values.dtype == np.float32
        assert sorted(got_keys.tolist()) == sorted(keys.tolist())
        np.testing.assert_array_equal(got_values, _rows_for(got_keys, 3))

    def test_export_batch_past_the_last_slot_is_empty(self, storage: Storage) -> None:
        storage.find_or_insert(_keys([1, 2]))
        keys, values, scores = storage.export_batch(storage.capacity(), 100)
        assert keys.size == 0 and values.shape == (0, 4) and scores.size == 0

    def test_export_batch_returns_at_most_limit_rows(self, storage: Storage) -> None:
        storage.find_or_insert(_keys(np.arange(50)))
        counts = [storage.export_batch(offset, 5)[0].size for offset in range(0, storage.capacity(), 5)]
        assert max(counts) <= 5 and sum(counts) == 50

    def test_export_reads_the_column_range(self, storage: Storage) -> None:
        keys = _keys([1, 2, 3])
        storage.insert_or_assign(keys, _rows_for(keys, 4))
        got_keys, got_values, _ = storage.export(columns=(1, 3))
        np.testing.assert_array_equal(got_values, _rows_for(got_keys, 4)[:, 1:3])

    def test_export_skips_erased_rows(self, storage: Storage) -> None:
        storage.find_or_insert(_keys(np.arange(20)))
        storage.erase(_keys(np.arange(0, 20, 2)))
        assert sorted(storage.export()[0].tolist()) == list(range(1, 20, 2))

    # -- size, capacity, clear ------------------------------------------------------------------
    def test_size_counts_distinct_keys(self, storage: Storage) -> None:
        storage.find_or_insert(_keys([1, 2, 2]))
        storage.insert_or_assign(_keys([2, 3, 3]), np.zeros((3, 4), np.float32))
        storage.accum_or_assign(_keys([4, 1]), np.zeros((2, 4), np.float32))
        assert storage.size() == 4

    def test_capacity_holds_the_rows(self, storage: Storage) -> None:
        storage.find_or_insert(_keys(np.arange(1000)))
        assert storage.capacity() >= storage.size() == 1000

    def test_clear_removes_every_row(self, storage: Storage) -> None:
        storage.find_or_insert(_keys(np.arange(100)))
        storage.clear()
        assert storage.size() == 0
        assert storage.export()[0].size == 0
        assert not storage.find(_keys(np.arange(100)))[1].any()

    def test_clear_keeps_the_capacity(self, storage: Storage) -> None:
        storage.find_or_insert(_keys(np.arange(1000)))
        capacity = storage.capacity()
        storage.clear()
        assert storage.capacity() == capacity

    def test_storage_works_after_clear(self, make_storage: MakeStorage) -> None:
        storage = make_storage(row_width=2, initializer=_RANDOM)
        storage.insert_or_assign(_keys([1, 2]), np.ones((2, 2), np.float32))
        storage.clear()
        values, found = storage.find_or_insert(_keys([2, 3]))
        np.testing.assert_array_equal(values, inits.init_rows(_keys([2, 3]), [_RANDOM], 2))
        assert not found.any() and storage.size() == 2
