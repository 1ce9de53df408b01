"""The storage conformance suite, lookups: ``find`` (missing keys read zeros or the default row; it
neither inserts nor changes scores), ``find_hits`` (present rows written into the caller's ``out`` in
place; an ``out`` it cannot write in place is refused) and ``find_or_insert`` (new rows exactly as
:func:`~sparse_operation_kit.initializers.init_rows` makes them, existing rows unchanged, each key
inserted once, column ranges).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from sparse_operation_kit import initializers as inits
from sparse_operation_kit.storage import Storage
from sparse_operation_kit.testing.conformance.base import (
    _RANDOM,
    ConformanceFixtures,
    MakeStorage,
    _keys,
    _rows_for,
    _sleep_past_clock,
)

__all__ = ["LookupConformance"]


class LookupConformance(ConformanceFixtures):
    """``find``, ``find_hits`` and ``find_or_insert``: a concern of :class:`StorageConformance`, also
    usable alone."""

    # -- find -----------------------------------------------------------------------------------
    def test_find_missing_keys_reads_zeros_and_not_found(self, storage: Storage) -> None:
        values, found = storage.find(_keys([1, 2, 3]))
        np.testing.assert_array_equal(values, np.zeros((3, 4), np.float32))
        np.testing.assert_array_equal(found, [False, False, False])
        assert values.dtype == np.float32 and found.dtype == np.bool_

    def test_find_missing_keys_reads_default_row(self, storage: Storage) -> None:
        default = np.array([1.5, -2.0, 3.25, 4.0], np.float32)
        storage.insert_or_assign(_keys([7]), _rows_for([7], 4))
        values, found = storage.find(_keys([1, 7, 2]), default=default)
        np.testing.assert_array_equal(values, [default, _rows_for([7], 4)[0], default])
        np.testing.assert_array_equal(found, [False, True, False])

    def test_find_default_row_takes_the_column_range(self, storage: Storage) -> None:
        values, _ = storage.find(_keys([1]), columns=(1, 3), default=[8.0, 9.0])
        np.testing.assert_array_equal(values, [[8.0, 9.0]])

    def test_find_returns_stored_rows(self, storage: Storage) -> None:
        keys = _keys([10, 20, 30])
        storage.insert_or_assign(keys, _rows_for(keys, 4))
        values, found = storage.find(_keys([30, 10, 20, 30]))
        np.testing.assert_array_equal(values, _rows_for([30, 10, 20, 30], 4))
        assert found.all()

    def test_find_does_not_insert(self, storage: Storage) -> None:
        storage.find(_keys([1, 2]))
        assert storage.size() == 0
        assert not storage.find(_keys([1, 2]))[1].any()

    def test_find_does_not_change_scores(self, storage: Storage) -> None:
        keys = _keys([1, 2, 3])
        storage.insert_or_assign(keys, _rows_for(keys, 4))
        before = storage.export()
        _sleep_past_clock()
        storage.find(keys)
        after = storage.export()
        np.testing.assert_array_equal(before[0], after[0])
        np.testing.assert_array_equal(before[2], after[2])

    # -- find_hits ------------------------------------------------------------------------------
    def test_find_hits_writes_present_rows_and_leaves_missing_ones(self, storage: Storage) -> None:
        storage.insert_or_assign(_keys([7, 9]), _rows_for([7, 9], 4))
        out = np.full((4, 4), -1.5, np.float32)
        found = storage.find_hits(_keys([1, 7, 2, 9]), out)
        np.testing.assert_array_equal(found, [False, True, False, True])
        np.testing.assert_array_equal(out, [[-1.5] * 4, _rows_for([7], 4)[0], [-1.5] * 4, _rows_for([9], 4)[0]])
        assert found.dtype == np.bool_

    def test_find_hits_agrees_with_find_on_every_key(self, storage: Storage) -> None:
        keys = _keys(np.arange(0, 600, 3))
        storage.insert_or_assign(keys, _rows_for(keys, 4))
        query = _keys(np.r_[np.arange(0, 300), keys[::-1], keys[:5]])  # misses, hits, duplicates
        out = np.full((query.size, 4), 7.25, np.float32)
        found = storage.find_hits(query, out)
        values, expected_found = storage.find(query)
        np.testing.assert_array_equal(found, expected_found)
        np.testing.assert_array_equal(out[found], values[found])
        assert (out[~found] == 7.25).all()

    def test_find_hits_takes_the_column_range(self, storage: Storage) -> None:
        storage.insert_or_assign(_keys([5]), _rows_for([5], 4))
        out = np.zeros((2, 2), np.float32) + 3.0
        found = storage.find_hits(_keys([5, 6]), out, columns=(1, 3))
        np.testing.assert_array_equal(out, [_rows_for([5], 4)[0, 1:3], [3.0, 3.0]])
        np.testing.assert_array_equal(found, [True, False])

    def test_find_hits_does_not_insert_or_change_scores(self, storage: Storage) -> None:
        keys = _keys([1, 2, 3])
        storage.insert_or_assign(keys, _rows_for(keys, 4))
        before = storage.export()
        _sleep_past_clock()
        storage.find_hits(_keys([1, 2, 3, 4]), np.zeros((4, 4), np.float32))
        after = storage.export()
        assert storage.size() == 3
        np.testing.assert_array_equal(before[0], after[0])
        np.testing.assert_array_equal(before[2], after[2])

    def test_find_hits_of_an_empty_batch(self, storage: Storage) -> None:
        found = storage.find_hits(_keys([]), np.zeros((0, 4), np.float32))
        assert found.shape == (0,)

    @pytest.mark.parametrize(
        ("out", "error", "message"),
        [
            (np.zeros((2, 3), np.float32), ValueError, r"shape \(2, 4\)"),
            (np.zeros((2, 4), np.float64), TypeError, "float32"),
            (np.zeros((4, 4), np.float32)[::2], ValueError, "C-contiguous"),
            ([[0.0] * 4] * 2, TypeError, "NumPy"),
        ],
        ids=["shape", "dtype", "strided", "list"],
    )
    def test_find_hits_refuses_an_out_it_cannot_write_in_place(
        self, storage: Storage, out: Any, error: type, message: str
    ) -> None:
        storage.insert_or_assign(_keys([1]), _rows_for([1], 4))
        with pytest.raises(error, match=message):
            storage.find_hits(_keys([1, 2]), out)

    # -- find_or_insert -------------------------------------------------------------------------
    def test_find_or_insert_fills_new_rows_with_constant(self, make_storage: MakeStorage) -> None:
        storage = make_storage(row_width=3, initializer=2.5)
        values, _ = storage.find_or_insert(_keys([4, 5]))
        np.testing.assert_array_equal(values, inits.init_rows(_keys([4, 5]), [inits.constant(2.5)], 3))

    def test_find_or_insert_fills_new_rows_with_uniform_exactly(self, make_storage: MakeStorage) -> None:
        keys = _keys(np.arange(-50, 50) * 7919)
        storage = make_storage(row_width=5, initializer=_RANDOM)
        values, _ = storage.find_or_insert(keys)
        np.testing.assert_array_equal(values, inits.init_rows(keys, [_RANDOM], 5))

    def test_find_or_insert_random_string_is_the_reference_uniform(self, make_storage: MakeStorage) -> None:
        keys = _keys(np.arange(64))
        storage = make_storage(row_width=3, initializer="random", seed=99)
        values, _ = storage.find_or_insert(keys)
        np.testing.assert_array_equal(values, inits.init_rows(keys, [inits.from_string("random", seed=99)], 3))

    @pytest.mark.parametrize(
        "initializer",
        [inits.normal(0.5, 2.0, seed=7), inits.truncated_normal(-1.0, 0.5, seed=8)],
        ids=["normal", "truncated_normal"],
    )
    def test_find_or_insert_fills_new_rows_with_normal(
        self, make_storage: MakeStorage, initializer: inits.Initializer
    ) -> None:
        keys = _keys(np.arange(500) * 104729 - 3)
        storage = make_storage(row_width=4, initializer=initializer)
        values, _ = storage.find_or_insert(keys)
        np.testing.assert_allclose(values, inits.init_rows(keys, [initializer], 4), rtol=1e-5, atol=1e-6)

    def test_truncated_normal_stays_within_two_stddev(self, make_storage: MakeStorage) -> None:
        storage = make_storage(row_width=8, initializer=inits.truncated_normal(1.0, 0.5, seed=3))
        values, _ = storage.find_or_insert(_keys(np.arange(1000)))
        assert values.min() >= 1.0 - 1.0 - 1e-6 and values.max() <= 1.0 + 1.0 + 1e-6

    def test_find_or_insert_initializers_fill_their_columns(self, make_storage: MakeStorage) -> None:
        chosen = [inits.constant(3.0, columns=(0, 2)), inits.uniform(-1, 1, seed=5, columns=(3, 5))]
        storage = make_storage(row_width=6, initializer=chosen)
        keys = _keys([1, 2**40, -9])
        values, _ = storage.find_or_insert(keys)
        expected = inits.init_rows(keys, chosen, 6)
        np.testing.assert_array_equal(values, expected)
        np.testing.assert_array_equal(expected[:, [2, 5]], np.zeros((3, 2)))

    def test_find_or_insert_initializers_argument_overrides(self, make_storage: MakeStorage) -> None:
        storage = make_storage(row_width=2, initializer=1.0)
        values, _ = storage.find_or_insert(_keys([3]), initializers=[inits.constant(-4.0)])
        np.testing.assert_array_equal(values, [[-4.0, -4.0]])

    def test_find_or_insert_new_keys_are_not_found(self, storage: Storage) -> None:
        _, found = storage.find_or_insert(_keys([5, 5, 7, 5]))
        np.testing.assert_array_equal(found, [False, False, False, False])

    def test_find_or_insert_existing_keys_are_found(self, storage: Storage) -> None:
        storage.find_or_insert(_keys([5, 7]))
        _, found = storage.find_or_insert(_keys([5, 8, 8, 7]))
        np.testing.assert_array_equal(found, [True, False, False, True])

    def test_find_or_insert_inserts_each_key_once(self, storage: Storage) -> None:
        storage.find_or_insert(_keys([5, 5, 7, 5]))
        assert storage.size() == 2

    def test_find_or_insert_returns_existing_rows_unchanged(self, make_storage: MakeStorage) -> None:
        storage = make_storage(row_width=4, initializer=_RANDOM)
        keys = _keys([11, 12])
        storage.insert_or_assign(keys, _rows_for(keys, 4))
        values, found = storage.find_or_insert(_keys([12, 11]))
        np.testing.assert_array_equal(values, _rows_for([12, 11], 4))
        assert found.all()

    def test_find_or_insert_duplicates_of_a_new_key_read_the_same_row(self, make_storage: MakeStorage) -> None:
        storage = make_storage(row_width=3, initializer=_RANDOM)
        values, _ = storage.find_or_insert(_keys([9, 4, 9, 9]))
        np.testing.assert_array_equal(values[[0, 2, 3]], np.repeat(values[:1], 3, axis=0))

    def test_find_or_insert_reads_only_the_column_range(self, make_storage: MakeStorage) -> None:
        storage = make_storage(row_width=4, initializer=_RANDOM)
        keys = _keys([1, 2])
        values, _ = storage.find_or_insert(keys, columns=(1, 3))
        np.testing.assert_array_equal(values, inits.init_rows(keys, [_RANDOM], 4)[:, 1:3])
        np.testing.assert_array_equal(storage.find(keys)[0], inits.init_rows(keys, [_RANDOM], 4))
