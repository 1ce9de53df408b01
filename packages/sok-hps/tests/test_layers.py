"""hps.LookupLayer and hps.SparseLookupLayer return what tf.nn.embedding_lookup(_sparse) return.

The table is served from its cache alone (no database: the cache holds every row); the oracle is
the same rows as a dense tensor, with the default value for ids no tier has. Equality is bitwise
(``np.testing.assert_array_equal``), for int32 and int64 ids, ids of rank 1 to 3, duplicates,
``max_norm``, every combiner with and without weights, SparseTensor and RaggedTensor ids, eager and
in a ``tf.function``. ``SparseLookupLayer`` returns a row per sample, zeros for samples without ids
(trailing ones too, which ``tf.nn.embedding_lookup_sparse`` leaves out). The checks of the call raise.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
sys.path.insert(0, str(Path(__file__).parent))
import hierarchical_parameter_server as hps  # noqa: E402
import serve_support as support  # noqa: E402

ROWS, EXTRA, DIM, DIM2 = 3000, 40, 16, 8
DEFAULT = 0.5


@pytest.fixture(scope="module", params=[True, False], ids=["int64", "int32"])
def table(request, tmp_path_factory):
    """A served model ``m`` of two tables; yields (key dtype, oracle of table 0, oracle of table 1)."""
    tmp = tmp_path_factory.mktemp("layers")
    folder0, w0 = support.write_table(tmp / "t0", ROWS, DIM, seed=1)
    folder1, w1 = support.write_table(tmp / "t1", 200, DIM2, seed=2)
    models = [support.model_entry("m", [folder0, folder1], [DIM, DIM2])]
    config = support.ps_config(models, supportlonglong=request.param, **support.DISABLED_DBS)
    path = support.write_config(tmp / "ps.json", config)
    with support.served(path):
        yield (
            tf.int64 if request.param else tf.int32,
            support.oracle(w0, DEFAULT, EXTRA),
            support.oracle(w1, DEFAULT, EXTRA),
        )


def random_ids(shape, dtype, high, seed):
    return tf.constant(np.random.default_rng(seed).integers(0, high, size=shape), dtype=dtype)


@pytest.mark.parametrize("shape", [(50,), (32, 26), (4, 8, 3)], ids=["rank1", "rank2", "rank3"])
@pytest.mark.parametrize("max_norm", [None, 0.1, 10.0])
def test_lookup_layer_equals_embedding_lookup(table, shape, max_norm):
    dtype, w0, _ = table
    layer = hps.LookupLayer(model_name="m", table_id=0, emb_vec_size=DIM, emb_vec_dtype=tf.float32)
    ids = random_ids(shape, dtype, ROWS + EXTRA, seed=len(shape))
    want = tf.nn.embedding_lookup(w0, ids, max_norm=max_norm)
    got = layer(ids, max_norm=max_norm)
    assert got.shape == ids.shape + [DIM] and got.dtype == tf.float32
    np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_lookup_layer_in_tf_function_with_variable_max_norm(table):
    dtype, w0, _ = table
    layer = hps.LookupLayer(model_name="m", table_id=0, emb_vec_size=DIM, emb_vec_dtype=np.float32)
    max_norm = tf.Variable(0.1)
    step = tf.function(lambda ids: layer(ids, max_norm=max_norm))
    for seed in range(3):
        ids = random_ids((64, 10), dtype, ROWS + EXTRA, seed)
        np.testing.assert_array_equal(step(ids).numpy(), tf.nn.embedding_lookup(w0, ids, max_norm=max_norm).numpy())


def test_second_table_and_defaults(table):
    dtype, _, w1 = table
    layer = hps.LookupLayer(model_name="m", table_id=1, emb_vec_size=DIM2, emb_vec_dtype=tf.float32)
    ids = tf.constant([0, 199, 200, 239, 5, 5], dtype)  # 200.. are missing everywhere
    got = layer(ids).numpy()
    np.testing.assert_array_equal(got, tf.nn.embedding_lookup(w1, ids).numpy())
    np.testing.assert_array_equal(got[2:4], np.full((2, DIM2), DEFAULT, np.float32))


def sparse_batch(dtype, rows, max_nnz, high, seed, weighted):
    """A row-major SparseTensor [rows, max_nnz] with 1..max_nnz ids per row, and weights or None."""
    rng = np.random.default_rng(seed)
    indices, values = [], []
    for r in range(rows):
        for c in range(rng.integers(1, max_nnz + 1)):
            indices.append([r, c])
            values.append(rng.integers(0, high))
    shape = [rows, max_nnz]
    ids = tf.SparseTensor(indices, tf.constant(values, dtype), shape)
    weights = None
    if weighted:
        weights = tf.SparseTensor(indices, tf.constant(rng.random(len(values)), tf.float32), shape)
    return ids, weights


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("max_norm", [None, 0.1])
def test_sparse_lookup_layer_equals_embedding_lookup_sparse(table, combiner, weighted, max_norm):
    dtype, w0, _ = table
    layer = hps.SparseLookupLayer(model_name="m", table_id=0, emb_vec_size=DIM, emb_vec_dtype=tf.float32)
    sp_ids, sp_weights = sparse_batch(dtype, 64, 10, ROWS + EXTRA, seed=7, weighted=weighted)
    want = tf.nn.embedding_lookup_sparse(w0, sp_ids, sp_weights, combiner=combiner, max_norm=max_norm)
    got = layer(sp_ids, sp_weights, combiner=combiner, max_norm=max_norm)
    assert got.shape == (64, DIM)
    np.testing.assert_array_equal(got.numpy(), want.numpy())


#: Batches with samples that have no ids: (indices, dense_shape).
EMPTY_SAMPLES = {
    "trailing": ([[0, 0]], [3, 4]),
    "all": (np.zeros((0, 2), np.int64), [3, 4]),
    "inner_and_trailing": ([[0, 0], [0, 1], [2, 0], [2, 1], [4, 0]], [7, 3]),
}


def padded_oracle(weights, sp_ids, sp_weights, combiner):
    """``tf.nn.embedding_lookup_sparse`` on the dense table, with a zero row for each trailing
    sample without ids (TF 2.21 returns rows up to the last sample that has one; none if none has)."""
    batch = int(sp_ids.dense_shape[0])
    want = tf.nn.embedding_lookup_sparse(weights, sp_ids, sp_weights, combiner=combiner).numpy()
    return np.concatenate([want, np.zeros((batch - len(want), weights.shape[1]), np.float32)])


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("samples", sorted(EMPTY_SAMPLES))
def test_sparse_lookup_layer_returns_zeros_for_samples_without_ids(table, combiner, weighted, samples):
    dtype, w0, _ = table
    layer = hps.SparseLookupLayer(model_name="m", table_id=0, emb_vec_size=DIM, emb_vec_dtype=tf.float32)
    indices, shape = EMPTY_SAMPLES[samples]
    rng = np.random.default_rng(len(indices))
    sp_ids = tf.SparseTensor(indices, tf.constant(rng.integers(0, ROWS + EXTRA, len(indices)), dtype), shape)
    sp_weights = (
        tf.SparseTensor(indices, tf.constant(rng.random(len(indices)), tf.float32), shape) if weighted else None
    )
    want = padded_oracle(w0, sp_ids, sp_weights, combiner)
    assert want.shape == (shape[0], DIM)
    step = tf.function(lambda ids, weights: layer(ids, weights, combiner=combiner))
    ragged_weights = None if sp_weights is None else tf.RaggedTensor.from_sparse(sp_weights)
    ragged = tf.RaggedTensor.from_sparse(sp_ids)
    for ids, weights in [(sp_ids, sp_weights), (ragged, ragged_weights)]:
        for call in (lambda ids, weights: layer(ids, weights, combiner=combiner), step):
            got = call(ids, weights)
            assert got.shape == (shape[0], DIM)
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=0)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_sparse_lookup_layer_ragged_ids_in_tf_function(table, combiner, weighted):
    dtype, w0, _ = table
    layer = hps.SparseLookupLayer(model_name="m", table_id=0, emb_vec_size=DIM, emb_vec_dtype=tf.float32)
    sp_ids, sp_weights = sparse_batch(dtype, 48, 6, ROWS + EXTRA, seed=11, weighted=weighted)
    ragged = tf.RaggedTensor.from_sparse(sp_ids)
    ragged_weights = None if sp_weights is None else tf.RaggedTensor.from_sparse(sp_weights)

    @tf.function
    def step(ids, weights):
        return layer(sp_ids=ids, sp_weights=weights, combiner=combiner)

    @tf.function  # the oracle in a graph too: grappler may rewrite the combiner's arithmetic
    def oracle(ids, weights):
        return tf.nn.embedding_lookup_sparse(w0, ids, weights, combiner=combiner)

    np.testing.assert_array_equal(step(ragged, ragged_weights).numpy(), oracle(ragged, ragged_weights).numpy())


def test_sparse_lookup_layer_default_combiner_is_mean(table):
    dtype, w0, _ = table
    layer = hps.SparseLookupLayer(model_name="m", table_id=0, emb_vec_size=DIM, emb_vec_dtype=tf.float32)
    sp_ids, _ = sparse_batch(dtype, 16, 4, ROWS + EXTRA, seed=3, weighted=False)
    want = tf.nn.embedding_lookup_sparse(w0, sp_ids, None, combiner="mean")
    np.testing.assert_array_equal(layer(sp_ids, None).numpy(), want.numpy())


def test_wrong_id_dtype_is_refused(table):
    dtype, _, _ = table
    other = tf.int32 if dtype == tf.int64 else tf.int64
    layer = hps.LookupLayer(model_name="m", table_id=0, emb_vec_size=DIM, emb_vec_dtype=tf.float32)
    with pytest.raises(ValueError, match="supportlonglong"):
        layer(tf.constant([1, 2], other))
    with pytest.raises(ValueError, match="tf.int32 or tf.int64"):
        layer(tf.constant([1.0]))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"model_name": "nope", "table_id": 0, "emb_vec_size": DIM}, "model_name 'nope' is not in the ps_config"),
        ({"model_name": "m", "table_id": 2, "emb_vec_size": DIM}, "table_id 2 of model 'm' is out of range"),
        ({"model_name": "m", "table_id": 0, "emb_vec_size": DIM + 1}, "the ps_config says 16"),
    ],
    ids=["model", "table_id", "emb_vec_size"],
)
def test_call_checks_raise(table, kwargs, match):
    dtype, _, _ = table
    layer = hps.LookupLayer(emb_vec_dtype=tf.float32, **kwargs)
    with pytest.raises(ValueError, match=match):
        layer(tf.constant([1], dtype))


def test_more_keys_than_the_capacity_raise(table):
    dtype, w0, _ = table
    layer = hps.LookupLayer(model_name="m", table_id=0, emb_vec_size=DIM, emb_vec_dtype=tf.float32)
    capacity = 1024 * 64  # max_batch_size x maxnum_catfeature_query_per_table_per_sample
    at_limit = tf.zeros([capacity], dtype)
    np.testing.assert_array_equal(layer(at_limit).numpy()[:2], w0[:1].repeat(2, 0))
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_batch_size x maxnum_catfeature"):
        layer(tf.zeros([capacity + 1], dtype))


def test_sparse_argument_checks(table):
    dtype, _, _ = table
    layer = hps.SparseLookupLayer(model_name="m", table_id=0, emb_vec_size=DIM, emb_vec_dtype=tf.float32)
    sp_ids, _ = sparse_batch(dtype, 4, 2, 10, seed=0, weighted=False)
    with pytest.raises(ValueError, match="combiner must be one of"):
        layer(sp_ids, None, combiner="max")
    with pytest.raises(TypeError, match="sp_ids must be a SparseTensor or a RaggedTensor"):
        layer(tf.constant([[1, 2]], dtype), None)
    with pytest.raises(TypeError, match="sp_weights must be None or a SparseTensor"):
        layer(sp_ids, tf.constant([1.0]))


def test_constructor_checks():
    with pytest.raises(ValueError, match="emb_vec_dtype must be tf.float32"):
        hps.LookupLayer(model_name="m", table_id=0, emb_vec_size=DIM, emb_vec_dtype=tf.float16)
    with pytest.raises(ValueError, match="emb_vec_size must be an integer >= 1"):
        hps.SparseLookupLayer(model_name="m", table_id=0, emb_vec_size=0, emb_vec_dtype=tf.float32)


def test_layer_config_round_trips():
    layer = hps.LookupLayer(
        model_name="m",
        table_id=1,
        emb_vec_size=DIM2,
        emb_vec_dtype=tf.float32,
        ps_config_file="ps.json",
        global_batch_size=64,
        name="emb",
    )
    clone = hps.LookupLayer.from_config(layer.get_config())
    assert (clone.model_name, clone.table_id, clone.emb_vec_size, clone.ps_config_file, clone.global_batch_size) == (
        "m",
        1,
        DIM2,
        "ps.json",
        64,
    )
    assert clone.name == "emb"


@pytest.mark.parametrize("shape", [(0,), (3, 0)])
def test_empty_ids(table, shape):
    dtype, w0, _ = table
    layer = hps.LookupLayer(model_name="m", table_id=0, emb_vec_size=DIM, emb_vec_dtype=tf.float32)
    ids = tf.zeros(shape, dtype)
    got = layer(ids)
    assert got.shape == shape + (DIM,)
    np.testing.assert_array_equal(got.numpy(), tf.nn.embedding_lookup(w0, ids).numpy())


TF_KERAS_MODEL = """
import sys
import numpy as np
import hierarchical_parameter_server as hps  # before TensorFlow, as NVIDIA's notebooks
import tensorflow as tf

assert tf.keras.__name__.startswith("tf_keras"), tf.keras.__name__
oracle = np.load(sys.argv[2])
common = {"model_name": "m", "table_id": 0, "emb_vec_size": 8, "emb_vec_dtype": tf.float32}
if sys.argv[3] == "init":
    hps.Init(ps_config_file=sys.argv[1], global_batch_size=64)
else:  # the first symbolic call starts HPS, inside tf_keras' graph
    common.update(ps_config_file=sys.argv[1], global_batch_size=64)
ids = tf.keras.Input(shape=(3,), dtype=tf.int64)
sp_ids = tf.keras.Input(shape=(None,), sparse=True, dtype=tf.int64)
rows = hps.LookupLayer(**common)(ids)
pooled = hps.SparseLookupLayer(**common)(sp_ids, None, combiner="sum")
model = tf.keras.Model([ids, sp_ids], [rows, pooled])
batch = np.random.default_rng(3).integers(0, len(oracle), size=(16, 3))
sparse = tf.sparse.from_dense(tf.constant(batch[:, :2]))
got_rows, got_pooled = model([tf.constant(batch), sparse])
np.testing.assert_array_equal(got_rows.numpy(), oracle[batch])
np.testing.assert_array_equal(got_pooled.numpy(), tf.nn.embedding_lookup_sparse(oracle, sparse, None, combiner="sum"))
print("tf_keras model ok")
"""


@pytest.mark.parametrize("start", ["init", "implicit"])
def test_layers_in_a_tf_keras_functional_model(tmp_path, start):
    """Under TF_USE_LEGACY_KERAS=1 (the Keras 2 of NVIDIA's notebooks) both layers take symbolic
    dense and sparse inputs of a functional model, and the model serves the table's rows, whether
    hps.Init ran first or the layers' first (symbolic) call started HPS."""
    import os
    import subprocess

    pytest.importorskip("tf_keras", reason="Keras 2 (TF_USE_LEGACY_KERAS=1) needs tf_keras")
    folder, weights = support.write_table(tmp_path / "t0", 100, 8, seed=6)
    entry = support.model_entry("m", [folder], [8])
    path = support.write_config(tmp_path / "ps.json", support.ps_config([entry], **support.DISABLED_DBS))
    np.save(tmp_path / "oracle.npy", support.oracle(weights, DEFAULT, 0))
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    run = subprocess.run(
        [sys.executable, "-c", TF_KERAS_MODEL, path, str(tmp_path / "oracle.npy"), start],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "tf_keras model ok" in run.stdout
