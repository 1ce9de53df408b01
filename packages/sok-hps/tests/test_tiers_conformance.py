"""Every tier behaves alike: one conformance class, one subclass per tier (hash_map,
parallel_hash_map, a hash map with an overflow_margin, each in Python and in C++, redis_cluster
and rocks_db in Python and in C++), each overriding the ``tier`` fixture.

* Inserted rows come back bit for bit; missing keys come back as zeros with found False; an unknown
  table has no keys.
* Overwrites replace rows (size unchanged); a key repeated in one insert keeps its last row.
* Tables of different dims live side by side; a fetch with another dim is refused.
* Batches longer than ``max_batch_size`` (7 here) are split; empty batches work.
* 8 threads inserting and fetching at once get the right rows (NumPy oracle).
* The tiers whose rows outlive the server (redis_cluster, rocks_db: ``SharedTier``) record a
  table's width (else report a stored row's) and erase the rows of keys a re-deploy lacks.
"""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from hierarchical_parameter_server import _tiers
from hierarchical_parameter_server.tiers.hash_map import HashMapTier
from hierarchical_parameter_server.tiers.hash_map_cpp import CppHashMapTier

BATCH = 7  # the tiers' max_batch_size: small, so that every test crosses chunk boundaries


@pytest.fixture
def tag() -> str:
    return f"hps_et.m{uuid.uuid4().hex[:12]}.sparse_embedding0"


def rows(n: int, dim: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


class TierConformance:
    """Subclasses provide the ``tier`` fixture."""

    def test_round_trip_and_missing_keys(self, tier, tag):
        keys = np.array([5, -3, 0, 2**62, -(2**63), 2**63 - 1, 17, 100_000], np.int64)
        values = rows(len(keys), 8)
        tier.insert(tag, keys, values)
        query = np.array([17, 4, -3, 2**63 - 1, 99, 5, -(2**63), 17, 4], np.int64)  # repeats too
        got, found = tier.fetch(tag, query, 8)
        lookup = dict(zip(keys.tolist(), values))
        want_found = np.array([k in lookup for k in query.tolist()])
        np.testing.assert_array_equal(found, want_found)
        want = np.stack([lookup.get(k, np.zeros(8, np.float32)) for k in query.tolist()])
        np.testing.assert_array_equal(got, want)
        assert got.dtype == np.float32 and got.shape == (len(query), 8)
        assert tier.size(tag) == len(keys)

    def test_unknown_table_has_no_keys(self, tier, tag):
        got, found = tier.fetch(tag, np.arange(5), 3)
        assert not found.any() and got.shape == (5, 3) and not got.any()
        assert tier.size(tag) == 0

    def test_overwrite_keeps_size_and_last_row_wins(self, tier, tag):
        keys = np.arange(20, dtype=np.int64)
        tier.insert(tag, keys, rows(20, 4, seed=1))
        new = rows(10, 4, seed=2)
        tier.insert(tag, keys[5:15], new)
        got, found = tier.fetch(tag, keys, 4)
        want = rows(20, 4, seed=1)
        want[5:15] = new
        assert found.all()
        np.testing.assert_array_equal(got, want)
        assert tier.size(tag) == 20

    def test_repeated_key_in_one_insert_keeps_the_last_row(self, tier, tag):
        keys = np.array([1, 2, 1, 3, 1, 2], np.int64)
        values = rows(6, 4, seed=3)
        tier.insert(tag, keys, values)
        got, found = tier.fetch(tag, np.array([1, 2, 3]), 4)
        assert found.all()
        np.testing.assert_array_equal(got, values[[4, 5, 3]])
        assert tier.size(tag) == 3

    def test_tables_of_different_dims(self, tier, tag):
        other = tag.replace("sparse_embedding0", "sparse_embedding1")
        tier.insert(tag, np.arange(10), rows(10, 4, seed=4))
        tier.insert(other, np.arange(10), rows(10, 16, seed=5))
        np.testing.assert_array_equal(tier.fetch(tag, np.arange(10), 4)[0], rows(10, 4, seed=4))
        np.testing.assert_array_equal(tier.fetch(other, np.arange(10), 16)[0], rows(10, 16, seed=5))
        with pytest.raises(ValueError, match="dim"):
            tier.fetch(tag, np.arange(10), 16)

    def test_long_and_empty_batches(self, tier, tag):
        keys = np.random.default_rng(6).permutation(1000)[: 10 * BATCH + 3].astype(np.int64)
        values = rows(len(keys), 2, seed=7)
        tier.insert(tag, keys, values)
        tier.insert(tag, np.empty(0, np.int64), np.empty((0, 2), np.float32))
        got, found = tier.fetch(tag, keys[::-1], 2)
        assert found.all()
        np.testing.assert_array_equal(got, values[::-1])
        got, found = tier.fetch(tag, np.empty(0, np.int64), 2)
        assert got.shape == (0, 2) and found.shape == (0,)

    def test_uint64_keys_are_their_int64_bits(self, tier, tag):
        keys = np.array([2**64 - 1, 2**63, 1], np.uint64)
        tier.insert(tag, keys, rows(3, 4, seed=8))
        got, found = tier.fetch(tag, keys.view(np.int64), 4)
        assert found.all()
        np.testing.assert_array_equal(got, rows(3, 4, seed=8))

    def test_bad_arguments_are_refused(self, tier, tag):
        with pytest.raises(ValueError, match="values must be"):
            tier.insert(tag, np.arange(3), np.zeros((2, 4), np.float32))
        with pytest.raises(ValueError, match="keys must be a 1-D integer array"):
            tier.insert(tag, np.zeros(3, np.float32), np.zeros((3, 4), np.float32))
        with pytest.raises(ValueError, match="dim must be an integer >= 1"):
            tier.fetch(tag, np.arange(3), 0)

    def test_eight_threads_at_once(self, tier, tag, run_in_threads):
        dim, per_thread, threads = 8, 200, 8
        all_keys = np.random.default_rng(9).permutation(10**6)[: per_thread * threads].astype(np.int64)
        all_rows = rows(len(all_keys), dim, seed=10)

        def work(t: int) -> None:
            mine = slice(t * per_thread, (t + 1) * per_thread)
            for first in range(0, per_thread, 50):
                part = slice(mine.start + first, mine.start + first + 50)
                tier.insert(tag, all_keys[part], all_rows[part])
                got, found = tier.fetch(tag, all_keys[part], dim)
                assert found.all()
                np.testing.assert_array_equal(got, all_rows[part])
            # others' rows: either absent yet or exactly right
            got, found = tier.fetch(tag, all_keys, dim)
            np.testing.assert_array_equal(got[found], all_rows[found])
            assert found[mine].all()

        run_in_threads(threads, work)
        got, found = tier.fetch(tag, all_keys, dim)
        assert found.all()
        np.testing.assert_array_equal(got, all_rows)
        assert tier.size(tag) == len(all_keys)


class SharedTierConformance(TierConformance):
    """Subclasses provide the ``tier`` fixture of a :class:`~.tiers.SharedTier`."""

    def test_is_a_shared_tier(self, tier):
        from hierarchical_parameter_server.tiers import SharedTier

        assert isinstance(tier, SharedTier) and tier.location

    def test_stored_dim_is_recorded_else_a_rows(self, tier, tag):
        assert tier.stored_dim(tag) is None
        tier.insert(tag, np.arange(3), rows(3, 6))
        assert tier.stored_dim(tag) == 6
        tier.set_stored_dim(tag, 5)
        assert tier.stored_dim(tag) == 5

    def test_retain_only_erases_the_other_keys(self, tier, tag):
        keys = np.random.default_rng(11).permutation(10**6)[: 5 * BATCH + 2].astype(np.int64)
        values = rows(len(keys), 3, seed=12)
        tier.insert(tag, keys, values)
        keep = np.concatenate([keys[::3], [-5]])  # and a key the tier lacks
        assert tier.retain_only(tag, keep) == len(keys) - len(keys[::3])
        got, found = tier.fetch(tag, keys, 3)
        np.testing.assert_array_equal(found, np.isin(keys, keep))
        np.testing.assert_array_equal(got[found], values[found])
        assert tier.size(tag) == len(keys[::3])
        assert tier.retain_only(tag + "x", keep) == 0


class TestHashMap(TierConformance):
    @pytest.fixture
    def tier(self):
        tier = HashMapTier(num_partitions=4, parallel=False, max_batch_size=BATCH)
        yield tier
        tier.close()


class TestParallelHashMap(TierConformance):
    @pytest.fixture
    def tier(self):
        tier = HashMapTier(num_partitions=5, parallel=True, max_batch_size=BATCH, allocation_rate=64)
        yield tier
        tier.close()


class TestEvictingHashMap(TierConformance):
    """Partitions (an overflow_margin no test reaches)."""

    @pytest.fixture
    def tier(self):
        tier = HashMapTier(num_partitions=5, parallel=True, max_batch_size=BATCH, overflow_margin=10**6)
        yield tier
        tier.close()


class TestCppHashMap(TierConformance):
    @pytest.fixture
    def tier(self):
        tier = CppHashMapTier(num_partitions=4, parallel=False, max_batch_size=BATCH)
        yield tier
        tier.close()


class TestCppParallelHashMap(TierConformance):
    @pytest.fixture
    def tier(self):
        tier = CppHashMapTier(num_partitions=5, parallel=True, max_batch_size=BATCH, allocation_rate=64)
        yield tier
        tier.close()


class TestCppEvictingHashMap(TierConformance):
    """Partitions that count accesses (an overflow_margin no test reaches)."""

    @pytest.fixture
    def tier(self):
        tier = CppHashMapTier(num_partitions=5, parallel=True, max_batch_size=BATCH, overflow_margin=10**6)
        yield tier
        tier.close()


class TestRedisCluster(SharedTierConformance):
    @pytest.fixture
    def tier(self, redis_cluster):
        from hierarchical_parameter_server.tiers.redis_cluster import RedisClusterTier

        tier = RedisClusterTier(redis_cluster.address, num_partitions=6, max_batch_size=BATCH)
        yield tier
        tier.close()


class TestCppRedisCluster(SharedTierConformance):
    @pytest.fixture
    def tier(self, redis_cluster):
        if not _tiers.WITH_REDIS:
            pytest.skip("sok-hps was built without hiredis (_tiers.WITH_REDIS is False): install libhiredis-dev")
        from hierarchical_parameter_server.tiers.redis_cluster_cpp import CppRedisClusterTier

        tier = CppRedisClusterTier(redis_cluster.address, num_partitions=6, max_batch_size=BATCH)
        yield tier
        tier.close()


class TestRocksDB(SharedTierConformance):
    @pytest.fixture
    def tier(self, tmp_path):
        pytest.importorskip("rocksdict", reason="rocksdict is not installed: pip install 'sok-hps[rocksdb]'")
        from hierarchical_parameter_server.tiers.rocks_db import RocksDBTier

        tier = RocksDBTier(str(tmp_path / "rocksdb"), num_threads=2, max_batch_size=BATCH)
        yield tier
        tier.close()


class TestCppRocksDB(SharedTierConformance):
    @pytest.fixture
    def tier(self, tmp_path):
        if not _tiers.WITH_ROCKSDB:
            pytest.skip("sok-hps was built without RocksDB (no librocksdb-dev): the C++ rocks_db tier is not built")
        from hierarchical_parameter_server.tiers.rocks_db_cpp import CppRocksDBTier

        tier = CppRocksDBTier(str(tmp_path / "rocksdb"), num_threads=2, max_batch_size=BATCH)
        yield tier
        tier.close()


@pytest.mark.parametrize("tier_class", [HashMapTier, CppHashMapTier], ids=["python", "cpp"])
@pytest.mark.parametrize("parallel", [False, True])
def test_closed_hash_map_refuses_calls(tier_class, parallel):
    tier = tier_class(num_partitions=2, parallel=parallel)
    tier.insert("hps_et.m.t", np.arange(3), np.ones((3, 2), np.float32))
    tier.close()
    with pytest.raises(RuntimeError, match="is closed"):
        tier.fetch("hps_et.m.t", np.arange(3), 2)
