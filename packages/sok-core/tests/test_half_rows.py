"""``sok.Variable`` tables of float16 and bfloat16 rows (CPU kernels; the GPU's in the *_gpu tests).

Oracles: a float32 ``sok.Variable`` holding the same values widened (exact), whose lookups and
gradients the half-width table's must equal to the bit (its rows are read widened, the sums are
float32 in the same order); ``tf.nn.embedding_lookup_sparse``; and a NumPy ``sok.RowWiseAdagrad``
step in float32 with the row rounded to nearest even when stored.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import sparse_operation_kit as sok  # noqa: E402
from sparse_operation_kit import communication  # noqa: E402
from sparse_operation_kit.checkpoint.inspect import inspect  # noqa: E402

HALF = ["float16", "bfloat16"]
COMBINERS = ["sum", "mean", "sqrtn"]


@pytest.fixture(autouse=True)
def one_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(communication, "_tool", communication.SingleProcess())


def _values(rows: int = 40, dim: int = 6, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(rows, dim)).astype(np.float32)


def _ids(batch: int = 24, rows: int = 40, seed: int = 1) -> tf.RaggedTensor:
    """Up to 7 ids per sample (some empty), with repeats."""
    rng = np.random.default_rng(seed)
    samples = [list(rng.integers(0, rows, size=k)) for k in rng.integers(0, 8, size=batch)]
    samples[3] = [5, 5, 5, 9]
    return tf.ragged.constant(samples, dtype=tf.int64, ragged_rank=1)


def _widened(table: tf.Variable) -> np.ndarray:
    return tf.cast(table, tf.float32).numpy()


def test_the_ops_take_the_row_dtypes_python_lists() -> None:
    """SokPooledLookup's T attribute allows exactly dtypes.STATIC_ROW_DTYPES (the kernels' RowType),
    float32 its default (graphs saved before the attribute load as float32 lookups)."""
    from sparse_operation_kit import tf_ops
    from sparse_operation_kit.dtypes import STATIC_ROW_DTYPES
    from tensorflow.python.framework import op_def_registry

    tf_ops.library()
    (attr,) = [a for a in op_def_registry.get("SokPooledLookup").attr if a.name == "T"]
    allowed = [tf.as_dtype(t).name for t in attr.allowed_values.list.type]
    assert sorted(allowed) == sorted(STATIC_ROW_DTYPES)
    assert tf.as_dtype(attr.default_value.type).name == STATIC_ROW_DTYPES[0] == "float32"


@pytest.mark.parametrize("dtype", HALF)
def test_rows_are_the_float32_values_rounded_to_nearest_even(dtype: str) -> None:
    values = _values()
    table = sok.Variable(values, dtype=dtype)
    assert table.dtype == dtype
    np.testing.assert_array_equal(_widened(table), tf.cast(tf.cast(values, dtype), tf.float32).numpy())
    made = sok.Variable(shape=[7, 3], initializer="uniform", dtype=getattr(tf, dtype))
    assert made.dtype == dtype and made.shape == (7, 3)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_lookup_and_gradient_equal_those_of_the_float32_table(
    dtype: str, combiner: str, weighted: bool, traced: bool
) -> None:
    half = sok.Variable(_values(), dtype=dtype)
    full = sok.Variable(_widened(half))
    ids = _ids()
    weights = tf.ragged.map_flat_values(lambda x: tf.cast(x % 3, tf.float32) - 0.5, ids) if weighted else None

    def run(table: tf.Variable) -> tuple[np.ndarray, tf.IndexedSlices]:
        with tf.GradientTape() as tape:
            out = sok.lookup_sparse(table, ids, weights, combiners=combiner)
            loss = tf.reduce_sum(out * out)
        return out, tape.gradient(loss, table)

    step = tf.function(run) if traced else run
    out_half, grad_half = step(half)
    out_full, grad_full = step(full)
    assert out_half.dtype == tf.float32
    np.testing.assert_array_equal(out_half.numpy(), out_full.numpy())
    np.testing.assert_array_equal(grad_half.indices.numpy(), grad_full.indices.numpy())
    np.testing.assert_array_equal(grad_half.values.numpy(), grad_full.values.numpy())
    reference = tf.nn.embedding_lookup_sparse(
        full, ids.to_sparse(), None if weights is None else weights.to_sparse(), combiner=combiner
    )
    np.testing.assert_allclose(out_half.numpy(), reference.numpy(), rtol=1e-6, atol=1e-6)


def test_one_call_of_tables_of_three_dtypes_pools_each_dtype_in_one_op() -> None:
    tables = [
        sok.Variable(_values(seed=s), dtype=d) for s, d in enumerate(["float32", "bfloat16", "float16", "bfloat16"])
    ]
    ids = [_ids(seed=10 + t) for t in range(len(tables))]

    @tf.function
    def call() -> list[tf.Tensor]:
        return sok.lookup_sparse(tables, ids, combiners=["sum", "mean", "sqrtn", "sum"])

    together = call()
    ops = [op for op in call.get_concrete_function().graph.get_operations() if op.type == "SokPooledLookup"]
    assert sorted(op.get_attr("T").name for op in ops) == ["bfloat16", "float16", "float32"]
    for t, (table, combiner) in enumerate(zip(tables, ["sum", "mean", "sqrtn", "sum"])):
        alone = sok.lookup_sparse(sok.Variable(_widened(table)), ids[t], combiners=combiner)
        np.testing.assert_array_equal(together[t].numpy(), alone.numpy())


def _row_wise_reference(
    rows: np.ndarray, accumulator: np.ndarray, ids: list[list[int]], dtype: str, lr: float, eps: float
) -> tuple[np.ndarray, np.ndarray]:
    """One sok.RowWiseAdagrad step of loss = sum(pooled ** 2), sum combiner, in float32 (float64 for
    the squares' mean), the rows stored rounded to ``dtype``."""
    w, acc = rows.astype(np.float32).copy(), accumulator.astype(np.float32).copy()
    pooled = np.stack([w[s].sum(axis=0) if s else np.zeros(w.shape[1], np.float32) for s in ids])
    grad = np.zeros_like(w)
    for sample, s in zip(pooled, ids):
        for i in s:
            grad[i] += 2 * sample
    for i in sorted({i for s in ids for i in s}):
        acc[i] += np.float32(np.mean(grad[i].astype(np.float64) ** 2))
        w[i] = w[i] - np.float32(lr) * grad[i] / (np.sqrt(acc[i]) + np.float32(eps))
    return tf.cast(tf.cast(w, dtype), tf.float32).numpy(), acc


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
def test_row_wise_adagrad_steps_in_float32_and_stores_the_row_rounded(dtype: str, traced: bool) -> None:
    table = sok.Variable(_values(), dtype=dtype)
    optimizer = sok.OptimizerWrapper(sok.RowWiseAdagrad(learning_rate=0.05, epsilon=1e-3))
    ids = _ids()

    def step() -> None:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(sok.lookup_sparse(table, ids, combiners="sum") ** 2)
        optimizer.apply_gradients(zip(tape.gradient(loss, [table]), [table]))

    run = tf.function(step) if traced else step
    w, acc = _widened(table), np.full((table.shape[0], 1), 0.1, np.float32)
    for _ in range(2):
        run()
        w, acc = _row_wise_reference(w, acc, ids.to_list(), dtype, 0.05, 1e-3)
        accumulator = optimizer.static_slots(table)["accumulator"]
        assert accumulator.dtype == "float32" and tuple(accumulator.shape) == (table.shape[0], 1)
        np.testing.assert_allclose(accumulator.numpy(), acc, rtol=1e-6)
        # One unit in the last place of the row dtype apart at most (the squares' mean is summed
        # in another order than NumPy's).
        ulp = np.abs(w) * (2.0**-7 if dtype == "bfloat16" else 2.0**-10) + 1e-6
        assert (np.abs(_widened(table) - w) <= ulp).all()


@pytest.mark.parametrize(
    "make",
    [
        lambda: tf.keras.optimizers.Adagrad(0.1),
        lambda: tf.keras.optimizers.Adam(0.1),
        lambda: tf.keras.optimizers.SGD(0.1),
    ],
    ids=["Adagrad", "Adam", "SGD"],
)
def test_other_optimizers_refuse_half_tables_and_change_nothing(make) -> None:
    table = sok.Variable(_values(), dtype="bfloat16")
    before = _widened(table)
    optimizer = sok.OptimizerWrapper(make())
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(sok.lookup_sparse(table, _ids()) ** 2)
    grads = tape.gradient(loss, [table])
    with pytest.raises(ValueError, match=r"has bfloat16 rows, .* nothing was updated.* sok.RowWiseAdagrad"):
        optimizer.apply_gradients(zip(grads, [table]))
    np.testing.assert_array_equal(_widened(table), before)
    assert int(optimizer.optimizer.iterations.numpy()) == 0


@pytest.mark.parametrize("dtype", [tf.float64, tf.int32, "float8"], ids=["float64", "int32", "unknown"])
def test_a_dtype_rows_cannot_have_is_refused_by_name(dtype) -> None:
    with pytest.raises(ValueError, match=r"sok.Variable dtype=.* is not supported; valid: float32, float16, bfloat16"):
        sok.Variable(shape=[4, 3], initializer="uniform", dtype=dtype)


@pytest.mark.parametrize(
    ("given", "dtype"), [("float32", "bfloat16"), ("bfloat16", "float32"), ("float16", "bfloat16")]
)
def test_a_tensor_of_another_dtype_than_the_one_asked_is_refused_naming_both(given: str, dtype: str) -> None:
    with pytest.raises(ValueError, match=rf"initial_value is a {given} tensor and dtype={dtype}: cast it first"):
        sok.Variable(tf.zeros([4, 3], given), dtype=dtype)
    assert sok.Variable(tf.zeros([4, 3], given)).dtype == given  # dtype unset: the tensor's


def test_dynamic_variables_say_where_half_rows_are() -> None:
    with pytest.raises(ValueError, match=r"valid: tf.float32 .* rows of float16 or bfloat16 are for sok.Variable"):
        sok.DynamicVariable(dimension=4, dtype=tf.bfloat16)


@pytest.mark.parametrize("dtype", HALF)
def test_checkpoint_keeps_the_dtype_and_the_bits(tmp_path, dtype: str) -> None:
    table = sok.Variable(_values(), dtype=dtype, name="half")
    optimizer = sok.OptimizerWrapper(sok.RowWiseAdagrad(learning_rate=0.05))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(sok.lookup_sparse(table, _ids()) ** 2)
    optimizer.apply_gradients(zip(tape.gradient(loss, [table]), [table]))
    sok.dump(str(tmp_path), [table], optimizer)
    manifest = json.load(open(os.path.join(tmp_path, "manifest.json")))
    (entry,) = manifest["tables"].values()
    assert entry["dtype"] == dtype and entry["kind"] == "static"

    same = sok.Variable(np.zeros((40, 6)), dtype=dtype, name="half")
    other = sok.OptimizerWrapper(sok.RowWiseAdagrad(learning_rate=0.05))
    other.optimizer.build([same])  # float32 accumulators for the half table, as a training step makes
    sok.load(str(tmp_path), [same], other)
    assert tf.bitcast(tf.convert_to_tensor(same), tf.uint16).numpy().tobytes() == (
        tf.bitcast(tf.convert_to_tensor(table), tf.uint16).numpy().tobytes()
    )
    np.testing.assert_array_equal(
        other.static_slots(same)["accumulator"].numpy(), optimizer.static_slots(table)["accumulator"].numpy()
    )
    tables = inspect(str(tmp_path))["tables"]
    assert [t["dtype"] for t in tables.values()] == [dtype]
    shown = subprocess.run(
        [sys.executable, "-m", "sparse_operation_kit.cli", "ckpt", "inspect", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert f"rows x 6 (int64 keys, {dtype} rows)" in shown.stdout, shown.stdout + shown.stderr
    widened = sok.Variable(np.zeros((40, 6)), name="half")  # float32: the exact values
    sok.load(str(tmp_path), [widened])
    np.testing.assert_array_equal(widened.numpy(), _widened(table))


@pytest.mark.parametrize("dtype", HALF)
def test_a_float32_checkpoint_loads_into_half_rows_rounded(tmp_path, dtype: str) -> None:
    values = _values()
    sok.dump(str(tmp_path), [sok.Variable(values, name="t")])
    half = sok.Variable(np.zeros((40, 6)), dtype=dtype, name="t")
    sok.load(str(tmp_path), [half])
    np.testing.assert_array_equal(_widened(half), tf.cast(tf.cast(values, dtype), tf.float32).numpy())
