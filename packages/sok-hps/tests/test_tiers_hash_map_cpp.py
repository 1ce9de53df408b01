"""The C++ hash map (``csrc/tiers``) against the Python one, its oracle.

* Its partition function and constants are the Python side's (``partition.py``, ``config.py``).
* The same calls (inserts with repeated keys across chunk boundaries, fetches with repeats) give the
  same rows and found masks, and leave the same keys and access counts in every partition: without
  eviction, and with ``evict_oldest`` and ``evict_least_used``; so also for calls large enough for
  the worker threads of ``parallel``.
* ``evict_random`` keeps every partition at the margin, rows right, and the same survivors for one
  seed (not NumPy's choice: another generator).
* fetch and insert release the GIL; 8 threads inserting and fetching large batches into an evicting
  tier at once read only rows that were written.
"""

from __future__ import annotations

import inspect
import threading
import time

import numpy as np
import pytest
from hierarchical_parameter_server import _tiers
from hierarchical_parameter_server.config import MAX_PARTITIONS, NO_OVERFLOW_LIMIT
from hierarchical_parameter_server.tiers import hash_map_defaults
from hierarchical_parameter_server.tiers.hash_map import HashMapTier
from hierarchical_parameter_server.tiers.hash_map_cpp import CppHashMapTier
from hierarchical_parameter_server.tiers.partition import partition_of

TAG = "hps_et.m.t"


def values_of(keys: np.ndarray, dim: int, version: int = 0) -> np.ndarray:
    """Rows that tell key and write apart."""
    keys = np.asarray(keys, np.float32)[:, None]
    return keys * np.arange(1, dim + 1, dtype=np.float32) + np.float32(version)


def test_constants_are_the_configs():
    assert _tiers.MAX_PARTITIONS == MAX_PARTITIONS
    assert _tiers.NO_OVERFLOW_LIMIT == NO_OVERFLOW_LIMIT


@pytest.mark.parametrize("num_partitions", [1, 7, 1000, MAX_PARTITIONS])
def test_partition_function_is_pythons(num_partitions):
    rng = np.random.default_rng(1)
    keys = np.concatenate([rng.integers(-(2**63), 2**63 - 1, 5000, dtype=np.int64), [0, 1, -1, 2**63 - 1, -(2**63)]])
    np.testing.assert_array_equal(_tiers.partition_of(keys, num_partitions), partition_of(keys, num_partitions))


def assert_same_partitions(cpp: CppHashMapTier, python: HashMapTier) -> None:
    want, got = python.partition_contents(TAG), cpp.partition_contents(TAG)
    assert sorted(got) == sorted(want)
    for p in want:
        np.testing.assert_array_equal(got[p].keys, want[p].keys, err_msg=f"keys of partition {p}")
        np.testing.assert_array_equal(got[p].access_counts, want[p].access_counts, err_msg=f"counts of {p}")


def replay(tiers, steps: int, key_range: int, batch: int, dim: int, seed: int) -> None:
    """Random inserts and fetches (keys repeated within calls) on every tier of ``tiers``; each
    fetch's rows and found mask must be the first tier's."""
    rng = np.random.default_rng(seed)
    for step in range(steps):
        keys = rng.integers(-key_range, key_range, rng.integers(0, batch), dtype=np.int64)
        if rng.random() < 0.5:
            for tier in tiers:
                tier.insert(TAG, keys, values_of(keys, dim, step))
        else:
            want_rows, want_found = tiers[0].fetch(TAG, keys, dim)
            for tier in tiers[1:]:
                rows, found = tier.fetch(TAG, keys, dim)
                np.testing.assert_array_equal(found, want_found, err_msg=f"found at step {step}")
                np.testing.assert_array_equal(rows, want_rows, err_msg=f"rows at step {step}")


@pytest.mark.parametrize("policy", ["evict_oldest", "evict_least_used"])
@pytest.mark.parametrize(("num_partitions", "margin", "batch_size"), [(1, 40, 7), (5, 12, 16), (3, 25, 1000)])
def test_deterministic_policies_leave_pythons_rows(policy, num_partitions, margin, batch_size):
    settings = dict(
        num_partitions=num_partitions,
        parallel=False,
        max_batch_size=batch_size,
        overflow_margin=margin,
        overflow_policy=policy,
        overflow_resolution_target=0.7,
    )
    python, cpp = HashMapTier(**settings), CppHashMapTier(**settings)
    replay([python, cpp], steps=300, key_range=150, batch=60, dim=3, seed=num_partitions)
    assert_same_partitions(cpp, python)
    assert cpp.size(TAG) == python.size(TAG) <= num_partitions * margin
    python.close()
    cpp.close()


def test_without_eviction_the_rows_are_pythons():
    python = HashMapTier(num_partitions=4, parallel=False, max_batch_size=9)
    cpp = CppHashMapTier(num_partitions=4, parallel=False, max_batch_size=9)
    replay([python, cpp], steps=200, key_range=10**6, batch=200, dim=5, seed=3)
    assert cpp.size(TAG) == python.size(TAG)
    python.close()
    cpp.close()


@pytest.mark.parametrize("margin", [NO_OVERFLOW_LIMIT, 900])
def test_calls_on_worker_threads_match_python(margin):
    """Calls of more than PARALLEL_MIN_KEYS keys: the parallel C++ tier works on worker threads."""
    n = 4 * _tiers.PARALLEL_MIN_KEYS
    settings = dict(num_partitions=16, max_batch_size=n // 3, overflow_margin=margin, overflow_policy="evict_oldest")
    python = HashMapTier(parallel=False, **settings)
    cpp = CppHashMapTier(parallel=True, **settings)
    serial = CppHashMapTier(parallel=False, **settings)
    replay([python, cpp, serial], steps=12, key_range=2 * n, batch=2 * n, dim=4, seed=4)
    keys = np.arange(-2 * n, 2 * n, dtype=np.int64)
    want_found = python.fetch(TAG, keys, 4)[1]  # every key once: counted once in each tier
    for tier in (cpp, serial):
        np.testing.assert_array_equal(tier.fetch(TAG, keys, 4)[1], want_found)
    if margin != NO_OVERFLOW_LIMIT:
        assert_same_partitions(cpp, python)
    for tier in (python, cpp, serial):
        tier.close()


def random_tier(seed: int) -> CppHashMapTier:
    return CppHashMapTier(
        num_partitions=3,
        parallel=False,
        max_batch_size=11,
        overflow_margin=20,
        overflow_resolution_target=0.5,
        seed=seed,
    )


def test_evict_random_keeps_written_rows_and_follows_its_seed():
    tiers = [random_tier(7), random_tier(7), random_tier(8)]
    rng = np.random.default_rng(5)
    last: dict[int, int] = {}  # key -> the step that wrote its row last
    for step in range(100):
        keys = rng.integers(0, 400, 30, dtype=np.int64)
        for tier in tiers:
            tier.insert(TAG, keys, values_of(keys, 2, step))
            assert all(len(p.keys) <= 20 for p in tier.partition_contents(TAG).values())
        last.update({k: step for k in keys.tolist()})
    queried = np.array(sorted(last), np.int64)
    for tier in tiers:
        rows, found = tier.fetch(TAG, queried, 2)
        assert 3 * 10 <= found.sum() <= 3 * 20
        want = np.concatenate([values_of([k], 2, last[k]) for k in queried[found].tolist()])
        np.testing.assert_array_equal(rows[found], want)
    same = [t.partition_contents(TAG) for t in tiers]
    assert all(np.array_equal(same[0][p].keys, same[1][p].keys) for p in same[0])
    assert any(not np.array_equal(same[0][p].keys, same[2][p].keys) for p in same[0])


def test_fetch_and_insert_release_the_gil():
    tier = CppHashMapTier(num_partitions=4, parallel=False)
    keys = np.arange(3_000_000, dtype=np.int64)
    rows = np.ones((len(keys), 8), np.float32)
    window: list[float] = []

    def call() -> None:
        window.append(time.perf_counter())
        tier.insert(TAG, keys, rows)
        tier.fetch(TAG, keys, 8)
        window.append(time.perf_counter())

    worker = threading.Thread(target=call)
    ticks = []
    worker.start()
    while worker.is_alive():
        ticks.append(time.perf_counter())
    worker.join()
    start, end = window
    inside = [start] + [t for t in ticks if start < t < end] + [end]
    longest = max(np.diff(inside))
    assert end - start > 0.1, "the calls were too short to tell"
    # Holding the GIL, the calls would stop this loop for as long as the longer of them runs.
    assert longest < (end - start) / 4, f"this thread stood still {longest:.3f} s of the calls' {end - start:.3f} s"
    tier.close()


def test_eight_threads_with_evictions(run_in_threads):
    tier = CppHashMapTier(num_partitions=6, parallel=True, overflow_margin=3000, max_batch_size=5000, seed=2)
    dim = 4

    def work(t: int) -> None:
        rng = np.random.default_rng(t)
        for _ in range(10):
            keys = rng.integers(0, 50_000, 2 * _tiers.PARALLEL_MIN_KEYS, dtype=np.int64)
            tier.insert(TAG, keys, values_of(keys, dim))
            got, found = tier.fetch(TAG, rng.integers(0, 50_000, 5000, dtype=np.int64), dim)
            assert found.any()
            np.testing.assert_array_equal(got[~found], 0)
            np.testing.assert_array_equal(got[found], values_of(got[found][:, 0], dim))

    run_in_threads(8, work)
    assert all(len(p.keys) <= 3000 for p in tier.partition_contents(TAG).values())
    keys = np.arange(50_000, dtype=np.int64)
    got, found = tier.fetch(TAG, keys, dim)
    assert found.sum() == tier.size(TAG)
    np.testing.assert_array_equal(got[found], values_of(keys[found], dim))
    tier.close()


def test_both_tiers_and_the_cpp_options_share_one_set_of_defaults():
    """hash_map_defaults.py is the defaults' one home: the C++ HashMapOptions' (_tiers.DEFAULT_OPTIONS)
    equal it, and so do both tiers' signatures."""
    expected = {
        "num_partitions": hash_map_defaults.NUM_PARTITIONS,
        "parallel": hash_map_defaults.PARALLEL,
        "allocation_rate": hash_map_defaults.ALLOCATION_RATE,
        "max_batch_size": hash_map_defaults.MAX_BATCH_SIZE,
        "overflow_policy": hash_map_defaults.OVERFLOW_POLICY,
        "overflow_resolution_target": hash_map_defaults.OVERFLOW_RESOLUTION_TARGET,
    }
    assert dict(_tiers.DEFAULT_OPTIONS) == expected
    for tier in (HashMapTier, CppHashMapTier):
        parameters = inspect.signature(tier.__init__).parameters
        assert {name: parameters[name].default for name in expected} == expected, tier.__name__
