"""The Redis tiers against a real 3-node cluster on loopback ports (conftest.py starts it): the
Python tier (redis-py) and the C++ one (hiredis, ``_tiers.RedisClusterTier``); a test that applies
to both runs on both (the ``tier_class`` fixture).

* Rows sit where the original puts them: hash ``hps_et{<tag>/p<p>}v``, field = the key's 8 bytes,
  value = the row's float32 bytes, ``p`` from the original's partition function; the width in
  ``hps_et{<tag>}dim``. Each tier reads what the other wrote, bit for bit, and sees its erasures.
* Tags with braces (the key slot of the hash tag, as Redis computes it) and with glob characters
  (``retain_only``'s SCAN matches them as they are) work.
* A slot migrated under the tier, half way (``ASK``) and done (``MOVED``), is followed.
* A node killed during a fetch loop makes fetches raise TierUnavailable naming the address (no
  other error, no hang); once the node is back (same port and directory, data from its
  append-only file) fetches return every row again; a node restarted while the tier sat idle is
  served on the next call; a node that answers nothing times out, and serves again once it answers.
* 8 threads at once get the right rows through at most ``num_node_connections`` connections per node.
* A password set on the nodes is needed and enough.
* Overflow with ``evict_random`` evicts each overflowing partition down to the target; other
  policies are refused.
* The C++ tier refuses TLS (saying what to do instead), calls after close and bad settings (with
  the Python messages), and a node gone under a write does not kill a process that keeps SIGPIPE's
  default action.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pytest

redis = pytest.importorskip("redis", reason="redis-py is not installed: pip install 'sok-hps[redis]'")

from hierarchical_parameter_server import _tiers  # noqa: E402
from hierarchical_parameter_server.config import NO_OVERFLOW_LIMIT, ConfigError, VolatileDBConfig, load_config  # noqa: E402
from hierarchical_parameter_server.testing_redis import free_port  # noqa: E402
from hierarchical_parameter_server.tiers import redis_cluster_defaults  # noqa: E402
from hierarchical_parameter_server.tiers.base import TierUnavailable  # noqa: E402
from hierarchical_parameter_server.tiers.partition import partition_of  # noqa: E402
from hierarchical_parameter_server.tiers.redis_cluster import RedisClusterTier, value_hash  # noqa: E402

TAG = "hps_et.model.sparse_embedding0"


def cpp_tier_class():
    """CppRedisClusterTier, or a skip where sok-hps was built without hiredis."""
    if not _tiers.WITH_REDIS:
        pytest.skip("sok-hps was built without hiredis (_tiers.WITH_REDIS is False): install libhiredis-dev")
    from hierarchical_parameter_server.tiers.redis_cluster_cpp import CppRedisClusterTier

    return CppRedisClusterTier


@pytest.fixture(params=["python", "cpp"])
def tier_class(request):
    return RedisClusterTier if request.param == "python" else cpp_tier_class()


@pytest.fixture
def tag() -> str:
    return f"hps_et.m{uuid.uuid4().hex[:12]}.sparse_embedding0"


def cluster_client(cluster) -> redis.RedisCluster:
    return redis.RedisCluster(host="127.0.0.1", port=cluster.ports[0])


def node_clients(cluster) -> list[redis.Redis]:
    """A plain client of each node (not cluster-aware: CLUSTER SETSLOT, INFO, CONFIG SET of that node)."""
    return [redis.Redis(host="127.0.0.1", port=port) for port in cluster.ports]


def test_defaults_have_one_home():
    """redis_cluster_defaults.py holds the defaults of both tiers: the C++ RedisClusterOptions'
    (_tiers.REDIS_CLUSTER_DEFAULT_OPTIONS), and the Python tier's and the C++ wrapper's signatures."""
    cpp = cpp_tier_class()
    expected = {
        "address": redis_cluster_defaults.ADDRESS,
        "user_name": redis_cluster_defaults.USER_NAME,
        "password": redis_cluster_defaults.PASSWORD,
        "num_partitions": redis_cluster_defaults.NUM_PARTITIONS,
        "num_node_connections": redis_cluster_defaults.NUM_NODE_CONNECTIONS,
        "max_batch_size": redis_cluster_defaults.MAX_BATCH_SIZE,
        "enable_tls": False,
        "overflow_margin": NO_OVERFLOW_LIMIT,
        "overflow_policy": redis_cluster_defaults.OVERFLOW_POLICY,
        "overflow_resolution_target": redis_cluster_defaults.OVERFLOW_RESOLUTION_TARGET,
        "socket_timeout_s": redis_cluster_defaults.SOCKET_TIMEOUT_S,
    }
    assert dict(_tiers.REDIS_CLUSTER_DEFAULT_OPTIONS) == expected
    for tier_class in (RedisClusterTier, cpp):
        parameters = inspect.signature(tier_class.__init__).parameters
        assert {name: parameters[name].default for name in expected} == expected, tier_class.__name__


def test_layout_is_the_originals(redis_cluster, tier_class, tag):
    tier = tier_class(redis_cluster.address, num_partitions=5)
    keys = np.array([3, -1, 2**40], np.int64)
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    tier.insert(tag, keys, values)
    tier.set_stored_dim(tag, 4)
    client = cluster_client(redis_cluster)
    for key, row, p in zip(keys.tolist(), values, partition_of(keys, 5).tolist()):
        raw = client.hget(f"hps_et{{{tag}/p{p}}}v", np.int64(key).astype("<i8").tobytes())
        assert raw == row.tobytes()
    assert client.get(f"hps_et{{{tag}}}dim") == b"4"
    client.close()
    tier.close()


@pytest.mark.parametrize("writer", ["python", "cpp"])
def test_each_tier_reads_what_the_other_wrote_bit_for_bit(redis_cluster, tag, writer):
    """Rows of any bit pattern (NaN payloads, -0.0, subnormals, infinities), the recorded width,
    the size and an erasure by retain_only, written by one tier, are what the other reads."""
    tiers = {
        "python": RedisClusterTier(redis_cluster.address, num_partitions=5, max_batch_size=16),
        "cpp": cpp_tier_class()(redis_cluster.address, num_partitions=5, max_batch_size=16),
    }
    write = tiers[writer]
    read = tiers["cpp" if writer == "python" else "python"]
    rng = np.random.default_rng(5)
    drawn = rng.integers(-(2**63), 2**63 - 1, 300)
    keys = rng.permutation(np.unique(np.concatenate([[0, -1, 2**63 - 1, -(2**63)], drawn])))
    bits = rng.integers(0, 2**32, (len(keys), 6), dtype=np.uint32)
    bits[0] = [0x7FC00001, 0xFFFFFFFF, 0x80000000, 0x00000001, 0x7F800000, 0xFF800000]
    write.insert(tag, keys, bits.view(np.float32))
    write.set_stored_dim(tag, 6)

    got, found = read.fetch(tag, np.concatenate([keys, [12345]]), 6)
    assert found[:-1].all() and not found[-1]
    np.testing.assert_array_equal(got[:-1].view(np.uint32), bits)
    assert read.stored_dim(tag) == 6 and read.size(tag) == len(keys)

    assert read.retain_only(tag, keys[:10]) == len(keys) - 10
    assert write.size(tag) == 10
    np.testing.assert_array_equal(write.fetch(tag, keys, 6)[1], np.arange(len(keys)) < 10)
    for tier in tiers.values():
        tier.close()


def test_tags_with_braces_and_glob_characters(redis_cluster, tier_class):
    """Tags whose braces change the hash tag of their hashes (Redis hashes "hps_et.m{x" of
    "hps_et{hps_et.m{x}.t/p0}v", the whole key where the braces enclose nothing) are routed to the
    node that holds them; retain_only of a tag with '*' leaves the tables its pattern would match."""
    unique = uuid.uuid4().hex[:8]
    client = cluster_client(redis_cluster)
    for tag in (f"hps_et.m{unique}{{x}}.t", f"}}hps_et.{unique}", f"hps_et.{unique}}}{{.t"):
        tier = tier_class(redis_cluster.address, num_partitions=4)
        keys = np.arange(20, dtype=np.int64)
        tier.insert(tag, keys, np.repeat(keys[:, None], 3, 1).astype(np.float32))
        got, found = tier.fetch(tag, keys, 3)
        assert found.all() and got[:, 0].tolist() == keys.tolist()
        p = int(partition_of(keys[:1], 4)[0])
        assert client.hget(value_hash(tag, p), keys[:1].tobytes()) == got[0].tobytes()
        tier.close()

    star, other = f"hps_et.{unique}*.t", f"hps_et.{unique}A.t"
    wide = tier_class(redis_cluster.address, num_partitions=4)
    narrow = tier_class(redis_cluster.address, num_partitions=2)
    wide.insert(other, np.arange(40), np.ones((40, 2), np.float32))
    narrow.insert(star, np.arange(40), np.ones((40, 2), np.float32))
    assert narrow.retain_only(star, np.arange(10)) == 30
    assert wide.size(other) == 40 and narrow.size(star) == 10
    client.close()


def test_a_slot_migrated_under_the_tier_ask_then_moved(fresh_redis_cluster, tier_class):
    """The slot of one partition's hash moves to another node while the tier holds its slot map:
    half way (the source answers ASK for the migrated hash) and done (the source answers MOVED);
    fetches and inserts follow it."""
    cluster = fresh_redis_cluster
    tag, dim = "hps_et.moving.t0", 4
    tier = tier_class(cluster.address, num_partitions=4, max_batch_size=16)
    keys = np.arange(400, dtype=np.int64)
    want = np.random.default_rng(2).random((400, dim), dtype=np.float32)
    tier.insert(tag, keys, want)

    nodes = node_clients(cluster)
    name = value_hash(tag, 0)
    slot = nodes[0].execute_command("CLUSTER KEYSLOT", name)
    slots = [nodes[0].execute_command("CLUSTER KEYSLOT", value_hash(tag, p)) for p in range(4)]
    assert slots.count(slot) == 1, "the test moves one hash: its slot must hold no other"
    ids = [node.execute_command("CLUSTER MYID") for node in nodes]
    src = next(i for i, node in enumerate(nodes) if node.execute_command("CLUSTER COUNTKEYSINSLOT", slot) == 1)
    dst = (src + 1) % 3
    nodes[dst].execute_command("CLUSTER SETSLOT", slot, "IMPORTING", ids[src])
    nodes[src].execute_command("CLUSTER SETSLOT", slot, "MIGRATING", ids[dst])
    nodes[src].execute_command("MIGRATE", "127.0.0.1", cluster.ports[dst], "", 0, 5000, "KEYS", name)

    got, found = tier.fetch(tag, keys, dim)
    assert found.all()
    np.testing.assert_array_equal(got, want)
    want[:50] += 1
    tier.insert(tag, keys[:50], want[:50])
    np.testing.assert_array_equal(tier.fetch(tag, keys, dim)[0], want)

    for node in nodes:
        node.execute_command("CLUSTER SETSLOT", slot, "NODE", ids[dst])
    want[50:100] += 2
    tier.insert(tag, keys[50:100], want[50:100])
    got, found = tier.fetch(tag, keys, dim)
    assert found.all()
    np.testing.assert_array_equal(got, want)
    assert nodes[dst].execute_command("CLUSTER COUNTKEYSINSLOT", slot) == 1
    assert nodes[src].execute_command("CLUSTER COUNTKEYSINSLOT", slot) == 0
    for node in nodes:
        node.close()
    tier.close()


def test_node_killed_during_fetch_loop_then_back(fresh_redis_cluster, tier_class):
    cluster = fresh_redis_cluster
    tier = tier_class(cluster.address, num_partitions=8, socket_timeout_s=2.0)
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


def test_node_restarted_while_the_tier_sat_idle(fresh_redis_cluster, tier_class):
    """The tier's connections to a node that restarted since its last call were closed by the
    node: the next call replaces them and succeeds."""
    cluster = fresh_redis_cluster
    tier = tier_class(cluster.address, num_partitions=8)
    keys = np.arange(500, dtype=np.int64)
    values = np.random.default_rng(1).random((500, 4), dtype=np.float32)
    tier.insert(TAG, keys, values)
    for node in range(3):
        cluster.kill(node)
        cluster.restart(node)
    got, found = tier.fetch(TAG, keys, 4)
    assert found.all()
    np.testing.assert_array_equal(got, values)
    tier.close()


def test_a_node_that_stops_answering_times_out_then_serves_again(fresh_redis_cluster, tier_class):
    """A node that keeps its connections but answers nothing (SIGSTOP): a fetch raises
    TierUnavailable naming the address within a few socket timeouts; once the node answers again,
    fetches return every row."""
    cluster = fresh_redis_cluster
    tier = tier_class(cluster.address, num_partitions=8, socket_timeout_s=0.5)
    keys = np.arange(1000, dtype=np.int64)
    values = np.random.default_rng(6).random((1000, 4), dtype=np.float32)
    tier.insert(TAG, keys, values)
    outcome: dict = {}

    def fetch() -> None:
        start = time.monotonic()
        try:
            tier.fetch(TAG, keys, 4)
        except TierUnavailable as error:
            outcome["error"] = error
        outcome["seconds"] = time.monotonic() - start

    cluster.pause(1)
    fetching = threading.Thread(target=fetch, daemon=True)
    fetching.start()
    fetching.join(timeout=10)
    try:
        assert not fetching.is_alive(), "a fetch from a node that answers nothing hung"
        assert outcome["seconds"] < 5 and cluster.address in str(outcome["error"])
    finally:
        cluster.resume(1)
        fetching.join()
    got, found = tier.fetch(TAG, keys, 4)
    assert found.all()
    np.testing.assert_array_equal(got, values)
    tier.close()


def test_unreachable_address_is_unavailable(tier_class):
    address = f"127.0.0.1:{free_port()}"
    tier = tier_class(address, socket_timeout_s=1.0)
    with pytest.raises(TierUnavailable, match="cannot be reached") as raised:
        tier.fetch(TAG, np.arange(3), 4)
    assert address in str(raised.value)


def test_eight_threads_share_at_most_num_node_connections_per_node(fresh_redis_cluster, tier_class, run_in_threads):
    cluster = fresh_redis_cluster
    tier = tier_class(cluster.address, num_partitions=6, num_node_connections=2, max_batch_size=32)
    dim, per_thread = 8, 400
    all_keys = np.random.default_rng(3).permutation(10**6)[: 8 * per_thread].astype(np.int64)
    all_rows = np.random.default_rng(4).random((len(all_keys), dim), dtype=np.float32)

    def work(t: int) -> None:
        for first in range(t * per_thread, (t + 1) * per_thread, 100):
            part = slice(first, first + 100)
            tier.insert(TAG, all_keys[part], all_rows[part])
            got, found = tier.fetch(TAG, all_keys[part], dim)
            assert found.all()
            np.testing.assert_array_equal(got, all_rows[part])
            got, found = tier.fetch(TAG, all_keys, dim)  # others' rows: absent yet or exactly right
            np.testing.assert_array_equal(got[found], all_rows[found])

    run_in_threads(8, work)
    got, found = tier.fetch(TAG, all_keys, dim)
    assert found.all()
    np.testing.assert_array_equal(got, all_rows)
    nodes = node_clients(cluster)
    connections = [node.info("clients")["connected_clients"] - 1 for node in nodes]  # less this client's
    assert all(1 <= count <= 2 for count in connections), connections
    for node in nodes:
        node.close()
    tier.close()


def test_a_password_is_needed_and_enough(fresh_redis_cluster, tier_class):
    cluster = fresh_redis_cluster
    for node in node_clients(cluster):
        node.config_set("requirepass", "s3cret-pw")
        node.close()
    tier = tier_class(cluster.address, user_name="default", password="s3cret-pw", num_partitions=4)
    tier.insert(TAG, np.arange(10), np.ones((10, 2), np.float32))
    assert tier.fetch(TAG, np.arange(11), 2)[1].tolist() == [True] * 10 + [False]
    tier.close()
    for password in ("", "wrong-pw"):
        with pytest.raises(TierUnavailable) as raised:
            tier_class(cluster.address, password=password, num_partitions=4).fetch(TAG, np.arange(3), 2)
        assert cluster.address in str(raised.value) and "s3cret-pw" not in str(raised.value)


def test_overflow_evicts_random_rows_down_to_the_target(redis_cluster, tier_class, tag):
    """Each insert leaves every partition it overflowed (over 20 rows) at round(20 * 0.5) = 10 rows,
    the others as they were, and the survivors' rows right."""
    tier = tier_class(redis_cluster.address, num_partitions=2, overflow_margin=20, overflow_resolution_target=0.5)
    client = cluster_client(redis_cluster)
    keys = np.arange(100, dtype=np.int64)
    values = np.repeat(keys[:, None], 4, axis=1).astype(np.float32)
    parts = partition_of(keys, 2)
    expected = [0, 0]
    for first in range(0, 100, 10):
        tier.insert(tag, keys[first : first + 10], values[first : first + 10])
        for p in range(2):
            expected[p] += int((parts[first : first + 10] == p).sum())
            expected[p] = 10 if expected[p] > 20 else expected[p]
        assert [client.hlen(value_hash(tag, p)) for p in range(2)] == expected
    got, found = tier.fetch(tag, keys, 4)
    np.testing.assert_array_equal(got[found], values[found])
    assert found.sum() == tier.size(tag) == sum(expected)
    client.close()
    tier.close()


def test_other_overflow_policies_are_refused(tier_class):
    with pytest.raises(ValueError, match="supports overflow_policy 'evict_random' only, got 'evict_oldest'"):
        tier_class(overflow_margin=10, overflow_policy="evict_oldest")


def test_from_config(redis_cluster, tier_class):
    cfg = VolatileDBConfig(type="redis_cluster", address=redis_cluster.address, num_partitions=3)
    tier = tier_class.from_config(cfg)
    assert tier.name == "redis_cluster" and tier.location == redis_cluster.address
    tier.insert(TAG + "config", np.arange(3), np.ones((3, 4), np.float32))
    assert tier.fetch(TAG + "config", np.arange(4), 4)[1].tolist() == [True, True, True, False]
    tier.close()


def test_cpp_tier_refuses_tls_saying_what_to_do_instead():
    cpp = cpp_tier_class()
    with pytest.raises(ValueError, match="has no TLS.*hiredis 0.14.*Python tier.*TLS-terminating proxy"):
        cpp(enable_tls=True)
    with pytest.raises(ValueError, match="enable_tls is true"):
        cpp.from_config(VolatileDBConfig(type="redis_cluster", enable_tls=True))


@pytest.mark.parametrize("address", ["127.0.0.1:x", "127.0.0.1:0", "127.0.0.1:65536", ":7000", "", "a:1,,b:2"])
def test_cpp_tier_refuses_an_address_with_the_python_message(address):
    with pytest.raises(ConfigError) as python:
        RedisClusterTier(address)
    with pytest.raises(ValueError) as cpp:
        cpp_tier_class()(address)
    assert str(cpp.value) == str(python.value)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"num_partitions": 0}, "num_partitions must be in \\[1, 16384\\], got 0"),
        ({"max_batch_size": 0}, "must be >= 1, got 5, 0, "),
        ({"num_node_connections": -1}, "num_node_connections, max_batch_size and overflow_margin must be >= 1"),
        ({"overflow_margin": 0}, "overflow_margin must be in \\[1, 2\\*\\*64 - 1\\]"),
        ({"overflow_resolution_target": 1.5}, "overflow_resolution_target must be in \\(0, 1\\], got 1.5"),
        ({"socket_timeout_s": 0.0}, "socket_timeout_s must be a number of seconds > 0, got 0.0"),
    ],
)
def test_cpp_tier_refuses_settings_out_of_range(setting, message):
    with pytest.raises(ValueError, match=message):
        cpp_tier_class()(**setting)


def test_cpp_tier_refuses_calls_after_close(redis_cluster):
    tier = cpp_tier_class()(redis_cluster.address)
    tier.insert(TAG + "closed", np.arange(3), np.ones((3, 2), np.float32))
    tier.close()
    with pytest.raises(RuntimeError, match="is closed"):
        tier.fetch(TAG + "closed", np.arange(3), 2)


_WRITE_TO_A_GONE_NODE = """
import signal, sys
import numpy as np
from hierarchical_parameter_server.tiers.base import TierUnavailable
from hierarchical_parameter_server.tiers.redis_cluster_cpp import CppRedisClusterTier

signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # a C++ server's default: a write to a closed socket kills
tier = CppRedisClusterTier(sys.argv[1], num_partitions=1)
tier.insert("hps_et.pipe.t", np.arange(4), np.ones((4, 4), np.float32))
print("ready", flush=True)
sys.stdin.readline()
try:
    tier.insert("hps_et.pipe.t", np.arange(1 << 16), np.ones((1 << 16, 256), np.float32))  # 64 MiB to send
except TierUnavailable as e:
    print("unavailable:", e, flush=True)
"""


def test_cpp_tier_survives_a_node_gone_under_a_write(fresh_redis_cluster):
    """A process that keeps SIGPIPE's default action (a C++ server) writes 64 MiB on a pooled
    connection whose node is gone: the write fails (TierUnavailable), the process lives on."""
    cpp_tier_class()
    cluster = fresh_redis_cluster
    script = subprocess.Popen(
        [sys.executable, "-c", _WRITE_TO_A_GONE_NODE, cluster.address],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert script.stdout.readline().strip() == "ready", script.stderr.read()
    cluster.stop()
    out, err = script.communicate("go\n", timeout=60)
    assert script.returncode == 0, f"exit status {script.returncode}: {err}"
    assert out.startswith("unavailable:") and cluster.address in out


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


def test_retain_only_clears_what_a_deploy_with_more_partitions_left(redis_cluster, tier_class, tag):
    """A re-deploy with fewer partitions serves exactly the new rows: the hashes of the old
    partitions past the new count, and rows left in a partition their key no longer maps to,
    are erased."""
    keys = np.arange(200, dtype=np.int64)
    values = np.repeat(keys[:, None], 2, 1).astype(np.float32)
    wide = tier_class(redis_cluster.address, num_partitions=8, max_batch_size=64)
    narrow = tier_class(redis_cluster.address, num_partitions=3, max_batch_size=64)
    client = cluster_client(redis_cluster)
    try:
        wide.insert(tag, keys, values)
        narrow.insert(tag, keys[:100], values[:100])
        before = sum(client.hlen(value_hash(tag, p)) for p in range(8))
        assert narrow.retain_only(tag, keys[:100]) == before - 100
        assert narrow.size(tag) == 100 and wide.size(tag) == 100
        assert [p for p in range(8) if client.exists(value_hash(tag, p))] == [0, 1, 2]
        got, found = narrow.fetch(tag, keys, 2)
        np.testing.assert_array_equal(found, keys < 100)
        np.testing.assert_array_equal(got[:100], values[:100])
    finally:
        narrow.retain_only(tag, keys[:0])
        client.close()
        wide.close()
        narrow.close()
