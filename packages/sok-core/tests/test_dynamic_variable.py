"""sok.DynamicVariable, sok.export and sok.assign on the "hbm" (det) and "hybrid" (hkv) backends.

Covers the seed API (sok-dynamic-variable-api) and reference §1.3/§1.4: shape, find-or-insert
lookups of any id shape, key types, gradients as IndexedSlices over raw keys, eager vs tf.function,
initializers, errors, the unsupported tf.Variable methods, and export/assign round trips.
"""

from __future__ import annotations

import ast
import importlib
import pathlib

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
import sparse_operation_kit as sok  # noqa: E402

VAR_TYPES = ["hbm", "hybrid"]
#: Small backend options per var_type (hkv would pre-allocate 64M slots otherwise).
OPTIONS = {"hbm": {}, "hybrid": {"init_capacity": 1024, "max_capacity": 1 << 16}}
I64 = np.iinfo(np.int64)
I32 = np.iinfo(np.int32)
U64 = np.iinfo(np.uint64)


def make_var(var_type: str, dimension: int = 4, **kwargs) -> sok.DynamicVariable:
    return sok.DynamicVariable(dimension=dimension, var_type=var_type, **OPTIONS[var_type], **kwargs)


def exported(var) -> tuple[np.ndarray, np.ndarray]:
    """sok.export sorted by key (hkv exports in table order)."""
    keys, values = sok.export(var)
    keys, values = keys.numpy(), values.numpy()
    order = np.argsort(keys, kind="stable")
    return keys[order], values[order]


def rows(n: int, dim: int, start: float = 1.0) -> np.ndarray:
    """Distinct float rows: row i is start + i + [0, 0.25, 0.5, ...]."""
    return (start + np.arange(n)[:, None] + 0.25 * np.arange(dim)[None, :]).astype(np.float32)


@pytest.fixture
def reset_seed():
    yield
    tf.random.set_seed(None)


# -- shape, size, lookups ------------------------------------------------------------------------


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_shape_is_none_by_dimension_and_table_starts_empty(var_type):
    v = make_var(var_type, dimension=8)
    assert v.shape.as_list() == [None, 8]
    assert v.dimension == 8
    assert v.backend_type == var_type
    assert v.size.numpy().tolist() == [0, 8]


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_lookup_inserts_each_new_key_once(var_type):
    v = make_var(var_type, dimension=3, initializer="13")
    tf.nn.embedding_lookup(v, tf.constant([4, 4, 9, 4], tf.int64))
    assert v.size.numpy().tolist() == [2, 3]
    tf.nn.embedding_lookup(v, tf.constant([9, 10], tf.int64))
    assert v.size.numpy().tolist() == [3, 3]


@pytest.mark.parametrize("key_type", [tf.int64, tf.int32, tf.uint64])
@pytest.mark.parametrize(
    "var_type, options", [("hbm", {}), ("hybrid", {}), ("hybrid", {"evict_strategy": "epoch_lru"})]
)
def test_lookup_of_each_distinct_key_once_equals_one_lookup_per_occurrence(key_type, var_type, options):
    # det, and hkv under LRU policies, look each distinct key up once; results, new rows, their
    # order and scores must be those of a lookup of every occurrence.
    from sparse_operation_kit import tf_ops

    def var():
        v = make_var(
            var_type,
            dimension=4,
            key_type=key_type,
            initializer=tf.keras.initializers.RandomUniform(seed=7),
            **options,
        )
        sok.assign(v, tf.constant([5, 6], key_type), rows(2, 4))
        return v

    ids = tf.constant([[9, 5, 9], [7, 7, 6], [9, 8, 5]], key_type)
    distinct, per_occurrence = var(), var()
    assert distinct.storage.distinct_lookups
    out = tf.nn.embedding_lookup(distinct, ids)
    expected = tf_ops.library().sok_lookup(*per_occurrence.table_inputs, ids, col_begin=0, col_end=4)
    np.testing.assert_array_equal(out.numpy(), expected.numpy())
    for got, want in zip(sok.export(distinct), sok.export(per_occurrence)):  # same slots, same rows
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    # Same scores up to the clock: one tick per call on both sides.
    _, _, got_scores = distinct.storage.export()
    _, _, want_scores = per_occurrence.storage.export()
    assert (np.argsort(got_scores, kind="stable") == np.argsort(want_scores, kind="stable")).all()


@pytest.mark.parametrize("strategy", ["lfu", "epoch_lfu", "custom"])
def test_lfu_and_custom_hybrid_lookups_count_every_occurrence(strategy):
    v = make_var("hybrid", dimension=4, evict_strategy=strategy)
    assert not v.storage.distinct_lookups
    if strategy == "lfu":  # each occurrence adds one to the frequency
        tf.nn.embedding_lookup(v, tf.constant([3, 3, 3, 4], tf.int64))
        keys, _, scores = v.storage.export()
        assert dict(zip(keys.tolist(), scores.tolist())) == {3: 3, 4: 1}


def test_lookup_distinct_op_rejects_positions_that_do_not_fit_its_keys():
    from sparse_operation_kit import tf_ops

    lib, v = tf_ops.library(), make_var("hbm", dimension=2)
    keys, distinct = tf.constant([7, 8, 7], tf.int64), tf.constant([7, 8], tf.int64)
    bad = {
        "is not a row of the 2 distinct keys": (distinct, tf.constant([0, 2, 0], tf.int32)),
        "one per key": (distinct, tf.constant([0, 1], tf.int32)),
        "distinct_keys must be a vector": (tf.constant([[7, 8]], tf.int64), tf.constant([0, 1, 0], tf.int32)),
    }
    for message, (d, p) in bad.items():
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            lib.sok_lookup_distinct(*v.table_inputs, keys, d, p, col_begin=0, col_end=2)
    assert int(v.size[0]) == 0  # nothing inserted by a refused call


def test_distinct_index_of_finds_the_lookups_keys_only_for_its_own_gradient():
    from sparse_operation_kit.dynamic_variable import distinct_index_of

    v = make_var("hbm", dimension=2)
    found = {}

    @tf.function
    def grads(ids):
        with tf.GradientTape() as tape:
            once = tf.reduce_sum(tf.nn.embedding_lookup(v, ids))
        g = tape.gradient(once, v)
        with tf.GradientTape() as tape:  # read twice: the tape concatenates the two gradients
            twice = tf.reduce_sum(tf.nn.embedding_lookup(v, ids)) + tf.reduce_sum(tf.nn.embedding_lookup(v, ids))
        g2 = tape.gradient(twice, v)
        found["once"], found["twice"] = distinct_index_of(g.indices), distinct_index_of(g2.indices)
        return g.indices

    grads(tf.constant([[3, 4], [4, 4]], tf.int64))
    assert [t.op.type for t in found["once"]] == ["SokUniqueIndex", "SokUniqueIndex"]
    assert found["twice"] is None
    assert distinct_index_of(tf.constant([3, 4], tf.int64)) is None  # eager: no producing op


def test_try_sparse_read_hands_keys_promised_distinct_over_as_their_own_index():
    from sparse_operation_kit.dynamic_variable import distinct_index_of, try_sparse_read

    v = make_var("hbm", dimension=2)
    found = {}

    @tf.function
    def grads(ids):
        unique = tf.unique(ids)[0]
        for promised in (True, False):
            keys = unique if promised else tf.identity(unique)  # the same values, not promised
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(try_sparse_read(v, keys, distinct=promised)[0])
            found[promised] = distinct_index_of(tape.gradient(loss, v).indices)
        distinct, positions = found[True]
        return distinct, positions

    distinct, positions = grads(tf.constant([5, 3, 5, 9], tf.int64))
    # The keys, and 0 .. n-1 as an int64 range cast to int32 (where the table is, on a GPU too).
    assert [t.op.type for t in found[True]] == ["Reshape", "Cast"]
    assert found[True][1].op.inputs[0].op.type == "Range" and found[True][1].op.inputs[0].dtype == tf.int64
    assert found[False] is None
    np.testing.assert_array_equal(distinct.numpy(), [5, 3, 9])
    np.testing.assert_array_equal(positions.numpy(), [0, 1, 2])


def test_distinct_index_hand_off_does_not_keep_graphs_alive():
    import gc
    import weakref

    from sparse_operation_kit.dynamic_variable import distinct_index_of

    v = make_var("hbm", dimension=2)
    handed_over = []

    def traced_graph():
        @tf.function
        def grads(ids):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.nn.embedding_lookup(v, ids))
            g = tape.gradient(loss, v)
            handed_over.append(distinct_index_of(g.indices) is not None)
            return g.indices

        return weakref.ref(grads.get_concrete_function(tf.constant([1, 2, 1], tf.int64)).graph)

    graph = traced_graph()
    gc.collect()
    assert handed_over == [True]
    assert graph() is None


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_keys_of_converts_ids_as_every_read_does(var_type):
    v = make_var(var_type)
    ids = tf.constant([4, 2**40], tf.int64)
    assert v.keys_of(ids) is ids
    keys = v.keys_of(tf.constant([4, -1], tf.int32))
    assert keys.dtype == tf.int64
    np.testing.assert_array_equal(keys.numpy(), [4, -1])
    with pytest.raises(TypeError, match=r"tf.cast\(ids, tf.int64\)"):
        v.keys_of(tf.constant([1.0]))


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_sparse_read_1d_ids_returns_rows_in_input_order(var_type):
    v = make_var(var_type, dimension=4)
    sok.assign(v, tf.constant([10, 20, 30], tf.int64), rows(3, 4))
    out = v.sparse_read(tf.constant([30, 10, 30, 20], tf.int64))
    assert out.shape.as_list() == [4, 4]
    np.testing.assert_array_equal(out.numpy(), rows(3, 4)[[2, 0, 2, 1]])


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_embedding_lookup_2d_ids_has_shape_ids_plus_dim(var_type):
    v = make_var(var_type, dimension=4)
    sok.assign(v, tf.constant([10, 20, 30], tf.int64), rows(3, 4))
    ids = tf.constant([[10, 20, 30], [30, 30, 10]], tf.int64)
    out = tf.nn.embedding_lookup(v, ids)
    assert out.shape.as_list() == [2, 3, 4]
    np.testing.assert_array_equal(out.numpy(), rows(3, 4)[[[0, 1, 2], [2, 2, 0]]])


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_int32_ids_read_an_int64_table(var_type):
    v = make_var(var_type, dimension=4)
    sok.assign(v, tf.constant([1, 2], tf.int64), rows(2, 4))
    out = tf.nn.embedding_lookup(v, tf.constant([2, 1, 2], tf.int32))
    np.testing.assert_array_equal(out.numpy(), rows(2, 4)[[1, 0, 1]])
    assert v.size.numpy()[0] == 2


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_ids_of_another_key_type_raise_type_error(var_type):
    v = make_var(var_type)
    with pytest.raises(TypeError, match="key_type"):
        tf.nn.embedding_lookup(v, tf.constant([1], tf.uint64))


KEY_CASES = {
    "int64": (tf.int64, [0, -1, 1, 2**40, int(I64.min), int(I64.max)], np.int64),
    "int32": (tf.int32, [0, -1, 1, int(I32.min), int(I32.max)], np.int32),
    "uint64": (tf.uint64, [0, 1, 2**63, int(U64.max) - 1, int(U64.max)], np.uint64),
}


@pytest.mark.parametrize("var_type", VAR_TYPES)
@pytest.mark.parametrize("case", list(KEY_CASES))
def test_every_key_of_the_key_type_is_valid(var_type, case):
    key_type, keys, np_type = KEY_CASES[case]
    v = make_var(var_type, dimension=3, key_type=key_type, initializer="7")
    assert v.key_type == key_type
    ids = tf.constant(np.array(keys, dtype=np_type), key_type)
    np.testing.assert_array_equal(tf.nn.embedding_lookup(v, ids).numpy(), np.full((len(keys), 3), 7.0, np.float32))
    sok.assign(v, ids, rows(len(keys), 3))
    np.testing.assert_array_equal(tf.nn.embedding_lookup(v, ids).numpy(), rows(len(keys), 3))
    got_keys, got_values = sok.export(v)
    assert got_keys.dtype == key_type
    got = dict(zip(got_keys.numpy().tolist(), got_values.numpy().tolist(), strict=True))
    assert sorted(got) == sorted(keys)
    for i, key in enumerate(keys):
        assert got[key] == rows(len(keys), 3)[i].tolist()


# -- gradients and tf.function ------------------------------------------------------------------


@pytest.mark.parametrize("var_type", VAR_TYPES)
@pytest.mark.parametrize("ids", [[5, 7, 5, -1], [[5, 7], [5, -1]]], ids=["1d", "2d"])
def test_gradient_is_indexed_slices_over_raw_keys(var_type, ids):
    v = make_var(var_type, dimension=3)
    ids = tf.constant(ids, tf.int64)
    upstream = tf.reshape(tf.range(12, dtype=tf.float32), ids.shape.as_list() + [3])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.embedding_lookup(v, ids) * upstream)
    grad = tape.gradient(loss, v)
    assert isinstance(grad, tf.IndexedSlices)
    assert grad.indices.numpy().tolist() == [5, 7, 5, -1]  # raw keys, duplicates kept
    np.testing.assert_array_equal(grad.values.numpy(), np.arange(12, dtype=np.float32).reshape(4, 3))


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_non_trainable_variable_is_not_watched_by_gradient_tape(var_type):
    v = make_var(var_type, trainable=False)
    assert not v.trainable
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.embedding_lookup(v, tf.constant([1, 2], tf.int64)))
    assert tape.watched_variables() == ()
    assert tape.gradient(loss, v) is None


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_lookup_shape_is_inferred_in_tf_function(var_type):
    v = make_var(var_type, dimension=5)
    lookup = tf.function(lambda ids: tf.nn.embedding_lookup(v, ids))
    concrete = lookup.get_concrete_function(tf.TensorSpec([None, 7], tf.int64))
    assert concrete.structured_outputs.shape.as_list() == [None, 7, 5]
    assert lookup(tf.zeros([0, 7], tf.int64)).shape.as_list() == [0, 7, 5]


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_eager_and_tf_function_give_identical_lookups_and_gradients(var_type, reset_seed):
    ids = tf.constant([[3, 8, 3], [2**40, -5, 8]], tf.int64)

    def run(v):
        with tf.GradientTape() as tape:
            emb = tf.nn.embedding_lookup(v, ids)
            loss = tf.reduce_sum(tf.square(emb))
        grad = tape.gradient(loss, v)
        return emb, grad.indices, grad.values

    tf.random.set_seed(11)
    eager_var = make_var(var_type)
    tf.random.set_seed(11)
    graph_var = make_var(var_type)
    eager = run(eager_var)
    graph = tf.function(run)(graph_var)  # unseen keys are inserted inside the graph
    for a, b in zip(eager, graph, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert graph_var.size.numpy().tolist() == [4, 4]


def _depends_on(op, target) -> bool:
    """Whether graph op ``op`` reaches ``target`` through data or control inputs."""
    seen, stack = set(), [op]
    while stack:
        cur = stack.pop()
        if cur is target:
            return True
        if cur.name in seen:
            continue
        seen.add(cur.name)
        stack.extend(t.op for t in cur.inputs)
        stack.extend(cur.control_inputs)
    return False


#: The storage ops of a training step per optimizer: SGD's update is one op on CPU tables, Adam's
#: a read and a write around TensorFlow ops.
UPDATE_OPS = {"SGD": ("SokSparseApply",), "Adam": ("SokFindOrInsert", "SokInsertOrAssign")}


@pytest.mark.parametrize("optimizer", sorted(UPDATE_OPS))
@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_ops_on_one_table_run_in_program_order_in_tf_function(var_type, optimizer):
    """Regression: a lookup and the update after it have no data edge, so only the variable's resource
    handle orders them; without it TF may run the update first and the lookup sees the new rows."""
    v = make_var(var_type, dimension=3, initializer="13")
    ids = tf.constant([4, 5, 4], tf.int64)
    wrapper = sok.OptimizerWrapper(getattr(tf.keras.optimizers, optimizer)(learning_rate=1.0))

    def step():
        with tf.GradientTape() as tape:
            emb = tf.nn.embedding_lookup(v, ids)
            loss = tf.reduce_sum(emb)
        wrapper.apply_gradients([(tape.gradient(loss, v), v)])
        keys, _ = sok.export(v)
        return emb, v.size, keys

    graph = tf.function(step).get_concrete_function().graph
    chain_types = ("SokLookupDistinct", *UPDATE_OPS[optimizer], "SokExport")  # det and LRU hkv: distinct
    ops = {t: [op for op in graph.get_operations() if op.type == t] for t in (*chain_types, "SokSize")}
    assert all(len(found) == 1 for found in ops.values()), {t: len(f) for t, f in ops.items()}
    chain = [ops[t][0] for t in chain_types]
    for earlier, later in zip(chain, chain[1:]):
        assert _depends_on(later, earlier), f"{later.type} does not wait for {earlier.type}"
    emb, _, _ = tf.function(step)()
    np.testing.assert_array_equal(emb.numpy(), np.full((3, 3), 13.0, np.float32))


# -- initializers -------------------------------------------------------------------------------


@pytest.mark.parametrize("var_type", VAR_TYPES)
@pytest.mark.parametrize("initializer", [None, "random"])
def test_random_initializer_is_uniform_in_plus_minus_0_05(var_type, initializer):
    v = make_var(var_type, dimension=8, initializer=initializer)
    x = tf.nn.embedding_lookup(v, tf.range(512, dtype=tf.int64)).numpy()
    assert x.min() >= -0.05 and x.max() < 0.05
    assert abs(float(x.mean())) < 0.005
    assert abs(float(x.std()) - 0.1 / np.sqrt(12)) < 0.003  # std of U[-0.05, 0.05)


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_random_rows_are_reproducible_under_set_seed(var_type, reset_seed):
    ids = tf.constant([0, 5, 2**40, -3], tf.int64)
    tf.random.set_seed(1234)
    first = tf.nn.embedding_lookup(make_var(var_type), ids).numpy()
    tf.random.set_seed(1234)
    second = tf.nn.embedding_lookup(make_var(var_type), ids).numpy()
    np.testing.assert_array_equal(first, second)


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_random_rows_differ_with_another_seed(var_type, reset_seed):
    ids = tf.constant([0, 5, 2**40, -3], tf.int64)
    tf.random.set_seed(1234)
    first = tf.nn.embedding_lookup(make_var(var_type), ids).numpy()
    tf.random.set_seed(4321)
    second = tf.nn.embedding_lookup(make_var(var_type), ids).numpy()
    assert not np.any(first == second)


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_two_variables_under_one_seed_get_different_rows(var_type, reset_seed):
    ids = tf.constant([0, 5, 2**40, -3], tf.int64)
    tf.random.set_seed(1234)
    a, b = make_var(var_type), make_var(var_type)
    assert not np.any(tf.nn.embedding_lookup(a, ids).numpy() == tf.nn.embedding_lookup(b, ids).numpy())


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_normal_initializer_is_standard_normal(var_type):
    v = make_var(var_type, dimension=8, initializer="normal")
    x = tf.nn.embedding_lookup(v, tf.range(1024, dtype=tf.int64)).numpy()
    assert abs(float(x.mean())) < 0.05
    assert abs(float(x.std()) - 1.0) < 0.05


@pytest.mark.parametrize("var_type", VAR_TYPES)
@pytest.mark.parametrize(
    ("initializer", "value"),
    [("zeros", 0.0), ("ones", 1.0), ("13", 13.0), ("-0.25", -0.25), (2.5, 2.5), (-3, -3.0)],
)
def test_constant_initializers(var_type, initializer, value):
    v = make_var(var_type, dimension=3, initializer=initializer)
    out = tf.nn.embedding_lookup(v, tf.constant([0, 9, 2**40], tf.int64)).numpy()
    np.testing.assert_array_equal(out, np.full((3, 3), value, np.float32))


def _stats(lo, hi, mean, std):
    def check(x):
        assert x.min() >= lo and x.max() <= hi
        assert abs(float(x.mean()) - mean) < 0.02
        assert abs(float(x.std()) - std) < 0.02

    return check


KERAS_INITIALIZERS = {
    "Zeros": (lambda: tf.keras.initializers.Zeros(), _stats(0, 0, 0, 0)),
    "Ones": (lambda: tf.keras.initializers.Ones(), _stats(1, 1, 1, 0)),
    "Constant": (lambda: tf.keras.initializers.Constant(2.5), _stats(2.5, 2.5, 2.5, 0)),
    "RandomUniform": (
        lambda: tf.keras.initializers.RandomUniform(-0.3, 0.2),
        _stats(-0.3, 0.2, -0.05, 0.5 / np.sqrt(12)),
    ),
    "RandomNormal": (lambda: tf.keras.initializers.RandomNormal(1.0, 0.1), _stats(0.3, 1.7, 1.0, 0.1)),
    # truncated at 2 stddev: std = 0.5 * 0.8796
    "TruncatedNormal": (lambda: tf.keras.initializers.TruncatedNormal(0.0, 0.5), _stats(-1.0, 1.0, 0.0, 0.44)),
}


@pytest.mark.parametrize("var_type", VAR_TYPES)
@pytest.mark.parametrize("name", list(KERAS_INITIALIZERS))
def test_keras_initializers(var_type, name):
    make, check = KERAS_INITIALIZERS[name]
    v = make_var(var_type, dimension=8, initializer=make())
    check(tf.nn.embedding_lookup(v, tf.range(1024, dtype=tf.int64)).numpy())


# -- errors --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dimension", [0, -1, 2.5, True, "4"])
def test_bad_dimension_raises(dimension):
    with pytest.raises(ValueError, match="dimension"):
        sok.DynamicVariable(dimension=dimension)


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_bad_initializer_string_raises(var_type):
    with pytest.raises(ValueError, match="bogus"):
        make_var(var_type, initializer="bogus")


@pytest.mark.parametrize("key_type", [tf.float32, tf.int16, tf.string])
def test_bad_key_type_raises(key_type):
    with pytest.raises(ValueError, match="key_type"):
        sok.DynamicVariable(dimension=4, key_type=key_type)


@pytest.mark.parametrize("mode", ["bogus", "localized", "localized:x", "distributed:0"])
def test_bad_mode_raises(mode):
    with pytest.raises(ValueError, match="mode"):
        sok.DynamicVariable(dimension=4, mode=mode)


def test_unknown_var_type_lists_installed_var_types():
    with pytest.raises(ValueError, match="nope") as info:
        sok.DynamicVariable(dimension=4, var_type="nope")
    assert "'hbm'" in str(info.value) and "'hybrid'" in str(info.value)


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_unknown_backend_option_raises(var_type):
    with pytest.raises(ValueError, match="bogus_option"):
        make_var(var_type, bogus_option=3)


# -- what a hash table cannot do -----------------------------------------------------------------


UNSUPPORTED = {
    "read_value": lambda v: v.read_value(),
    "value": lambda v: v.value(),
    "numpy": lambda v: v.numpy(),
    "assign": lambda v: v.assign(tf.zeros([1, 4])),
    "assign_add": lambda v: v.assign_add(tf.zeros([1, 4])),
}


@pytest.mark.parametrize("method", list(UNSUPPORTED))
def test_unsupported_variable_methods_point_to_export_and_dump(method):
    v = sok.DynamicVariable(dimension=4)
    with pytest.raises(NotImplementedError) as info:
        UNSUPPORTED[method](v)
    assert "sok.export" in str(info.value) and "sok.dump" in str(info.value)


# -- sok.export / sok.assign ---------------------------------------------------------------------


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_export_of_an_empty_variable(var_type):
    keys, values = sok.export(make_var(var_type, dimension=5))
    assert keys.dtype == tf.int64 and keys.shape.as_list() == [0]
    assert values.shape.as_list() == [0, 5]


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_export_returns_exactly_what_assign_wrote(var_type):
    keys = np.array([2**40, 7, -9, 0, 123456789, 3], np.int64)
    values = rows(6, 4, start=-2.0)
    v = make_var(var_type, dimension=4)
    assert sok.assign(v, tf.constant(keys), tf.constant(values)) is v
    assert v.size.numpy().tolist() == [6, 4]
    got_keys, got_values = exported(v)
    order = np.argsort(keys)
    np.testing.assert_array_equal(got_keys, keys[order])
    np.testing.assert_array_equal(got_values, values[order])


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_assign_overwrites_rows_already_looked_up(var_type):
    v = make_var(var_type, dimension=2, initializer="13")
    tf.nn.embedding_lookup(v, tf.constant([1, 2, 3], tf.int64))
    sok.assign(v, tf.constant([2, 3], tf.int64), tf.constant([[1.0, 2.0], [3.0, 4.0]]))
    keys, values = exported(v)
    assert keys.tolist() == [1, 2, 3]
    np.testing.assert_array_equal(values, [[13.0, 13.0], [1.0, 2.0], [3.0, 4.0]])


@pytest.mark.parametrize("var_type", VAR_TYPES)
@pytest.mark.parametrize("shape", [[2, 3], [3, 2], [2], [1, 2, 2]], ids=lambda s: "x".join(map(str, s)))
def test_assign_with_wrong_value_shape_raises_and_writes_nothing(var_type, shape):
    v = make_var(var_type, dimension=2)
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError)):
        sok.assign(v, tf.constant([1, 2], tf.int64), tf.zeros(shape))
    assert v.size.numpy()[0] == 0


@pytest.mark.parametrize("var_type", list(OPTIONS))
def test_find_or_default_writes_the_default_row_for_missing_keys_and_inserts_nothing(var_type):
    from sparse_operation_kit import tf_ops

    lib = tf_ops.library()
    v = make_var(var_type, dimension=3)
    lib.sok_insert_or_assign(*v.table_inputs, tf.constant([5, 9], tf.int64), rows(2, 3), col_begin=0, col_end=3)
    default = tf.constant([-1.0, 0.5, 7.0])
    keys = tf.constant([9, 4, 5, 4], tf.int64)
    values, found = lib.sok_find_or_default(*v.table_inputs, keys, default, col_begin=0, col_end=3)
    want = np.stack([rows(2, 3)[1], default.numpy(), rows(2, 3)[0], default.numpy()])
    np.testing.assert_array_equal(values.numpy(), want)
    assert found.numpy().tolist() == [True, False, True, False]
    cols, _ = lib.sok_find_or_default(*v.table_inputs, keys, default[1:], col_begin=1, col_end=3)
    np.testing.assert_array_equal(cols.numpy(), want[:, 1:])
    assert int(v.size[0]) == 2
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"default_row must be one row of 3 floats .*\[2\]"):
        lib.sok_find_or_default(*v.table_inputs, keys, default[:2], col_begin=0, col_end=3)


def test_a_graph_makes_the_table_address_on_the_tables_device_instead_of_capturing_it():
    """Inside tf.function the table input is a SokTableAddress op on the table's device: a captured
    CPU tensor would make a function of GPU ops a two-device function (two parts per call)."""
    v = make_var("hbm", dimension=2)
    step = tf.function(lambda ids: tf.nn.embedding_lookup(v, ids))
    fn = step.get_concrete_function(tf.TensorSpec([None], tf.int64))
    addresses = [op for op in fn.graph.get_operations() if op.type == "SokTableAddress"]
    assert addresses and {op.get_attr("address") for op in addresses} == {v._table.address}
    assert all(t.dtype != tf.int64 for t in fn.captured_inputs)  # the handle only
    np.testing.assert_array_equal(
        step(tf.constant([4, 4], tf.int64)).numpy(), tf.nn.embedding_lookup(v, [4, 4]).numpy()
    )


def imported_modules(path: pathlib.Path) -> set[str]:
    """Every module an ``import`` of the file names, wherever the import stands (under
    ``TYPE_CHECKING``, inside a function): ``from pkg import mod`` names ``pkg`` and ``pkg.mod``."""
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
            imported.update(f"{node.module}.{alias.name}" for alias in node.names)
    return imported


@pytest.mark.parametrize(
    ("module", "above"),
    [
        ("sparse_operation_kit.dynamic_variable", {"sparse_operation_kit.slot_view", "sparse_operation_kit.optimizer"}),
        ("sparse_operation_kit.slot_view", {"sparse_operation_kit.optimizer"}),
    ],
)
def test_a_module_imports_none_of_the_modules_built_on_it(module, above):
    """dynamic_variable, then slot_view (a view of a variable's columns), then optimizer: a lower
    module importing an upper one, even for a type hint, makes an import circle."""
    path = pathlib.Path(importlib.import_module(module).__file__)
    assert not imported_modules(path) & above, f"{module} imports {sorted(imported_modules(path) & above)}"
