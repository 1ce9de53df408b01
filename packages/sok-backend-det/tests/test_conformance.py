"""det (var_type "hbm") against the storage conformance suite, and what only det does."""

from __future__ import annotations

import numpy as np
import pytest
from sparse_operation_kit.storage import create_storage
from sparse_operation_kit.testing import (
    StorageConformance,
    UpdateRowsConformance,
    assert_same_contents,
    snapshot,
    update_rows,
)


class TestDetConformance(StorageConformance):
    @pytest.fixture
    def var_type(self) -> str:
        return "hbm"


class TestDetUpdateRows(UpdateRowsConformance):
    @pytest.fixture
    def var_type(self) -> str:
        return "hbm"


def test_update_rows_refuses_caller_scores():
    storage = create_storage("hbm", row_width=1)
    storage.insert_or_assign([1], [[1.0]])
    with pytest.raises(ValueError, match="pass no scores"):
        update_rows(storage, [1], [[2.0]], scores=[5])


def test_max_capacity_exceeded_raises_and_leaves_the_table_unchanged():
    storage = create_storage("hbm", row_width=2, max_capacity=10)
    storage.insert_or_assign(np.arange(8), np.ones((8, 2)))
    before = snapshot(storage)
    with pytest.raises(RuntimeError, match="max_capacity=10"):
        storage.find_or_insert(np.array([3, 100, 101, 102]))
    assert_same_contents(snapshot(storage), before)
    assert storage.size() == 8


def test_max_capacity_counts_distinct_new_keys():
    storage = create_storage("hbm", row_width=1, max_capacity=10)
    storage.find_or_insert(np.arange(8))
    storage.insert_or_assign(np.array([0, 1, 8, 8, 9, 9, 9]), np.zeros((7, 1)))  # 2 new keys: fits
    assert storage.size() == 10


def test_max_capacity_refuses_writes_of_every_kind():
    storage = create_storage("hbm", row_width=1, max_capacity=2)
    storage.find_or_insert(np.array([1, 2]))
    for call in (
        lambda: storage.insert_or_assign([3], [[1.0]]),
        lambda: storage.accum_or_assign([3], [[1.0]]),
        lambda: storage.insert_and_evict([3], [[1.0]]),
    ):
        with pytest.raises(RuntimeError, match="max_capacity=2"):
            call()
    assert storage.size() == 2 and not storage.find([3])[1][0]


def test_erased_keys_free_room_under_max_capacity():
    storage = create_storage("hbm", row_width=1, max_capacity=4)
    storage.find_or_insert(np.arange(4))
    storage.erase(np.array([0, 1]))
    storage.find_or_insert(np.array([10, 11]))
    assert storage.size() == 4


@pytest.mark.parametrize(("option", "value"), [("init_capacity", 0), ("max_capacity", -1), ("max_load_factor", 0.95)])
def test_out_of_range_options_are_refused(option, value):
    with pytest.raises(ValueError, match=f"{option}={value}"):
        create_storage("hbm", row_width=1, **{option: value})


def test_capacity_grows_with_the_keys():
    storage = create_storage("hbm", row_width=1, init_capacity=16)
    initial = storage.capacity()
    storage.find_or_insert(np.arange(10 * initial))
    assert storage.capacity() >= 10 * initial
    assert storage.capacity() & (storage.capacity() - 1) == 0  # slots: a power of two


def test_export_in_row_order_follows_erasures_reused_rows_and_clear():
    """export walks det's row arena: erased rows drop out, reused rows come back with their new
    keys, and clear() forgets every row (the oracle: a dict of what was written)."""
    rng = np.random.default_rng(1)
    storage = create_storage("hbm", row_width=3, init_capacity=16)
    expected: dict[int, np.ndarray] = {}
    for step in range(30):
        keys = rng.integers(0, 500, size=int(rng.integers(1, 200)))
        if step == 20:
            storage.clear()
            expected.clear()
        if step % 3 == 2:
            storage.erase(keys)
            for k in keys.tolist():
                expected.pop(k, None)
        else:
            values = rng.standard_normal((keys.size, 3)).astype(np.float32)
            storage.insert_or_assign(keys, values)
            expected.update(zip(keys.tolist(), values))
        got_keys, got_values, _ = storage.export()
        assert sorted(got_keys.tolist()) == sorted(expected)
        for key, row in zip(got_keys.tolist(), got_values):
            np.testing.assert_array_equal(row, expected[key])
