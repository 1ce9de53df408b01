"""hps.init.reload under traffic: threads look up through a tf.function traced before the reloads
and eagerly while the main thread reloads between two models several times. No lookup fails,
every row is one of the two models' rows, and after the last reload the lookups return the last
model's rows. The databases' setups: the cache alone, a small cache in front of the in-process
hash map, the hash map alone (read in the graph), and a cache in front of RocksDB (shared by the
old and the new server)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
sys.path.insert(0, str(Path(__file__).parent))
import hierarchical_parameter_server as hps  # noqa: E402
import serve_support as support  # noqa: E402
from hierarchical_parameter_server import graph_calls, init  # noqa: E402

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
