"""Deploys over databases that outlive the server (RocksDB, the shared Redis cluster).

* A corrupt ``sok.dump`` weight file fails Init before any row is written: the databases hold what
  an earlier deploy left there, row for row.
* ``persistent_db.read_only: true`` is served as it is: Init loads the model files into the cache
  and the volatile DB only; the rows the database holds stay (and serve the keys the files lack).
* A re-deploy serves exactly the new model: rows of keys the new model files lack are erased.
* A table whose width in a database differs from the config's is refused, naming the table, the
  database, both widths and the fix; read-only databases too; nothing is written.
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
sys.path.insert(0, str(Path(__file__).parent))
support = pytest.importorskip("serve_support")
support.require_rocksdict()

import hierarchical_parameter_server as hps  # noqa: E402
from hierarchical_parameter_server import init  # noqa: E402
from hierarchical_parameter_server.config import ConfigError  # noqa: E402
from hierarchical_parameter_server.model_files import ModelFileError  # noqa: E402
from hierarchical_parameter_server.tiers.rocks_db import RocksDBTier  # noqa: E402

ROWS, DIM = 300, 4


@pytest.fixture(autouse=True)
def _no_server():
    init.shutdown()
    yield
    init.shutdown()


def deploy(tmp_path, name, folder, dim=DIM, volatile=None, **persistent):
    """hps.Init of model ``name`` (one table, cache of every row) over RocksDB ``tmp_path/rocks``."""
    entry = support.model_entry(name, [folder], [dim])
    top = {
        "volatile_db": volatile or {"type": "disabled"},
        "persistent_db": {"type": "rocks_db", "path": str(tmp_path / "rocks"), **persistent},
    }
    path = support.write_config(tmp_path / f"ps-{uuid.uuid4().hex[:6]}.json", support.ps_config([entry], **top))
    init.shutdown()
    return hps.Init(ps_config_file=path, global_batch_size=16)


def rocks_rows(tmp_path, tag, keys, dim=DIM):
    """``(rows, found, size)`` of ``tag`` in the RocksDB, read with the server shut down."""
    init.shutdown()
    tier = RocksDBTier(str(tmp_path / "rocks"), read_only=True)
    try:
        return (*tier.fetch(tag, keys, dim), tier.size(tag))
    finally:
        tier.close()


def lookup(name, ids, dim=DIM):
    layer = hps.LookupLayer(model_name=name, table_id=0, emb_vec_size=dim, emb_vec_dtype=tf.float32)
    return layer(tf.constant(ids, tf.int64)).numpy()


def sok_checkpoint(path, keys, rows):
    """A sok.dump checkpoint of one table ``dyn_0`` holding ``rows`` for ``keys``."""
    import sparse_operation_kit as sok

    dyn = sok.DynamicVariable(dimension=DIM, var_type="hybrid", name="dyn", initializer="0", init_capacity=1024)
    sok.assign(dyn, tf.constant(keys, dyn.key_type), tf.constant(rows))
    sok.dump(str(path), [dyn])
    return os.path.join(path, "dyn_0")


def test_a_corrupt_checkpoint_leaves_the_databases_as_they_were(tmp_path, redis_cluster):
    from hierarchical_parameter_server.tiers.redis_cluster import RedisClusterTier

    name = f"corrupt_{uuid.uuid4().hex[:8]}"
    volatile = {"type": "redis_cluster", "address": redis_cluster.address, "num_partitions": 8}
    folder, good = support.write_table(tmp_path / "good", ROWS, DIM, seed=1)
    deploy(tmp_path, name, folder, volatile=volatile)
    tag = init.get_server().table(name, 0).tag
    init.shutdown()

    keys = np.arange(ROWS, dtype=np.int64)
    entry = sok_checkpoint(tmp_path / "ck", keys, np.full((ROWS, DIM), 9.0, np.float32))
    weight = tmp_path / "ck" / "dyn_0-weight"
    data = bytearray(weight.read_bytes())
    data[-3] ^= 0x10
    weight.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match="does not match the checkpoint's checksum"):
        deploy(tmp_path, name, entry, volatile=volatile)
    assert not init.is_initialized()

    rows, found, size = rocks_rows(tmp_path, tag, keys)
    assert found.all() and size == ROWS
    np.testing.assert_array_equal(rows, good)
    shared = RedisClusterTier(redis_cluster.address, num_partitions=8)
    rows, found = shared.fetch(tag, keys, DIM)
    assert found.all() and shared.size(tag) == ROWS
    np.testing.assert_array_equal(rows, good)
    shared.close()


def test_a_read_only_persistent_db_is_served_as_it_is(tmp_path):
    name = "ro"
    folder, first = support.write_table(tmp_path / "v1", ROWS, DIM, seed=1)
    deploy(tmp_path, name, folder)
    tag = init.get_server().table(name, 0).tag
    init.shutdown()
    # v2 has half the keys, other rows; the read-only database keeps v1's.
    folder2, second = support.write_table(tmp_path / "v2", ROWS // 2, DIM, seed=2)
    volatile = {"type": "hash_map", "num_partitions": 2}
    deploy(tmp_path, name, folder2, volatile=volatile, read_only=True)
    ids = np.array([0, 7, ROWS // 2 - 1, ROWS // 2, ROWS - 1], np.int64)
    want = np.concatenate([second[ids[:3]], first[ids[3:]]])  # the files' rows, else the database's
    np.testing.assert_array_equal(lookup(name, ids), want)
    np.testing.assert_array_equal(init.get_server().volatile_db.fetch(tag, ids[:3], DIM)[0], second[ids[:3]])
    rows, found, size = rocks_rows(tmp_path, tag, np.arange(ROWS))
    assert found.all() and size == ROWS
    np.testing.assert_array_equal(rows, first)


@pytest.mark.parametrize("with_redis", [False, True], ids=["rocks_db", "redis+rocks_db"])
def test_a_redeploy_serves_exactly_the_new_model(tmp_path, request, with_redis):
    name = f"redeploy_{uuid.uuid4().hex[:8]}"
    volatile = None
    if with_redis:
        cluster = request.getfixturevalue("redis_cluster")
        volatile = {"type": "redis_cluster", "address": cluster.address, "num_partitions": 8}
    folder, _ = support.write_table(tmp_path / "v1", ROWS, DIM, seed=1)
    deploy(tmp_path, name, folder, volatile=volatile)
    folder2, second = support.write_table(tmp_path / "v2", ROWS // 2, DIM, seed=2)
    deploy(tmp_path, name, folder2, volatile=volatile)
    server = init.get_server()
    tag = server.table(name, 0).tag
    ids = np.arange(ROWS, dtype=np.int64)
    np.testing.assert_array_equal(lookup(name, ids), support.oracle(second, 0.5, ROWS - ROWS // 2))
    for db in (server.volatile_db, server.persistent_db):
        if db is not None:
            assert db.size(tag) == ROWS // 2, db.name


@pytest.mark.parametrize("read_only", [False, True])
def test_another_width_in_the_database_is_refused(tmp_path, read_only):
    folder, first = support.write_table(tmp_path / "v1", ROWS, DIM, seed=1)
    deploy(tmp_path, "wide", folder)
    tag = init.get_server().table("wide", 0).tag
    init.shutdown()
    folder2, _ = support.write_table(tmp_path / "v2", ROWS, 2 * DIM, seed=2)
    path = str(tmp_path / "rocks")
    with pytest.raises(ConfigError) as error:
        deploy(tmp_path, "wide", folder2, dim=2 * DIM, read_only=read_only)
    message = str(error.value)
    for words in (tag, path, f"rows of {DIM} floats", f"gives {2 * DIM}", f"embedding_vecsize_per_table to {DIM}"):
        assert words in message
    assert not init.is_initialized()
    rows, found, size = rocks_rows(tmp_path, tag, np.arange(ROWS))
    assert found.all() and size == ROWS
    np.testing.assert_array_equal(rows, first)
