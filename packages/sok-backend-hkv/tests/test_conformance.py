"""hkv (var_type "hybrid") against the storage conformance suite, and what only hkv does."""

from __future__ import annotations

import numpy as np
import pytest
from sok_backend_hkv.plugin import rounded_capacity
from sparse_operation_kit.plugins import get_registry
from sparse_operation_kit.storage import create_storage
from sparse_operation_kit.testing import StorageConformance, UpdateRowsConformance, update_rows


class TestHkvConformance(StorageConformance):
    @pytest.fixture
    def var_type(self) -> str:
        return "hybrid"


class TestHkvUpdateRows(UpdateRowsConformance):
    @pytest.fixture
    def var_type(self) -> str:
        return "hybrid"


@pytest.mark.parametrize(
    ("policy", "scores"), [("lfu", None), ("lfu", [3, 4, 5]), ("epoch_lfu", None), ("custom", [9, 1, 7])]
)
def test_update_rows_scores_as_insert_or_assign_of_existing_keys(policy, scores):
    """Twin tables: insert_or_assign on one, update_rows on the other, the same scores after."""
    keys = np.array([4, 2, 4])
    twins = [create_storage("hybrid", row_width=2, evict_strategy=policy) for _ in range(2)]
    for table in twins:
        if policy == "epoch_lfu":
            table.set_global_epoch(3)
        table.insert_or_assign(np.arange(6), np.zeros((6, 2)), scores=np.full(6, 10) if policy == "custom" else None)
    values = np.ones((3, 2), np.float32)
    twins[0].insert_or_assign(keys, values, scores=scores)
    assert update_rows(twins[1], keys, values, scores=scores)[2] == 0
    (k0, v0, s0), (k1, v1, s1) = (table.export() for table in twins)
    assert k0.tolist() == k1.tolist() and s0.tolist() == s1.tolist()
    np.testing.assert_array_equal(v0, v1)


def test_update_rows_of_a_custom_policy_needs_scores():
    storage = create_storage("hybrid", row_width=1, evict_strategy="custom")
    storage.insert_or_assign([1], [[1.0]], scores=[1])
    with pytest.raises(ValueError, match="needs a score for every key"):
        update_rows(storage, [1], [[2.0]])


def test_growth_doubles_up_to_max_capacity():
    storage = create_storage("hybrid", row_width=1, init_capacity=128, max_capacity=1024, max_bucket_size=128)
    seen = [storage.capacity()]
    for start in range(0, 4000, 50):
        storage.insert_or_assign(np.arange(start, start + 50), np.zeros((50, 1)))
        if storage.capacity() != seen[-1]:
            seen.append(storage.capacity())
    assert seen == [128, 256, 512, 1024]


def test_eviction_keeps_size_within_max_capacity():
    storage = create_storage("hybrid", row_width=2, init_capacity=128, max_capacity=512, max_bucket_size=128)
    for start in range(0, 5000, 500):
        storage.insert_or_assign(np.arange(start, start + 500), np.ones((500, 2)))
        assert storage.size() <= 512
    assert storage.capacity() == 512
    assert storage.size() == 512  # 5000 keys fill every bucket


def test_bulk_insert_and_evict_accounts_for_every_key():
    """One batch big enough for the parallel path, at max_capacity from the start."""
    storage = create_storage("hybrid", row_width=3, init_capacity=1024, max_capacity=1024, max_bucket_size=128)
    keys = np.arange(30_000) * 7 - 100_000
    rows = np.stack([keys, -keys, keys * 2], axis=1).astype(np.float32)
    evicted, evicted_rows, _ = storage.insert_and_evict(keys, rows)
    stored, stored_rows, _ = storage.export()
    assert storage.size() == 1024 and stored.size == 1024
    assert len(evicted) == keys.size - 1024
    assert sorted(evicted.tolist() + stored.tolist()) == keys.tolist()
    by_key = dict(zip(keys.tolist(), rows, strict=True))
    np.testing.assert_array_equal(evicted_rows, [by_key[k] for k in evicted.tolist()])
    np.testing.assert_array_equal(stored_rows, [by_key[k] for k in stored.tolist()])


@pytest.mark.parametrize(
    ("option", "value", "rounded"),
    [("init_capacity", 1000, 1024), ("max_capacity", 1000, 1024), ("init_capacity", 64, 128), ("max_capacity", 3, 128)],
)
def test_capacities_are_rounded_up_to_powers_of_two_that_fit(option, value, rounded):
    options = {"init_capacity": 128, "max_capacity": 4096, "max_bucket_size": 128, option: value}
    storage = create_storage("hybrid", row_width=1, **options)
    assert storage.adjustments == (f"{option}={value} rounded up to {rounded} (hkv takes powers of two >= "
                                   f"max_bucket_size 128)",)  # fmt: skip
    assert storage.capacity() == (rounded if option == "init_capacity" else 128)


@pytest.mark.parametrize(
    ("value", "bucket", "rounded"),
    [(1000, 128, 1024), (1200, 128, 2048), (64, 128, 128), (1024, 128, 1024), (1, 16, 16), (40, 32, 64),
     (2**62, 128, 2**62), (2**62 + 1, 128, None)],
)  # fmt: skip
def test_rounded_capacity_is_the_next_power_of_two_of_at_least_a_bucket(value, bucket, rounded):
    assert rounded_capacity(value, bucket) == rounded


@pytest.mark.parametrize("bucket", [16, 32, 64, 128])
@pytest.mark.parametrize("value", [1, 100, 1000, 5000])
def test_hkv_table_takes_every_rounded_capacity_and_refuses_the_value_below(value, bucket):
    """The rule of the plugin and hkv_table.cpp's check agree (the table is made without the plugin)."""
    make, rounded = get_registry().factory("hybrid"), rounded_capacity(value, bucket)
    options = {"init_capacity": str(rounded), "max_capacity": str(rounded), "max_bucket_size": str(bucket)}
    assert make("int64", 1, options).capacity() == rounded
    with pytest.raises(ValueError, match=f"init_capacity={rounded - 1} must be a power of two"):
        make("int64", 1, {**options, "init_capacity": str(rounded - 1)})


@pytest.mark.parametrize(
    ("option", "value", "named"),
    [
        ("max_bucket_size", 100, "max_bucket_size=100 is not valid"),
        ("init_capacity", 0, "init_capacity=0 must be a power of two"),
        ("max_capacity", -4, "max_capacity=-4 must be a power of two"),
        ("init_capacity", "lots", "init_capacity='lots' is not an integer"),
    ],
)
def test_capacities_that_cannot_be_served_are_refused(option, value, named):
    options = {"init_capacity": 128, "max_capacity": 4096, "max_bucket_size": 128, option: value}
    with pytest.raises(ValueError, match=named):
        create_storage("hybrid", row_width=1, **options)


def test_init_capacity_above_max_capacity_is_refused():
    with pytest.raises(ValueError, match="init_capacity=2048"):
        create_storage("hybrid", row_width=1, init_capacity=2048, max_capacity=1024)


def test_custom_policy_needs_scores():
    storage = create_storage("hybrid", row_width=1, evict_strategy="custom")
    with pytest.raises(ValueError, match="scores"):
        storage.insert_or_assign([1], [[1.0]])
    assert storage.size() == 0


def test_lfu_adds_caller_scores():
    storage = create_storage("hybrid", row_width=1, evict_strategy="lfu")
    storage.insert_or_assign([1], [[1.0]], scores=[5])
    storage.find_or_insert([1], scores=[3])
    assert storage.export()[2].tolist() == [8]


def test_custom_find_or_insert_of_a_refused_key_reads_its_initial_row():
    storage = create_storage(
        "hybrid",
        row_width=1,
        initializer=4.0,
        evict_strategy="custom",
        init_capacity=128,
        max_capacity=128,
        max_bucket_size=128,
    )
    storage.insert_or_assign(np.arange(128), np.zeros((128, 1)), scores=np.full(128, 10))
    values, found = storage.find_or_insert([1000], scores=[1])
    assert values.tolist() == [[4.0]] and not found[0]
    assert not storage.find([1000])[1][0] and storage.size() == 128


def test_epoch_scores_carry_the_epoch_in_the_high_bits():
    storage = create_storage("hybrid", row_width=1, evict_strategy="epoch_lfu")
    storage.set_global_epoch(7)
    storage.insert_or_assign([1, 1], [[1.0], [2.0]])
    assert storage.export()[2].tolist() == [(7 << 32) | 2]


def test_epoch_over_32_bits_is_refused():
    storage = create_storage("hybrid", row_width=1, evict_strategy="epoch_lru")
    with pytest.raises(ValueError, match=str(2**32)):
        storage.set_global_epoch(2**32)


@pytest.mark.parametrize("spelling", ["kLru", "kLfu", "kEpochLru", "kEpochLfu", "kCustomized", "customized"])
def test_hierarchicalkv_policy_spellings_are_accepted(spelling):
    assert create_storage("hybrid", row_width=1, evict_strategy=spelling).describe()
