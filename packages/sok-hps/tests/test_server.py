"""The parameter server's tiers, alone and chained, give the rows of tf.nn.embedding_lookup(_sparse).

* Each tier alone: the volatile hash map (gpucache off; read in the graph, and with an
  overflow_margin through Python), RocksDB (gpucache off), the cache alone (no database,
  gpucacheper 1.0); the hash map in front of RocksDB (gpucache off); and the chain cache
  (gpucacheper 0.01) -> hash map -> RocksDB at hit_rate_threshold 1.0: exact, defaults for keys no
  tier has, over batches that make the small cache evict.
* gpucache off, hash map without overflow_margin: the keys it holds never reach Python; only the
  distinct keys it lacks are fetched from the databases (RocksDB's row, else the default).
* hit_rate_threshold 0: misses get the default in their batch, the true rows once the
  background fill is done.
* A database that cannot be reached is skipped with a warning; it is used again when it answers.
* cache_missed_embeddings copies rows found in the persistent database back to the volatile one.
* The cache's capacity and its pre-fill (cache_refresh_percentage_per_iteration).
"""

from __future__ import annotations

import logging
import sys
import types
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
sys.path.insert(0, str(Path(__file__).parent))
import hierarchical_parameter_server as hps  # noqa: E402
import serve_support as support  # noqa: E402
from hierarchical_parameter_server import tiers  # noqa: E402
from hierarchical_parameter_server.cache import capacity_of  # noqa: E402
from hierarchical_parameter_server.config import load_config  # noqa: E402
from hierarchical_parameter_server.server import ParameterServer  # noqa: E402

ROWS, EXTRA, DIM = 4000, 50, 8


@pytest.fixture
def serve(tmp_path):
    """serve(kind, volatile={...}, persistent=True, **model overrides) -> (server, oracle) of one
    model 'm' of one table; ``volatile`` adds keys to the volatile_db, ``persistent=False``
    disables the persistent_db."""

    def start(kind, volatile=None, persistent=True, **overrides):
        folder, weights = support.write_table(tmp_path / "t0", ROWS, DIM, seed=4)
        model_kw, top = support.tier_setup(kind, tmp_path)
        if volatile:
            top = {**top, "volatile_db": {**top["volatile_db"], **volatile}}
        if not persistent:
            top = {**top, "persistent_db": {"type": "disabled"}}
        entry = support.model_entry("m", [folder], [DIM], **{**model_kw, **overrides})
        path = support.write_config(tmp_path / "ps.json", support.ps_config([entry], **top))
        context = support.served(path)
        server = context.__enter__()
        contexts.append(context)
        return server, support.oracle(weights, 0.5, EXTRA)

    contexts = []
    yield start
    for context in contexts:
        context.__exit__(None, None, None)


@pytest.mark.parametrize(
    "kind",
    [
        "hash_map",
        "parallel_hash_map",
        "evicting_hash_map",
        "hash_map+rocks_db",
        "rocks_db",
        "no_cache+rocks_db",
        "cache",
        "chain",
        "cache+rocks_db",
    ],
)
def test_tiers_alone_and_chained_are_exact(serve, kind):
    _, oracle = serve(kind)
    lookup = hps.LookupLayer(model_name="m", table_id=0, emb_vec_size=DIM, emb_vec_dtype=tf.float32)
    sparse = hps.SparseLookupLayer(model_name="m", table_id=0, emb_vec_size=DIM, emb_vec_dtype=tf.float32)
    step = tf.function(lambda ids: lookup(ids))
    rng = np.random.default_rng(1)
    for _ in range(4):  # the 0.01 cache holds 128 rows: each batch misses and evicts
        ids = tf.constant(rng.integers(0, ROWS + EXTRA, size=(256, 4)), tf.int64)
        np.testing.assert_array_equal(step(ids).numpy(), tf.nn.embedding_lookup(oracle, ids).numpy())
        ragged = tf.RaggedTensor.from_tensor(ids)
        for combiner in ("sum", "mean", "sqrtn"):
            want = tf.nn.embedding_lookup_sparse(oracle, ragged, None, combiner=combiner)
            np.testing.assert_array_equal(sparse(ragged, None, combiner=combiner).numpy(), want.numpy())


@pytest.mark.parametrize("overrides", [{"gpucache": False}, {"gpucacheper": 0.0}], ids=["gpucache", "gpucacheper"])
def test_no_cache_sends_every_lookup_to_the_databases(serve, overrides):
    server, _ = serve("hash_map+rocks_db", **overrides)
    assert server.table("m", 0).cache is None


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
def test_hash_map_in_the_graph_fetches_only_the_keys_it_lacks(serve, monkeypatch, graph):
    server, oracle = serve("hash_map+rocks_db")
    table = server.table("m", 0)
    only_rocks = np.array([ROWS + 1], np.int64)
    server.persistent_db.insert(table.tag, only_rocks, np.full((1, DIM), 3.0, np.float32))
    oracle[ROWS + 1] = 3.0
    fetched = []
    fetch = server.fetch_from_databases
    monkeypatch.setattr(
        server, "fetch_from_databases", lambda served, keys: (fetched.append(keys), fetch(served, keys))[1]
    )
    layer = hps.LookupLayer(model_name="m", table_id=0, emb_vec_size=DIM, emb_vec_dtype=tf.float32)
    lookup = tf.function(layer) if graph else layer
    held = tf.constant([[3, 9], [3, ROWS - 1]], tf.int64)
    np.testing.assert_array_equal(lookup(held).numpy(), tf.nn.embedding_lookup(oracle, held).numpy())
    assert fetched == []
    mixed = tf.constant([[ROWS + 1, 9], [ROWS + 2, ROWS + 1]], tf.int64)
    np.testing.assert_array_equal(lookup(mixed).numpy(), tf.nn.embedding_lookup(oracle, mixed).numpy())
    assert [sorted(k.tolist()) for k in fetched] == [[ROWS + 1, ROWS + 2]]


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
def test_hit_rate_threshold_zero_serves_defaults_then_the_rows(serve, graph):
    server, oracle = serve("chain", hit_rate_threshold=0.0)
    layer = hps.LookupLayer(model_name="m", table_id=0, emb_vec_size=DIM, emb_vec_dtype=tf.float32)
    lookup = tf.function(layer) if graph else layer
    ids = tf.constant([5, 17, 3000, 17], tf.int64)
    np.testing.assert_array_equal(lookup(ids).numpy(), np.full((4, DIM), 0.5, np.float32))
    server.wait_for_background_work()
    np.testing.assert_array_equal(lookup(ids).numpy(), tf.nn.embedding_lookup(oracle, ids).numpy())


def test_hit_rate_below_the_threshold_is_exact(serve):
    server, oracle = serve("chain", hit_rate_threshold=0.5)
    lookup = hps.LookupLayer(model_name="m", table_id=0, emb_vec_size=DIM, emb_vec_dtype=tf.float32)
    ids = tf.constant([7, 8, 9, 10], tf.int64)  # none cached: hit rate 0 < 0.5, fetched now
    np.testing.assert_array_equal(lookup(ids).numpy(), tf.nn.embedding_lookup(oracle, ids).numpy())
    assert server.table("m", 0).cache.size() == 4


def test_an_unreachable_database_is_skipped_with_a_warning_and_used_again(serve, monkeypatch, caplog):
    server, oracle = serve("chain")
    volatile = server.volatile_db
    lookup = hps.LookupLayer(model_name="m", table_id=0, emb_vec_size=DIM, emb_vec_dtype=tf.float32)
    calls = []

    def down(tag, keys, dim):
        calls.append(len(keys))
        raise tiers.TierUnavailable("connection refused (test)")

    ids = tf.constant([[1, 2], [3, ROWS + 1]], tf.int64)
    with monkeypatch.context() as patch, caplog.at_level(logging.WARNING):
        patch.setattr(volatile, "fetch", down)
        np.testing.assert_array_equal(lookup(ids).numpy(), tf.nn.embedding_lookup(oracle, ids).numpy())  # RocksDB
    assert calls and "is unavailable" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        more = tf.constant([100, 200], tf.int64)
        np.testing.assert_array_equal(lookup(more).numpy(), tf.nn.embedding_lookup(oracle, more).numpy())
    assert "answers again" in caplog.text


@pytest.mark.parametrize("copy_back", [False, True])
def test_cache_missed_embeddings_copies_persistent_rows_back(serve, copy_back):
    server, _ = serve("chain", volatile={"cache_missed_embeddings": copy_back})
    table = server.table("m", 0)
    key, row = np.array([ROWS + 3], np.int64), np.full((1, DIM), 7.0, np.float32)
    server.persistent_db.insert(table.tag, key, row)  # a row only RocksDB has
    np.testing.assert_array_equal(table.fetch(key), row)
    server.wait_for_background_work()
    values, found = server.volatile_db.fetch(table.tag, key, DIM)
    assert bool(found[0]) == copy_back
    if copy_back:
        np.testing.assert_array_equal(values, row)


def test_cache_capacity_and_prefill(serve):
    server, oracle = serve("chain", gpucacheper=0.1, cache_refresh_percentage_per_iteration=0.2)
    cache = server.table("m", 0).cache
    assert cache.capacity == capacity_of(ROWS, 0.1) == 512
    # The first 512 rows of the file went in; a full bucket keeps only some of its keys (as the
    # original's set-associative cache, whose sets conflict at gpucacheper 1.0 too).
    values, found = cache.find(tf.constant(np.arange(512), tf.int64))
    found = found.numpy()
    assert 0.9 * 512 <= found.sum() == cache.size() <= 512
    np.testing.assert_array_equal(values.numpy()[found], oracle[:512][found])


def test_a_cache_of_every_row_in_front_of_databases_starts_warm(serve, monkeypatch):
    """gpucacheper 1.0 with databases behind: a det cache loaded with every row at start (the
    original's started cold), so lookups of the model's keys never reach the databases."""
    server, oracle = serve("chain", gpucacheper=1.0)
    served = server.table("m", 0)
    assert not served.cache.evicting and served.cache.size() == ROWS
    fetched = []
    monkeypatch.setattr(server.volatile_db, "fetch", lambda *a: fetched.append(a) or pytest.fail("no fetch"))
    lookup = hps.LookupLayer(model_name="m", table_id=0, emb_vec_size=DIM, emb_vec_dtype=tf.float32)
    ids = tf.constant(np.arange(0, ROWS, 7), tf.int64)
    np.testing.assert_array_equal(lookup(ids).numpy(), tf.nn.embedding_lookup(oracle, ids).numpy())
    assert fetched == []


@pytest.mark.parametrize(
    ("kind", "overrides", "persistent", "answers_all"),
    [
        ("cache", {}, True, True),  # no database
        ("chain", {"gpucacheper": 1.0}, False, True),  # this process's hash map behind
        ("chain", {"gpucacheper": 1.0}, True, False),  # RocksDB may hold rows the model files lack
        ("chain", {}, False, False),  # an evicting cache
    ],
)
def test_a_cache_that_answers_every_lookup_is_one_find_in_the_graph(serve, kind, overrides, persistent, answers_all):
    """A cache of every row with no database that could hold more (none, or the in-process hash
    map, which takes the same loads and updates) serves a lookup with one ``SokFindOrDefault``: no
    test for misses, no ``SokPyCall``; the default value for unknown keys, updates seen."""
    server, oracle = serve(kind, persistent=persistent, **overrides)
    served = server.table("m", 0)
    assert served.cache_answers_all is answers_all
    lookup = hps.LookupLayer(model_name="m", table_id=0, emb_vec_size=DIM, emb_vec_dtype=tf.float32)
    step = tf.function(lambda ids: lookup(ids))
    graph = step.get_concrete_function(tf.TensorSpec([None, 3], tf.int64)).graph
    ops = {op.type for op in graph.get_operations()}
    assert ("SokFindOrDefault" in ops) is answers_all
    assert answers_all is not bool(ops & {"If", "StatelessIf", "SokPyCall"})
    assert "EagerPyFunc" not in ops  # a SavedModel can keep the graph
    ids = tf.constant([[1, ROWS + 3, ROWS - 1], [ROWS + EXTRA - 1, 0, 7]], tf.int64)
    np.testing.assert_array_equal(step(ids).numpy(), tf.nn.embedding_lookup(oracle, ids).numpy())
    update = types.SimpleNamespace(tag=served.tag, keys=np.array([7, ROWS + 3]), values=np.full((2, DIM), 9.0))
    server.apply_update(update)
    oracle[[7, ROWS + 3]] = 9.0
    np.testing.assert_array_equal(step(ids).numpy(), tf.nn.embedding_lookup(oracle, ids).numpy())


def test_no_prefill_by_default(serve):
    server, _ = serve("chain")
    assert server.table("m", 0).cache.size() == 0


# -- Redis: the tier alone, the chain, and a node killed during a lookup loop --------------------
def redis_served(tmp_path, address, name, **overrides):
    """HPS of model ``name`` (a tag of its own in the shared cluster) with Redis as volatile DB."""
    folder, weights = support.write_table(tmp_path / name, ROWS, DIM, seed=8)
    entry = support.model_entry(name, [folder], [DIM], **overrides)
    top = {
        "volatile_db": {"type": "redis_cluster", "address": address, "num_partitions": 6},
        "persistent_db": {"type": "rocks_db", "path": str(tmp_path / f"rocks-{name}")}
        if overrides.get("gpucache", True)
        else {"type": "disabled"},
    }
    path = support.write_config(tmp_path / f"{name}.json", support.ps_config([entry], **top))
    return support.served(path), support.oracle(weights, 0.5, EXTRA)


@pytest.mark.parametrize("kind", ["redis", "chain-redis"])
def test_redis_alone_and_chained_are_exact(tmp_path, redis_cluster, kind):
    name = f"serve_{kind.replace('-', '_')}"
    overrides = {"gpucache": False} if kind == "redis" else {"gpucacheper": 0.01}
    context, oracle = redis_served(tmp_path, redis_cluster.address, name, **overrides)
    with context:
        lookup = hps.LookupLayer(model_name=name, table_id=0, emb_vec_size=DIM, emb_vec_dtype=tf.float32)
        rng = np.random.default_rng(2)
        for _ in range(3):
            ids = tf.constant(rng.integers(0, ROWS + EXTRA, size=(128, 4)), tf.int64)
            np.testing.assert_array_equal(lookup(ids).numpy(), tf.nn.embedding_lookup(oracle, ids).numpy())


def test_a_redis_node_killed_during_lookups(tmp_path, fresh_redis_cluster, caplog):
    """The lookups go on from RocksDB with a warning while a node is down, nothing crashes, and they
    use Redis again once it is back."""
    context, oracle = redis_served(tmp_path, fresh_redis_cluster.address, "faulty", gpucacheper=0.01)
    rng = np.random.default_rng(3)
    with context as server, caplog.at_level(logging.WARNING):
        lookup = hps.LookupLayer(model_name="faulty", table_id=0, emb_vec_size=DIM, emb_vec_dtype=tf.float32)
        step = tf.function(lambda ids: lookup(ids))
        redis_calls = []
        fetch = server.volatile_db.fetch
        server.volatile_db.fetch = lambda *a: (redis_calls.append(1), fetch(*a))[1]  # counts Redis lookups

        def check():
            ids = tf.constant(rng.integers(0, ROWS + EXTRA, size=(64, 4)), tf.int64)
            np.testing.assert_array_equal(step(ids).numpy(), tf.nn.embedding_lookup(oracle, ids).numpy())

        for i in range(12):
            if i == 3:
                fresh_redis_cluster.kill(1)
            if i == 8:
                fresh_redis_cluster.restart(1)
                caplog.clear()
            check()
            if i == 7:
                assert "is unavailable" in caplog.text
        assert "answers again" in caplog.text
        # Back to normal: Redis serves the misses again (no new warning).
        caplog.clear()
        before = len(redis_calls)
        check()
        assert len(redis_calls) > before and "unavailable" not in caplog.text


@pytest.mark.parametrize("cache_type", ["static", "uvm"])
def test_static_and_uvm_caches_hold_every_row(serve, cache_type):
    server, oracle = serve("chain", embedding_cache_type=cache_type)
    cache = server.table("m", 0).cache
    assert not cache.evicting and cache.size() == ROWS
    lookup = hps.LookupLayer(model_name="m", table_id=0, emb_vec_size=DIM, emb_vec_dtype=tf.float32)
    ids = tf.constant(np.arange(0, ROWS + EXTRA, 7), tf.int64)
    np.testing.assert_array_equal(lookup(ids).numpy(), tf.nn.embedding_lookup(oracle, ids).numpy())


def test_a_cache_of_every_row_does_not_grow_with_unknown_keys(serve):
    server, oracle = serve("cache")
    lookup = hps.LookupLayer(model_name="m", table_id=0, emb_vec_size=DIM, emb_vec_dtype=tf.float32)
    unknown = tf.constant(np.arange(ROWS, ROWS + EXTRA), tf.int64)
    for _ in range(2):
        np.testing.assert_array_equal(lookup(unknown).numpy(), tf.nn.embedding_lookup(oracle, unknown).numpy())
    assert server.table("m", 0).cache.size() == ROWS


def test_defaults_served_while_the_only_database_is_down_are_not_cached(serve, monkeypatch, caplog):
    server, oracle = serve("chain", persistent=False)
    lookup = hps.LookupLayer(model_name="m", table_id=0, emb_vec_size=DIM, emb_vec_dtype=tf.float32)
    ids = tf.constant([11, 12, 13], tf.int64)

    def down(tag, keys, dim):
        raise tiers.TierUnavailable("connection refused (test)")

    with monkeypatch.context() as patch, caplog.at_level(logging.WARNING):
        patch.setattr(server.volatile_db, "fetch", down)
        np.testing.assert_array_equal(lookup(ids).numpy(), np.full((3, DIM), 0.5, np.float32))
    assert "is unavailable" in caplog.text
    np.testing.assert_array_equal(lookup(ids).numpy(), tf.nn.embedding_lookup(oracle, ids).numpy())


def test_a_persistent_db_that_cannot_open_closes_the_volatile_db_it_opened(tmp_path, monkeypatch):
    """The volatile DB (a Redis client, say) is opened first; a persistent DB that fails to open
    must not leave it open."""
    closed = []
    volatile = types.SimpleNamespace(name="fake volatile", close=lambda: closed.append(True))
    monkeypatch.setattr(tiers, "make_volatile_db", lambda cfg: volatile)

    def refuse(cfg):
        raise OSError("the persistent database cannot be opened")

    monkeypatch.setattr(tiers, "make_persistent_db", refuse)
    folder, _ = support.write_table(tmp_path / "t0", ROWS, DIM)
    entry = support.model_entry("m", [folder], [DIM])
    config = load_config(support.ps_config([entry]))
    with pytest.raises(OSError, match="cannot be opened"):
        ParameterServer(config)
    assert closed == [True]


def test_a_copy_back_fetched_before_an_update_does_not_overwrite_it(serve, monkeypatch):
    """cache_missed_embeddings: a row the persistent DB had is copied back to the volatile DB in
    the background. When an update of that key lands between the fetch and the copy-back, the
    copy-back (of the stale row) is skipped: the lookup returns the update's row."""
    server, oracle = serve(
        "hash_map+rocks_db", volatile={"overflow_margin": 10, "num_partitions": 1, "cache_missed_embeddings": True}
    )
    table = server.table("m", 0)
    queued = []
    monkeypatch.setattr(server, "submit", lambda fn, *args: queued.append((fn, args)))  # run them below
    _, found = server.volatile_db.fetch(table.tag, np.arange(ROWS, dtype=np.int64), DIM)
    key = np.flatnonzero(~found)[:1].astype(np.int64)  # a key only RocksDB has
    np.testing.assert_array_equal(table.fetch(key), oracle[key])
    assert len(queued) == 1, "the copy-back was not queued"
    fresh = np.full((1, DIM), 9.0, np.float32)
    server.apply_update(types.SimpleNamespace(tag=table.tag, keys=key, values=fresh))
    fn, args = queued.pop()
    fn(*args)  # the copy-back of the row fetched before the update
    np.testing.assert_array_equal(table.fetch(key), fresh)
    np.testing.assert_array_equal(server.volatile_db.fetch(table.tag, key, DIM)[0], fresh)
