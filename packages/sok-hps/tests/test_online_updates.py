"""Online updates: the server starts the ps_config's update source (a directory) and applies each
update to its databases and to the cache, so a lookup after an update returns the new rows:
for keys the cache holds (the original never updated its cache), keys it does not hold, new keys,
and with the cache as the only store. update_filters choose the databases; an update of a table no
model has is skipped; an update a database refuses is applied again; one the server cannot apply
(a width or key range of its config) is left in place for other servers, with one error line; rows trained with
sok.DynamicVariable arrive through dump_increment."""

from __future__ import annotations

import datetime
import logging
import sys
import time
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
sys.path.insert(0, str(Path(__file__).parent))
import hierarchical_parameter_server as hps  # noqa: E402
import serve_support as support  # noqa: E402
from hierarchical_parameter_server import tiers, updates  # noqa: E402

ROWS, DIM = 2000, 8
TABLE = "sparse_embedding0"


def wait_until(condition, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the update was not applied in time"
        time.sleep(0.02)


@pytest.fixture
def serve(tmp_path):
    """serve(top-level keys, **model overrides) -> (server, weights, update directory) of model 'm'."""
    contexts = []

    def start(top, **overrides):
        folder, weights = support.write_table(tmp_path / "t0", ROWS, DIM, seed=12)
        source = {"type": "directory", "path": str(tmp_path / "updates"), "poll_interval_ms": 20}
        entry = support.model_entry("m", [folder], [DIM], **overrides)
        path = support.write_config(tmp_path / "ps.json", support.ps_config([entry], update_source=source, **top))
        context = support.served(path)
        contexts.append(context)
        return context.__enter__(), weights, source["path"]

    yield start
    for context in contexts:
        context.__exit__(None, None, None)


CHAIN = {
    "volatile_db": {"type": "hash_map", "num_partitions": 4},
    "persistent_db": {"type": "rocks_db"},
}


@pytest.mark.parametrize("tiers", ["chain", "cache-only"])
def test_a_lookup_after_an_update_returns_the_new_rows(serve, tmp_path, tiers):
    top = {**CHAIN, "persistent_db": {"type": "rocks_db", "path": str(tmp_path / "rocks")}}
    server, weights, directory = serve(top if tiers == "chain" else support.DISABLED_DBS, gpucacheper=0.1)
    lookup = hps.LookupLayer(model_name="m", table_id=0, emb_vec_size=DIM, emb_vec_dtype=tf.float32)
    step = tf.function(lambda ids: lookup(ids))
    cached = np.array([1, 2, 3], np.int64)
    np.testing.assert_array_equal(step(tf.constant(cached)).numpy(), weights[cached])  # now in the cache
    keys = np.array([1, 2, 700, ROWS + 5], np.int64)  # cached, cached, not cached, new
    rows = np.random.default_rng(0).random((len(keys), DIM), dtype=np.float32)
    updates.write_update(directory, "m", TABLE, keys, rows)
    ids = tf.constant(keys)
    wait_until(lambda: np.array_equal(step(ids).numpy(), rows))
    np.testing.assert_array_equal(step(tf.constant([3], tf.int64)).numpy(), weights[[3]])  # untouched
    if tiers == "chain":
        tag = server.table("m", 0).tag
        for db in (server.volatile_db, server.persistent_db):
            values, found = db.fetch(tag, keys, DIM)
            assert found.all()
            np.testing.assert_array_equal(values, rows)


def test_update_filters_choose_the_databases(serve, tmp_path):
    top = {
        "volatile_db": {"type": "hash_map"},
        "persistent_db": {"type": "rocks_db", "path": str(tmp_path / "rocks"), "update_filters": ["other_.*"]},
    }
    server, weights, directory = serve(top, gpucache=False)
    keys, rows = np.array([5], np.int64), np.full((1, DIM), 3.0, np.float32)
    updates.write_update(directory, "m", TABLE, keys, rows)
    tag = server.table("m", 0).tag
    wait_until(lambda: np.array_equal(server.volatile_db.fetch(tag, keys, DIM)[0], rows))
    np.testing.assert_array_equal(server.persistent_db.fetch(tag, keys, DIM)[0], weights[keys])


def test_an_update_of_an_unknown_table_is_skipped(serve, caplog):
    server, weights, directory = serve(support.DISABLED_DBS)
    with caplog.at_level(logging.WARNING):
        updates.write_update(directory, "other", TABLE, np.array([1], np.int64), np.ones((1, DIM), np.float32))
        updates.write_update(directory, "m", TABLE, np.array([1], np.int64), np.ones((1, DIM), np.float32))
        lookup = hps.LookupLayer(model_name="m", table_id=0, emb_vec_size=DIM, emb_vec_dtype=tf.float32)
        wait_until(lambda: np.array_equal(lookup(tf.constant([1, 2], tf.int64)).numpy(), [np.ones(DIM), weights[2]]))
    assert "hps_et.other.sparse_embedding0 skipped" in caplog.text


def test_rows_trained_in_sok_arrive_through_dump_increment(serve, tmp_path):
    import sparse_operation_kit as sok

    top = {**CHAIN, "persistent_db": {"type": "rocks_db", "path": str(tmp_path / "rocks")}}
    _, weights, directory = serve(top, gpucacheper=0.1)
    since = datetime.datetime.now(datetime.timezone.utc)
    trained = sok.DynamicVariable(dimension=DIM, var_type="hybrid", initializer="zeros")
    keys = tf.constant([4, 9, ROWS + 1], tf.int64)
    new_rows = tf.constant(np.random.default_rng(1).random((3, DIM), dtype=np.float32))
    sok.assign(trained, keys, new_rows)
    assert updates.dump_increment(directory, "m", [TABLE], [trained], since)
    lookup = hps.LookupLayer(model_name="m", table_id=0, emb_vec_size=DIM, emb_vec_dtype=tf.float32)
    wait_until(lambda: np.array_equal(lookup(keys).numpy(), new_rows.numpy()))


def test_an_update_a_database_refuses_is_applied_again(serve, monkeypatch):
    server, _, directory = serve({"volatile_db": {"type": "hash_map"}}, gpucache=False)
    insert, refused = server.volatile_db.insert, []

    def down_once(*args):
        if not refused:
            refused.append(1)
            raise tiers.TierUnavailable("connection refused (test)")
        insert(*args)

    monkeypatch.setattr(server.volatile_db, "insert", down_once)
    keys, rows = np.array([8], np.int64), np.full((1, DIM), 2.0, np.float32)
    updates.write_update(directory, "m", TABLE, keys, rows)
    tag = server.table("m", 0).tag
    wait_until(lambda: np.array_equal(server.volatile_db.fetch(tag, keys, DIM)[0], rows))
    assert refused


def rejected_lines(caplog, path: str) -> list[str]:
    name = path.rsplit("/", 1)[-1]
    return [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR and name in r.getMessage()]


@pytest.mark.parametrize(
    ("supportlonglong", "bad_keys", "bad_width", "why"),
    [
        (True, [5], DIM + 1, "width"),  # rows one column too wide
        (False, [5, 2**40], DIM, "outside int32"),  # a key int32 ids cannot name
    ],
)
def test_an_update_that_cannot_apply_is_refused_whole_left_in_place_and_later_ones_apply(
    serve, caplog, supportlonglong, bad_keys, bad_width, why
):
    top = {"volatile_db": {"type": "hash_map"}, "supportlonglong": supportlonglong}
    server, weights, directory = serve(top)
    tag = server.table("m", 0).tag
    keys, rows = np.array([6], np.int64), np.full((1, DIM), 4.0, np.float32)
    with caplog.at_level(logging.INFO, logger="hierarchical_parameter_server"):
        bad = updates.write_update(directory, "m", TABLE, np.array(bad_keys), np.ones((len(bad_keys), bad_width)))
        updates.write_update(directory, "m", TABLE, keys, rows)
        wait_until(lambda: np.array_equal(server.volatile_db.fetch(tag, keys, DIM)[0], rows), timeout=5)
        time.sleep(0.2)  # ten more polls: it is not tried again
    (line,) = rejected_lines(caplog, bad)
    assert why in line
    assert Path(bad).exists() and not (Path(directory) / "rejected").exists()  # left for servers that can apply it
    np.testing.assert_array_equal(server.volatile_db.fetch(tag, np.array([5]), DIM)[0], weights[[5]])  # none of it
    served = server.table("m", 0)
    cached, found = served.cache.find(tf.constant([5], served.key_dtype))
    assert bool(found.numpy().all())
    np.testing.assert_array_equal(cached.numpy(), weights[[5]])
