"""The in-process hash map: the original's partition function, partitions, overflow policies; the
tests of partitions and overflow run on the Python tier and the C++ one (``tier_class``).

* ``partition_of`` equals a plain-Python transcription of ``rrxmrrxmsx_0`` (reference §3.3).
* Each key lives in the partition that function names.
* Without an overflow_margin each table is one det storage on the CPU, which the graph reads
  with SokFind (the rows the tier's insert wrote, and its later writes); with one there is none.
* Overflow: no partition holds more than ``overflow_margin`` rows after an insert; eviction goes
  down to ``round(margin x target)`` and removes the rows the policy names (oldest, least used,
  random); surviving rows keep their values and freed rows are reused.
* Partitions are made when their first row arrives: MAX_PARTITIONS partitions cost a small table
  nothing, and the thread pool stays small.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import tensorflow as tf
from hierarchical_parameter_server.config import MAX_PARTITIONS
from hierarchical_parameter_server.tiers.hash_map import HashMapTier
from hierarchical_parameter_server.tiers.hash_map_cpp import CppHashMapTier
from hierarchical_parameter_server.tiers.partition import partition_of
from sparse_operation_kit import tf_ops

TAG = "hps_et.m.t"
MASK = 2**64 - 1


def rrxmrrxmsx_0(key: int) -> int:
    def rotr(x: int, r: int) -> int:
        return ((x >> r) | (x << (64 - r))) & MASK

    x = key & MASK
    x ^= rotr(x, 25) ^ rotr(x, 50)
    x = (x * 0xA24BAED4963EE407) & MASK
    x ^= rotr(x, 24) ^ rotr(x, 49)
    x = (x * 0x9FB21C651E98DF25) & MASK
    return x ^ (x >> 28)


@pytest.mark.parametrize("num_partitions", [1, 3, 8, 16, 1000])
def test_partition_function_matches_the_original(num_partitions):
    rng = np.random.default_rng(0)
    keys = np.concatenate(
        [rng.integers(-(2**63), 2**63 - 1, 500, dtype=np.int64), np.array([0, 1, -1, 2**63 - 1, -(2**63)])]
    )
    want = [rrxmrrxmsx_0(k) % num_partitions for k in keys.tolist()]
    np.testing.assert_array_equal(partition_of(keys, num_partitions), want)
    np.testing.assert_array_equal(partition_of(keys.view(np.uint64), num_partitions), want)


@pytest.fixture(params=[HashMapTier, CppHashMapTier], ids=["python", "cpp"])
def tier_class(request) -> type:
    return request.param


def test_keys_live_in_their_partition(tier_class):
    tier = tier_class(num_partitions=4, parallel=True, overflow_margin=10**6)
    keys = np.arange(-50, 50, dtype=np.int64)
    tier.insert(TAG, keys, np.zeros((100, 2), np.float32))
    partitions = tier.partition_contents(TAG)
    assert sorted(partitions) == [0, 1, 2, 3]
    for p, part in partitions.items():
        assert part.keys.tolist() == sorted(k for k in keys.tolist() if rrxmrrxmsx_0(k) % 4 == p)
    tier.close()


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
def test_without_overflow_margin_the_graph_reads_the_tiers_rows(graph):
    tier = HashMapTier()
    keys = np.array([7, -2, 2**40], np.int64)
    tier.insert(TAG, keys, values_of(keys))
    table = tier.graph_table(TAG, 3)
    assert table.table_device.endswith("CPU:0") and not table.trainable

    def find(query):
        return tf_ops.library().sok_find(*table.table_inputs, query, col_begin=0, col_end=3)

    find = tf.function(find) if graph else find
    query = tf.constant([2**40, 5, 7], tf.int64)
    values, found = find(query)
    np.testing.assert_array_equal(found.numpy(), [True, False, True])
    np.testing.assert_array_equal(values.numpy(), np.stack([values_of([2**40])[0], np.zeros(3), values_of([7])[0]]))
    tier.insert(TAG, np.array([5]), values_of([5]))  # a later write is seen: one copy of the rows
    np.testing.assert_array_equal(find(query)[0].numpy(), values_of([2**40, 5, 7]))
    assert tier.size(TAG) == 4
    with pytest.raises(ValueError, match="dim"):
        tier.graph_table(TAG, 4)
    tier.close()


def test_an_evicting_tier_has_no_graph_table():
    tier = HashMapTier(overflow_margin=100)
    tier.insert(TAG, np.arange(3), values_of(np.arange(3)))
    assert tier.graph_table(TAG, 3) is None
    tier.close()


def one_partition(tier_class: type, policy: str, margin: int = 10, **kw) -> HashMapTier | CppHashMapTier:
    return tier_class(num_partitions=1, parallel=False, overflow_margin=margin, overflow_policy=policy, seed=0, **kw)


def values_of(keys) -> np.ndarray:
    keys = np.asarray(keys, np.float32)
    return np.stack([keys, -keys, keys * 0.5], axis=1)


def present(tier: HashMapTier | CppHashMapTier, keys) -> set[int]:
    keys = np.asarray(keys, np.int64)
    got, found = tier.fetch(TAG, keys, 3)
    np.testing.assert_array_equal(got[found], values_of(keys[found]))
    return set(keys[found].tolist())


def test_evict_oldest_removes_the_least_recently_used_rows(tier_class):
    tier = one_partition(tier_class, "evict_oldest")
    tier.insert(TAG, np.arange(10), values_of(np.arange(10)))
    tier.fetch(TAG, np.arange(5), 3)  # keys 0..4 become the newest
    tier.insert(TAG, [10, 11], values_of([10, 11]))  # 12 > 10 rows: evict down to 8
    assert tier.size(TAG) == 8
    kept = tier.partition_contents(TAG)[0].keys.tolist()
    assert set(range(5)) | {10, 11} <= set(kept)
    assert len(set(kept) & set(range(5, 10))) == 1


def test_evict_least_used_removes_the_rows_fetched_least(tier_class):
    tier = one_partition(tier_class, "evict_least_used")
    tier.insert(TAG, np.arange(10), values_of(np.arange(10)))
    for _ in range(3):
        tier.fetch(TAG, np.arange(6), 3)
    tier.insert(TAG, [10, 11], values_of([10, 11]))
    assert tier.size(TAG) == 8
    part = tier.partition_contents(TAG)[0]
    kept = part.keys.tolist()
    assert set(range(6)) <= set(kept)
    # survivors' counts become (count - smallest) // 2: (3 - 0) // 2 for the keys fetched 3 times
    counts = dict(zip(kept, part.access_counts.tolist()))
    assert all(counts[k] == 1 for k in range(6)) and all(counts[k] == 0 for k in set(kept) - set(range(6)))


def test_evict_random_keeps_the_target_and_correct_rows(tier_class):
    tier = one_partition(tier_class, "evict_random", margin=50, overflow_resolution_target=0.5)
    for first in range(0, 200, 20):
        tier.insert(TAG, np.arange(first, first + 20), values_of(np.arange(first, first + 20)))
        assert tier.size(TAG) <= 50
    kept = present(tier, np.arange(200))
    assert len(kept) == tier.size(TAG) and 25 <= len(kept) <= 50
    # freed rows are reused: the row array never holds more than margin + one chunk's new rows
    assert tier.partition_contents(TAG)[0].rows_allocated <= 50 + 20


def test_every_partition_stays_under_the_margin(tier_class):
    tier = tier_class(num_partitions=4, parallel=True, overflow_margin=5, max_batch_size=8, seed=1)
    keys = np.arange(1000, dtype=np.int64)
    tier.insert(TAG, keys, values_of(keys))
    assert all(len(p.keys) <= 5 for p in tier.partition_contents(TAG).values())
    assert 4 * 4 <= len(present(tier, keys)) <= 4 * 5
    tier.close()


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"num_partitions": 0}, rf"num_partitions must be in \[1, {MAX_PARTITIONS}\], got 0"),
        ({"num_partitions": MAX_PARTITIONS + 1}, rf"num_partitions must be in \[1, {MAX_PARTITIONS}\]"),
        ({"max_batch_size": 0}, "must be >= 1"),
        ({"overflow_margin": -1}, "must be >= 1, got 65536, -1, 268435456"),
        ({"overflow_policy": "evict_newest"}, "evict_newest"),
        ({"overflow_resolution_target": 0.0}, "overflow_resolution_target"),
    ],
)
def test_bad_settings_are_refused(tier_class, kwargs, words):
    with pytest.raises(ValueError, match=words):
        tier_class(**kwargs)


def test_the_largest_num_partitions_costs_a_small_table_nothing(tier_class):
    threads_before = threading.active_count()
    start = time.perf_counter()
    tier = tier_class(num_partitions=MAX_PARTITIONS, parallel=True, overflow_margin=10**6, seed=0)
    keys = np.arange(100, dtype=np.int64)
    tier.insert(TAG, keys, values_of(keys))
    values, found = tier.fetch(TAG, np.arange(200), 3)
    elapsed = time.perf_counter() - start
    np.testing.assert_array_equal(found, np.arange(200) < 100)
    np.testing.assert_array_equal(values[:100], values_of(keys))
    holding = set(partition_of(keys, MAX_PARTITIONS).tolist())
    assert set(tier.partition_contents(TAG)) == holding  # one partition per partition with rows
    assert threading.active_count() - threads_before <= 32  # the pool does not grow with num_partitions
    assert tier.size(TAG) == 100
    tier.close()
    assert elapsed < 2.0, f"{elapsed:.1f} s for 100 rows in {MAX_PARTITIONS} partitions"
