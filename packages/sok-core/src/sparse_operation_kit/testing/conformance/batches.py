"""The storage conformance suite, batch and table sizes: an empty batch is a no-op for every verb,
row widths 1 and 129, growth past the initial capacity (``small_capacity_options``) across
batches and inside one, and batches big enough for a backend's bulk (parallel) paths checked
against a dict of what was written.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from sparse_operation_kit import initializers as inits
from sparse_operation_kit.dtypes import KEY_DTYPES
from sparse_operation_kit.plugins.registry import BackendSpec
from sparse_operation_kit.storage import Storage
from sparse_operation_kit.testing.conformance.base import (
    _RANDOM,
    ConformanceFixtures,
    MakeStorage,
    _keys,
    _rows_for,
    _skip_unless_key_dtype,
)
from sparse_operation_kit.testing.model import assert_same_contents, snapshot

__all__ = ["BatchConformance"]


class BatchConformance(ConformanceFixtures):
    """Empty batches, row widths, growth and large batches: a concern of :class:`StorageConformance`,
    also usable alone."""

    # -- empty batches and row widths -----------------------------------------------------------
    @pytest.mark.parametrize(
        "op", ["find", "find_or_insert", "insert_or_assign", "accum_or_assign", "erase", "insert_and_evict"]
    )
    def test_empty_batches_are_no_ops(self, storage: Storage, op: str) -> None:
        storage.insert_or_assign(_keys([1]), np.ones((1, 4), np.float32))
        before = snapshot(storage)
        empty = _keys([])
        args = (
            (np.zeros((0, 4), np.float32),) if op in ("insert_or_assign", "accum_or_assign", "insert_and_evict") else ()
        )
        result = getattr(storage, op)(empty, *args)
        if op == "erase":
            assert result == 0
        elif op in ("find", "find_or_insert"):
            assert result[0].shape == (0, 4) and result[1].shape == (0,)
        elif op == "insert_and_evict":
            assert [r.shape for r in result] == [(0,), (0, 4), (0,)]
        assert_same_contents(snapshot(storage), before)

    @pytest.mark.parametrize("row_width", [1, 129])
    def test_row_width(self, make_storage: MakeStorage, row_width: int) -> None:
        storage = make_storage(row_width=row_width, initializer=_RANDOM)
        keys = _keys(np.arange(40))
        values, _ = storage.find_or_insert(keys)
        np.testing.assert_array_equal(values, inits.init_rows(keys, [_RANDOM], row_width))
        storage.insert_or_assign(keys[:20], _rows_for(keys[:20], row_width))
        last = (row_width - 1, row_width)
        storage.accum_or_assign(keys[:20], np.ones((20, 1), np.float32), columns=last)
        expected = _rows_for(keys[:20], row_width)
        expected[:, -1] += 1.0
        np.testing.assert_array_equal(storage.find(keys[:20])[0], expected)
        np.testing.assert_array_equal(storage.find(keys[:20], columns=last)[0], expected[:, -1:])

    # -- growth ---------------------------------------------------------------------------------
    def test_growth_past_the_initial_capacity_keeps_every_row(
        self, make_storage: MakeStorage, small_capacity_options: dict[str, Any]
    ) -> None:
        storage = make_storage(row_width=2, **small_capacity_options)
        initial = storage.capacity()
        keys = _keys(np.arange(6000) * 2654435761 % (2**61) - 2**60)
        for batch in np.array_split(keys, 12):
            storage.insert_or_assign(batch, _rows_for(batch, 2))
        assert storage.size() == keys.size
        assert storage.capacity() > initial
        values, found = storage.find(keys)
        assert found.all()
        np.testing.assert_array_equal(values, _rows_for(keys, 2))

    def test_growth_inside_one_batch_keeps_every_row(
        self, make_storage: MakeStorage, small_capacity_options: dict[str, Any]
    ) -> None:
        storage = make_storage(row_width=2, initializer=_RANDOM, **small_capacity_options)
        keys = _keys(np.arange(3000))
        values, found = storage.find_or_insert(keys)
        assert not found.any()
        np.testing.assert_array_equal(values, inits.init_rows(keys, [_RANDOM], 2))
        np.testing.assert_array_equal(storage.find(keys)[0], values)

    @pytest.mark.parametrize("key_dtype", KEY_DTYPES)
    def test_large_batches_match_the_reference(
        self,
        spec: BackendSpec,
        make_storage: MakeStorage,
        key_dtype: str,
        small_capacity_options: dict[str, Any],
        no_eviction_options: dict[str, Any],
    ) -> None:
        """Batches big enough for a backend's bulk (parallel) paths, with many duplicates, while
        the table grows."""
        _skip_unless_key_dtype(spec, key_dtype)
        storage = make_storage(
            row_width=4, key_dtype=key_dtype, initializer=_RANDOM, **{**small_capacity_options, **no_eviction_options}
        )
        rng = np.random.default_rng(2024)

        def draw(size: int) -> np.ndarray:  # ~30000 distinct keys, at the top of the range for uint64
            keys = rng.integers(-15_000, 15_000, size=size)
            return (np.uint64(2**64 - 15_001) - keys.astype(np.uint64) if key_dtype == "uint64" else keys).astype(
                key_dtype
            )

        keys = draw(40_000)
        values, found = storage.find_or_insert(keys)
        assert not found.any()
        np.testing.assert_array_equal(values, inits.init_rows(keys, [_RANDOM], 4))
        expected = dict(zip(keys.tolist(), values, strict=True))

        written = draw(40_000)
        rows = rng.integers(-50, 50, size=(written.size, 4)).astype(np.float32)
        storage.insert_or_assign(written, rows)
        expected.update(zip(written.tolist(), rows, strict=True))  # in batch order: the last duplicate wins

        added = written[rng.integers(0, written.size, size=30_000)]
        storage.accum_or_assign(added, np.ones((added.size, 4), np.float32))
        unique, counts = np.unique(added, return_counts=True)
        for key, count in zip(unique.tolist(), counts, strict=True):
            expected[key] = expected[key] + np.float32(count)  # integer rows: the sums are exact

        model_keys = np.array(sorted(expected), dtype=key_dtype)
        assert storage.size() == model_keys.size
        assert_same_contents(snapshot(storage), (model_keys, np.array([expected[k] for k in model_keys.tolist()])))
