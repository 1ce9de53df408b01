"""hps.init.reload under traffic: threads look up through a tf.function traced before the reloads
and eagerly while the main thread reloads between two models several times. No lookup fails,
every row is one of the two models' rows, and after the last reload the lookups return the last
model's rows. The databases' setups: the cache alone, a small cache in front of the in-process
hash map, the hash map alone (read in the graph), and a cache in front of RocksDB (shared by the
old and the new server)."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
import types
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
sys.path.insert(0, str(Path(__file__).parent))
import hierarchical_parameter_server as hps  # noqa: E402
import serve_support as support  # noqa: E402
from hierarchical_parameter_server import graph_calls, init, tiers  # noqa: E402
from hierarchical_parameter_server.config import ConfigError  # noqa: E402

ROWS, EXTRA, DIM, THREADS, RELOADS = 2000, 50, 8, 4, 4


@pytest.mark.parametrize("kind", ["cache", "chain", "hash_map", "cache+rocks_db"])
def test_reload_under_traffic_fails_no_lookup(tmp_path, kind):
    model_kw, top = support.tier_setup(kind, tmp_path)
    paths, oracles = [], []
    for version in range(2):
        folder, weights = support.write_table(tmp_path / f"v{version}", ROWS, DIM, seed=10 + version)
        entry = support.model_entry("m", [folder], [DIM], **model_kw)
        paths.append(support.write_config(tmp_path / f"ps{version}.json", support.ps_config([entry], **top)))
        oracles.append(support.oracle(weights, 0.5, EXTRA))
    init.shutdown()
    hps.Init(ps_config_file=paths[0], global_batch_size=256)
    layer = hps.LookupLayer(model_name="m", table_id=0, emb_vec_size=DIM, emb_vec_dtype=tf.float32)
    traced = tf.function(layer)
    traced(tf.constant([[1, 2]], tf.int64))  # traced on the first server
    stop = threading.Event()
    errors: list[BaseException] = []
    counts = [0] * THREADS

    def work(index: int) -> None:
        rng = np.random.default_rng(index)
        step = traced if index % 2 else layer
        while not stop.is_set():
            ids = rng.integers(0, ROWS + EXTRA, size=(32, 4))
            try:
                got = step(tf.constant(ids, tf.int64)).numpy()
                either = (got == oracles[0][ids]).all(axis=-1) | (got == oracles[1][ids]).all(axis=-1)
                assert either.all(), f"rows of neither model for ids {ids[~either]}"
            except BaseException as error:  # noqa: BLE001 -- reported below
                errors.append(error)
                return
            counts[index] += 1

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    try:
        for reload in range(1, RELOADS + 1):
            time.sleep(0.2)
            hps.init.reload(ps_config_file=paths[reload % 2], global_batch_size=256)
        time.sleep(0.2)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "a lookup hung"
    assert not errors, repr(errors[0])
    assert min(counts) > 0
    last = oracles[RELOADS % 2]
    ids = tf.constant(np.arange(ROWS + EXTRA).reshape(-1, 2), tf.int64)
    for step in (traced, layer):
        np.testing.assert_array_equal(step(ids).numpy(), last[ids.numpy()])
    init.shutdown()


def test_reload_with_a_bad_config_keeps_the_old_server(tmp_path):
    folder, weights = support.write_table(tmp_path / "t0", ROWS, DIM)
    entry = support.model_entry("m", [folder], [DIM])
    path = support.write_config(tmp_path / "ps.json", support.ps_config([entry], **support.DISABLED_DBS))
    init.shutdown()
    hps.Init(ps_config_file=path, global_batch_size=16)
    server = init.get_server()
    with pytest.raises(ValueError, match="cannot be read"):
        hps.init.reload(ps_config_file=str(tmp_path / "missing.json"), global_batch_size=16)
    assert init.get_server() is server
    layer = hps.LookupLayer(model_name="m", table_id=0, emb_vec_size=DIM, emb_vec_dtype=tf.float32)
    np.testing.assert_array_equal(layer(tf.constant([3, 1], tf.int64)).numpy(), weights[[3, 1]])
    init.shutdown()


def test_a_fetch_handed_over_to_a_table_of_another_width_fails_clearly(tmp_path):
    """A Python call of a graph traced on the old server that reaches the successor after the
    hand-over is refused when the successor's table has another width (it would return rows the
    graph cannot take)."""
    paths = []
    for version, dim in enumerate((DIM, 2 * DIM)):
        folder, _ = support.write_table(tmp_path / f"v{version}", ROWS, dim)
        entry = support.model_entry("m", [folder], [dim], gpucache=False)
        top = {"volatile_db": {"type": "hash_map", "overflow_margin": 10 * ROWS}}
        paths.append(support.write_config(tmp_path / f"ps{version}.json", support.ps_config([entry], **top)))
    init.shutdown()
    hps.Init(ps_config_file=paths[0], global_batch_size=16)
    old = init.get_server().table("m", 0)
    hps.init.reload(ps_config_file=paths[1], global_batch_size=16)
    with pytest.raises(graph_calls.TracedTableChangedError, match=f"width {DIM}.*width {2 * DIM}"):
        old.fetch(np.array([1, 2], np.int64))
    init.shutdown()


def rocks_versions(tmp_path, sizes=(100, 50), **persistent):
    """(config paths, weights) of model 'm' v0 and v1 (``sizes`` keys each) over the RocksDB
    ``tmp_path/rocks`` (no cache row but those fetched, no volatile DB); ``persistent`` replaces
    keys of v1's persistent_db, and ``update_source`` v1's update_source."""
    paths, weights = [], []
    update_source = persistent.pop("update_source", None)
    for version, rows in enumerate(sizes):
        folder, w = support.write_table(tmp_path / f"v{version}", rows, DIM, seed=20 + version)
        entry = support.model_entry("m", [folder], [DIM], gpucache=False)
        top = {
            "volatile_db": {"type": "disabled"},
            "persistent_db": {"type": "rocks_db", "path": str(tmp_path / "rocks"), **(persistent if version else {})},
        }
        if version and update_source:
            top["update_source"] = update_source
        paths.append(support.write_config(tmp_path / f"ps{version}.json", support.ps_config([entry], **top)))
        weights.append(w)
    return paths, weights


def lookup_m(ids):
    layer = hps.LookupLayer(model_name="m", table_id=0, emb_vec_size=DIM, emb_vec_dtype=tf.float32)
    return layer(tf.constant(ids, tf.int64)).numpy()


def test_a_reload_whose_update_source_cannot_start_writes_no_database(tmp_path):
    """update_source.path is a regular file: the reload fails with a ConfigError naming it before
    any database is written, and the old server serves the old model's rows, all of them."""
    blocker = tmp_path / "not_a_directory"
    blocker.write_text("x")
    source = {"type": "directory", "path": str(blocker), "poll_interval_ms": 50}
    support.require_rocksdict()
    paths, (v0, _) = rocks_versions(tmp_path, update_source=source)
    init.shutdown()
    hps.Init(ps_config_file=paths[0], global_batch_size=16)
    server = init.get_server()
    with pytest.raises(ConfigError, match=f"update_source.path.*{blocker}"):
        hps.init.reload(ps_config_file=paths[1], global_batch_size=16)
    assert init.get_server() is server
    ids = np.array([3, 75, 99], np.int64)
    np.testing.assert_array_equal(lookup_m(ids), v0[ids])
    init.shutdown()


def test_a_reload_failing_after_a_database_write_says_it_left_them_partly_redeployed(tmp_path, monkeypatch, caplog):
    """A database that fails mid-load: the reload raises, the old server serves on, and an error
    says that the shared databases are partly re-deployed."""
    support.require_rocksdict()
    paths, _ = rocks_versions(tmp_path)
    init.shutdown()
    hps.Init(ps_config_file=paths[0], global_batch_size=16)
    server = init.get_server()
    shared = server.persistent_db
    real_insert = shared.insert

    def insert_then_fail(tag, keys, values):
        real_insert(tag, keys[:10], values[:10])
        raise tiers.TierUnavailable("rocks_db went down")

    monkeypatch.setattr(shared, "insert", insert_then_fail)
    with caplog.at_level(logging.ERROR), pytest.raises(tiers.TierUnavailable, match="went down"):
        hps.init.reload(ps_config_file=paths[1], global_batch_size=16)
    assert init.get_server() is server
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("partly re-deployed" in e and str(tmp_path / "rocks") in e for e in errors), errors
    init.shutdown()


def test_a_reload_that_changes_persistent_db_options_shares_the_open_database(tmp_path, caplog):
    """Another num_threads / max_batch_size for the same RocksDB path: the reload shares the open
    database (a second open in the process fails on RocksDB's lock) and warns that those options
    take effect at the next restart; read_only: true is honoured over the shared handle; from a
    read-only database the reload to a writable one opens it for writing."""
    support.require_rocksdict()
    paths, (v0, v1) = rocks_versions(tmp_path, num_threads=2, max_batch_size=7)
    read_only = json.loads(Path(paths[0]).read_text())  # v0 read-only
    read_only["persistent_db"] = {"type": "rocks_db", "path": str(tmp_path / "rocks"), "read_only": True}
    ro_config = support.write_config(tmp_path / "ps_ro.json", read_only)
    init.shutdown()
    hps.Init(ps_config_file=paths[0], global_batch_size=16)
    with caplog.at_level(logging.WARNING):
        hps.init.reload(ps_config_file=paths[1], global_batch_size=16)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("max_batch_size" in w and "num_threads" in w and "restart" in w for w in warnings), warnings
    ids = np.array([3, 49, 75], np.int64)
    want = support.oracle(v1, 0.5, 50)
    np.testing.assert_array_equal(lookup_m(ids), want[ids])
    # v0 read-only: nothing loaded into the database, which keeps v1's rows (v0's key 75 stays absent)
    shared = init.get_server().persistent_db
    hps.init.reload(ps_config_file=ro_config, global_batch_size=16)
    server = init.get_server()
    assert server.persistent_db is shared
    np.testing.assert_array_equal(lookup_m(ids), want[ids])
    tag = server.table("m", 0).tag
    server.apply_update(types.SimpleNamespace(tag=tag, keys=ids[:1], values=np.full((1, DIM), 9.0, np.float32)))
    assert shared.size(tag) == 50
    np.testing.assert_array_equal(shared.fetch(tag, ids[:1], DIM)[0], v1[ids[:1]])
    # writable again: v0's 100 rows are written
    hps.init.reload(ps_config_file=paths[0], global_batch_size=16)
    np.testing.assert_array_equal(lookup_m(ids), v0[ids])
    assert init.get_server().persistent_db.size(tag) == 100
    # a database open read-only (a fresh start) opens again for writing: v1 is written
    init.shutdown()
    hps.Init(ps_config_file=ro_config, global_batch_size=16)
    hps.init.reload(ps_config_file=paths[1], global_batch_size=16)
    np.testing.assert_array_equal(lookup_m(ids), want[ids])
    assert init.get_server().persistent_db.size(tag) == 50
    init.shutdown()
