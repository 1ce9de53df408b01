"""The one-rank path of sok.lookup_sparse (pooled_lookup.py): SokPooledLookup and its gradient equal
the per-table TensorFlow ops of lookup/local_lookup.py to the bit, weight gradients equal TensorFlow's; the shards
of the several-rank path sum the ids they hold (NumPy oracles)."""

from __future__ import annotations

import functools

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
import sparse_operation_kit as sok  # noqa: E402
from sparse_operation_kit import communication, pooled_lookup  # noqa: E402
from sparse_operation_kit.lookup import sparse as lookup_call  # noqa: E402

SHAPES = [(3, 16), (1000, 16), (20000, 128), (7, 1), (300, 3)]  # dense-slot and hashed distinct ids


@pytest.fixture(autouse=True)
def single_process(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(communication, "_tool", communication.SingleProcess())


def _inputs(seed: int = 0):
    """Tables, ids (int32 and int64, 0-20 per sample, empty samples included) and weights."""
    rng = np.random.default_rng(seed)
    tables = [sok.Variable(rng.random(s, dtype=np.float32) - 0.5, dtype=tf.float32) for s in SHAPES]
    lengths = [rng.integers(0, 21, 256) for _ in SHAPES]
    ids = [
        tf.RaggedTensor.from_row_lengths(
            tf.constant(rng.integers(0, rows, n.sum()), tf.int64 if t % 2 else tf.int32), n
        )
        for t, ((rows, _), n) in enumerate(zip(SHAPES, lengths))
    ]
    weights = [
        tf.RaggedTensor.from_row_lengths(tf.constant(rng.uniform(0.1, 2.0, n.sum()).astype(np.float32)), n)
        for n in lengths
    ]
    cotangents = [tf.constant(rng.random((256, dim), dtype=np.float32)) for _, dim in SHAPES]
    return tables, ids, weights, cotangents


def _forward_and_gradients(tables, ids, weights, combiners, cotangents):
    with tf.GradientTape() as tape:
        if weights is not None:
            tape.watch([w.values for w in weights])
        embeddings = sok.lookup_sparse(tables, ids, weights, combiners=combiners)
        loss = tf.add_n([tf.reduce_sum(e * c) for e, c in zip(embeddings, cotangents)])
    sources = tables + ([] if weights is None else [w.values for w in weights])
    return embeddings, tape.gradient(loss, sources)


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_equals_the_tf_op_path_to_the_bit(combiner: str, weighted: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    tables, ids, weights, cotangents = _inputs()
    weights = weights if weighted else None
    combiners = [combiner] * len(tables)
    fused, fused_grads = _forward_and_gradients(tables, ids, weights, combiners, cotangents)
    assert all(isinstance(g, tf.IndexedSlices) for g in fused_grads[: len(tables)])
    monkeypatch.setattr(lookup_call, "fused_tables", lambda *args: [])
    plain, plain_grads = _forward_and_gradients(tables, ids, weights, combiners, cotangents)
    # TensorFlow's GPU segment sums add in another order than its CPU ones: equal within rounding there.
    same = np.testing.assert_array_equal
    if "GPU" in tables[0].device:
        same = functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-5)
    for a, b in zip(fused, plain):
        same(a.numpy(), b.numpy())
    for a, b in zip(fused_grads[: len(tables)], plain_grads[: len(tables)]):
        np.testing.assert_array_equal(a.indices.numpy(), b.indices.numpy())
        same(a.values.numpy(), b.values.numpy())


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_weight_gradients_equal_tensorflow(combiner: str) -> None:
    tables, ids, weights, cotangents = _inputs(seed=1)
    _, grads = _forward_and_gradients(tables, ids, weights, [combiner] * len(tables), cotangents)
    for t, table in enumerate(tables):
        full = tf.constant(table.numpy())
        values = weights[t].values
        with tf.GradientTape() as tape:
            tape.watch(values)
            w = tf.RaggedTensor.from_row_splits(values, weights[t].row_splits)
            loss = tf.reduce_sum(tf.nn.embedding_lookup_sparse(full, ids[t], w, combiner=combiner) * cotangents[t])
        np.testing.assert_allclose(
            grads[len(tables) + t].numpy(), tape.gradient(loss, values).numpy(), rtol=1e-5, atol=1e-5
        )


def test_in_tf_function_equals_eager() -> None:
    tables, ids, _, cotangents = _inputs(seed=2)
    combiners = ["sum", "mean", "sqrtn", "mean", "sum"]
    eager, eager_grads = _forward_and_gradients(tables, ids, None, combiners, cotangents)
    graph, graph_grads = tf.function(_forward_and_gradients)(tables, ids, None, combiners, cotangents)
    for a, b in zip(eager, graph):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    for a, b in zip(eager_grads, graph_grads):
        np.testing.assert_array_equal(a.values.numpy(), b.values.numpy())


def test_ids_outside_the_rows_name_the_table() -> None:
    table = sok.Variable(np.zeros((5, 2), np.float32), dtype=tf.float32, name="small")
    ids = tf.ragged.constant([[0, 5]], dtype=tf.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"sp_ids\[0\] has ids outside \[0, 5\) for table small"):
        sok.lookup_sparse([table], [ids], combiners=["sum"])


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("stride,offset", [(2, 0), (2, 1), (3, 2), (1, -1)])
def test_shards_pool_the_ids_they_hold(stride: int, offset: int, weighted: bool) -> None:
    """The several-rank step (lookup/local_lookup.py): a shard sums the rows of the ids it holds, and its
    gradients are IndexedSlices of its own rows; NumPy oracles on the full table."""
    rng = np.random.default_rng(3)
    full = rng.random((50, 4), dtype=np.float32)
    lengths = rng.integers(0, 12, 64)
    flat = rng.integers(0, 50, lengths.sum())
    samples = np.repeat(np.arange(64), lengths)
    w = rng.uniform(0.1, 2.0, flat.size).astype(np.float32) if weighted else np.ones(flat.size, np.float32)
    cotangent = rng.random((64, 4), dtype=np.float32)
    table = tf.Variable(full[offset::stride] if offset >= 0 else full[:0], name="shard")
    ids = tf.RaggedTensor.from_row_lengths(tf.constant(flat), lengths)
    values = tf.constant(w)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(values)
        weights = [tf.RaggedTensor.from_row_lengths(values, lengths)] if weighted else None
        (out,) = pooled_lookup.pooled_lookup([table], [ids], weights, ["sum"], [0], [(stride, offset)])
        loss = tf.reduce_sum(out * cotangent)
    held = (flat % stride == offset) & (offset >= 0)
    expected = np.zeros((64, 4), np.float32)
    np.add.at(expected, samples[held], full[flat[held]] * w[held, None])
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-6, atol=1e-6)
    grad = tape.gradient(loss, table)
    assert isinstance(grad, tf.IndexedSlices)
    expected_grad = np.zeros(table.shape, np.float32)
    np.add.at(expected_grad, flat[held] // stride, cotangent[samples[held]] * w[held, None])
    np.testing.assert_allclose(tf.convert_to_tensor(grad).numpy(), expected_grad, rtol=1e-6, atol=1e-6)
    if weighted:
        expected_w = np.where(held, np.sum(cotangent[samples] * full[flat], axis=1), 0.0)
        np.testing.assert_allclose(tape.gradient(loss, values).numpy(), expected_w, rtol=1e-5, atol=1e-6)
