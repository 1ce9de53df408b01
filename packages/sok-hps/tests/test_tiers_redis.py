"""The Redis tier against a real 3-node cluster on loopback ports (conftest.py starts it).

* Rows sit where the original puts them: hash ``hps_et{<tag>/p<p>}v``, field = the key's 8 bytes,
  value = the row's float32 bytes, ``p`` from the original's partition function.
* A node killed during a fetch loop makes fetches raise TierUnavailable naming the address (no
  other error, no hang); once the node is back (same port and directory, data from its
  append-only file) fetches return every row again.
* Overflow with ``evict_random`` keeps each partition at the margin; other policies are refused.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

redis = pytest.importorskip("redis", reason="redis-py is not installed: pip install 'sok-hps[redis]'")

from hierarchical_parameter_server.tiers.base import TierUnavailable  # noqa: E402
from hierarchical_parameter_server.tiers.partition import partition_of  # noqa: E402
from hierarchical_parameter_server.tiers.redis_cluster import RedisClusterTier, value_hash  # noqa: E402

TAG = "hps_et.model.sparse_embedding0"


def test_layout_is_the_originals(redis_cluster):
    tier = RedisClusterTier(redis_cluster.address, num_partitions=5)
    keys = np.array([3, -1, 2**40], np.int64)
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    tier.insert(TAG + "layout", keys, values)
    client = redis.RedisCluster(host="127.0.0.1", port=redis_cluster.ports[0])
    for key, row, p in zip(keys.tolist(), values, partition_of(keys, 5).tolist()):
        raw = client.hget(f"hps_et{{{TAG}layout/p{p}}}v", np.int64(key).astype("<i8").tobytes())
        assert raw == row.tobytes()
    client.close()
    tier.close()


def test_node_killed_during_fetch_loop_then_back(fresh_redis_cluster):
    cluster = fresh_redis_cluster
    tier = RedisClusterTier(cluster.address, num_partitions=8, socket_timeout_s=2.0)
    keys = np.arange(3000, dtype=np.int64)
    values = np.random.default_rng(0).random((3000, 8), dtype=np.float32)
    tier.insert(TAG, keys, values)

    # The kill comes from another thread, so it can land in the middle of a fetch.
    killer = threading.Timer(0.3, cluster.kill, args=(1,))
    killer.start()
    successes = failures = 0
    deadline = time.monotonic() + 20
    while failures < 20 and time.monotonic() < deadline:
        start = time.monotonic()
        try:
            got, found = tier.fetch(TAG, keys, 8)
        except TierUnavailable as e:  # any other exception fails the test
            assert cluster.address in str(e)
            failures += 1
        else:
            assert found.all()
            np.testing.assert_array_equal(got, values)
            successes += 1
        assert time.monotonic() - start < 10, "a fetch against a dead node must fail fast, not hang"
    killer.join()
    assert successes >= 1 and failures == 20

    cluster.restart(1)
    got, found = tier.fetch(TAG, keys, 8)
    assert found.all()
    np.testing.assert_array_equal(got, values)
    tier.insert(TAG, keys[:10], values[:10] + 1)
    np.testing.assert_array_equal(tier.fetch(TAG, keys[:10], 8)[0], values[:10] + 1)
    tier.close()


def test_unreachable_address_is_unavailable():
    from hierarchical_parameter_server.testing_redis import free_port

    tier = RedisClusterTier(f"127.0.0.1:{free_port()}", socket_timeout_s=1.0)
    with pytest.raises(TierUnavailable, match="cannot be reached"):
        tier.fetch(TAG, np.arange(3), 4)


def test_overflow_evicts_random_rows_down_to_the_target(redis_cluster):
    tag = TAG + "overflow"
    tier = RedisClusterTier(redis_cluster.address, num_partitions=2, overflow_margin=20, overflow_resolution_target=0.5)
    keys = np.arange(100, dtype=np.int64)
    values = np.repeat(keys[:, None], 4, axis=1).astype(np.float32)
    for first in range(0, 100, 10):
        tier.insert(tag, keys[first : first + 10], values[first : first + 10])
    got, found = tier.fetch(tag, keys, 4)
    np.testing.assert_array_equal(got[found], values[found])
    assert 2 * 10 <= found.sum() == tier.size(tag) <= 2 * 20
    tier.close()


def test_other_overflow_policies_are_refused():
    with pytest.raises(ValueError, match="supports overflow_policy 'evict_random' only"):
        RedisClusterTier(overflow_margin=10, overflow_policy="evict_oldest")


@pytest.mark.parametrize("error", [TypeError("'NoneType' object is not subscriptable"), AttributeError("closed")])
def test_errors_of_a_client_reset_under_a_command_are_unavailable(redis_cluster, monkeypatch, error):
    """redis-py raises TypeError / AttributeError when its connections are reset under a command:
    the tier reports TierUnavailable, as for any redis-py error, and drops the client without
    closing it (other threads may be in a command on it)."""
    tier = RedisClusterTier(redis_cluster.address, num_partitions=2)
    tier.insert(TAG + "reset", np.arange(3), np.ones((3, 2), np.float32))
    client = tier._connect()
    closed = []
    monkeypatch.setattr(client, "close", lambda: closed.append(1))

    def broken(*args, **kwargs):
        raise error

    monkeypatch.setattr(client, "pipeline", broken)
    with pytest.raises(TierUnavailable, match=type(error).__name__):
        tier.fetch(TAG + "reset", np.arange(3), 2)
    assert closed == []
    assert tier.fetch(TAG + "reset", np.arange(3), 2)[1].all()  # a new client
    tier.close()


def test_a_node_killed_under_four_threads_of_server_lookups(tmp_path, fresh_redis_cluster):
    """Redis volatile DB, RocksDB persistent DB with every row: 4 threads fetch through the server
    while a node is killed; every fetch returns the right rows (RocksDB's for the keys Redis cannot
    give), none raises."""
    pytest.importorskip("rocksdict", reason="rocksdict is not installed: pip install 'sok-hps[rocksdb]'")
    pytest.importorskip("tensorflow")
    from hierarchical_parameter_server.config import load_config
    from hierarchical_parameter_server.server import ParameterServer

    rows, dim = 2000, 8
    folder = tmp_path / "t0"
    folder.mkdir()
    weights = np.random.default_rng(4).random((rows, dim), dtype=np.float32)
    np.arange(rows, dtype=np.int64).tofile(folder / "key")
    weights.tofile(folder / "emb_vector")
    config = load_config(
        {
            "supportlonglong": True,
            "volatile_db": {"type": "redis_cluster", "address": fresh_redis_cluster.address, "num_partitions": 8},
            "persistent_db": {"type": "rocks_db", "path": str(tmp_path / "rocks")},
            "models": [
                {
                    "model": "killed",
                    "sparse_files": [str(folder)],
                    "embedding_vecsize_per_table": [dim],
                    "maxnum_catfeature_query_per_table_per_sample": [64],
                    "default_value_for_each_table": [0.5],
                    "deployed_device_list": [0],
                    "max_batch_size": 1024,
                    "gpucache": False,
                }
            ],
        }
    )
    server = ParameterServer(config)
    served = server.table("killed", 0)
    stop = threading.Event()
    errors: list[BaseException] = []
    counts = [0] * 4

    def work(index: int) -> None:
        rng = np.random.default_rng(index)
        while not stop.is_set():
            keys = rng.choice(rows, size=200, replace=False).astype(np.int64)
            try:
                got, known = server.fetch_from_databases(served, keys)
                assert known.all()
                np.testing.assert_array_equal(got, weights[keys])
            except BaseException as error:  # noqa: BLE001 -- reported below
                errors.append(error)
                return
            counts[index] += 1

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(4)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.5)
        fresh_redis_cluster.kill(1)
        deadline = time.monotonic() + 4.0
        while time.monotonic() < deadline and not errors:
            time.sleep(0.05)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
        server.close()
    assert not any(thread.is_alive() for thread in threads), "a fetch hung"
    assert not errors, repr(errors[0])
    assert min(counts) > 0


def test_retain_only_clears_what_a_deploy_with_more_partitions_left(redis_cluster):
    """A re-deploy with fewer partitions serves exactly the new rows: the hashes of the old
    partitions past the new count, and rows left in a partition their key no longer maps to,
    are erased."""
    tag = "hps_et.partitions.t0"
    keys = np.arange(200, dtype=np.int64)
    values = np.repeat(keys[:, None], 2, 1).astype(np.float32)
    wide = RedisClusterTier(redis_cluster.address, num_partitions=8, max_batch_size=64)
    narrow = RedisClusterTier(redis_cluster.address, num_partitions=3, max_batch_size=64)
    try:
        wide.insert(tag, keys, values)
        narrow.insert(tag, keys[:100], values[:100])
        client = narrow._connect()
        before = sum(client.hlen(value_hash(tag, p)) for p in range(8))
        assert narrow.retain_only(tag, keys[:100]) == before - 100
        assert narrow.size(tag) == 100 and wide.size(tag) == 100
        assert [p for p in range(8) if client.exists(value_hash(tag, p))] == [0, 1, 2]
        got, found = narrow.fetch(tag, keys, 2)
        np.testing.assert_array_equal(found, keys < 100)
        np.testing.assert_array_equal(got[:100], values[:100])
    finally:
        narrow.retain_only(tag, keys[:0])
        wide.close()
        narrow.close()
