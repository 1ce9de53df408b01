"""Worker of ``tests/test_demo_dense_sync_multiprocess.py``: sok.broadcast_dense_variables and
sok.allreduce_dense_gradients on Keras 3 variables, on each Horovod rank, against NumPy oracles.

Every rank can compute every rank's inputs (they are seeded by rank), so each rank checks the
collective's result against the NumPy value of all ranks' inputs. Prints ``CHECK <name> rank=<r>
PASS|FAIL <detail>`` per check (``harness.py``).
"""

from __future__ import annotations

import os
import sys
import traceback

if __name__ == "__main__":  # a rank (the test imports this module only for the names of CHECKS)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")

import numpy as np  # noqa: E402
import sparse_operation_kit as sok  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import print_stacks_before_timeout  # noqa: E402


def model(rank: int) -> tf.keras.Model:
    """A Keras 3 model whose initial weights differ by rank (every initializer seeded by it)."""
    glorot = tf.keras.initializers.GlorotUniform
    inputs = tf.keras.Input((4,))
    hidden = tf.keras.layers.Dense(3, kernel_initializer=glorot(seed=rank))(inputs)
    last = tf.keras.layers.Dense(
        1, kernel_initializer=glorot(seed=10 + rank), bias_initializer=tf.keras.initializers.Constant(rank)
    )
    return tf.keras.Model(inputs, last(hidden))


def gradients_of(rank: int, shapes: list) -> list[np.ndarray]:
    rng = np.random.default_rng(100 + rank)
    return [rng.standard_normal(shape).astype(np.float32) for shape in shapes]


def check_broadcast(rank: int, n: int) -> str | None:
    net = model(rank)
    table = sok.Variable(np.arange(8, dtype=np.float32).reshape(4, 2), dtype=tf.float32, name="shard")  # rank-own rows
    shard_before = table.numpy().copy()
    count = sok.broadcast_dense_variables(net.variables + [table])
    expected = [w.numpy() for w in model(0).weights]
    if count != len(expected):
        return f"broadcast {count} variables, expected {len(expected)} (the SOK table must be skipped)"
    for got, want in zip(net.weights, expected):
        if not np.array_equal(got.numpy(), want):
            return f"{got.name} differs from rank 0's initial value"
    if not np.array_equal(table.numpy(), shard_before):
        return "the sok.Variable shard was changed"
    return None


def check_allreduce(rank: int, n: int, op: str, in_function: bool) -> str | None:
    net = model(0)
    table = sok.DynamicVariable(dimension=2, var_type="hbm", name=f"dyn_{op}_{int(in_function)}")
    variables = net.trainable_variables + [table]
    shapes = [tuple(v.shape) for v in net.trainable_variables]
    mine = gradients_of(rank, shapes)
    sparse = tf.IndexedSlices(tf.constant([[rank, rank]], tf.float32), tf.constant([rank], tf.int64))
    grads = [tf.constant(g) for g in mine] + [sparse]

    def reduce(*dense):
        return sok.allreduce_dense_gradients(list(dense) + [sparse], variables, op=op)

    out = tf.function(reduce, autograph=False)(*grads[:-1]) if in_function else reduce(*grads[:-1])
    every = [gradients_of(r, shapes) for r in range(n)]
    for i, got in enumerate(out[:-1]):
        want = np.sum([e[i] for e in every], axis=0) / (n if op == "average" else 1)
        if not np.allclose(got.numpy(), want, rtol=1e-6, atol=1e-6):
            return f"gradient {i} ({op}): max difference {np.max(np.abs(got.numpy() - want))}"
    passed = out[-1]
    if not (np.array_equal(passed.values.numpy(), [[rank, rank]]) and np.array_equal(passed.indices.numpy(), [rank])):
        return f"the gradient of the sok.DynamicVariable was changed: {passed.values.numpy().tolist()}"
    return None


def check_indexed_slices(rank: int, n: int) -> str | None:
    emb = tf.keras.layers.Embedding(5, 2)
    emb.build((None,))
    grad = tf.IndexedSlices(tf.constant([[1.0 + rank, 2.0]]), tf.constant([rank], tf.int64), tf.constant([5, 2]))
    out = sok.allreduce_dense_gradients([grad], [emb.embeddings])[0]
    dense = tf.convert_to_tensor(out).numpy()
    want = np.zeros((5, 2), np.float32)
    for r in range(n):
        want[r] += np.array([1.0 + r, 2.0]) / n
    return None if np.allclose(dense, want) else f"got {dense.tolist()}, expected {want.tolist()}"


def check_two_dtypes_and_uneven_rows(rank: int, n: int) -> str | None:
    # float32 and float64 gradients (one fused allreduce per dtype, split back to each shape) and
    # IndexedSlices of int32 indices whose row count differs by rank, in one tf.function.
    shapes, dtypes = [(3, 2), (4,), (2, 2)], [tf.float32, tf.float64, tf.float32]
    variables = [tf.Variable(tf.zeros(shape, dtype)) for shape, dtype in zip(shapes, dtypes)]
    table = tf.Variable(tf.zeros([6, 2]))
    grads = [tf.fill(shape, tf.cast(rank + 1 + i, dtype)) for i, (shape, dtype) in enumerate(zip(shapes, dtypes))]
    indices = tf.range(rank + 1, dtype=tf.int32)
    rows = tf.IndexedSlices(tf.fill([rank + 1, 2], float(rank)), indices, tf.constant([6, 2]))

    @tf.function(autograph=False)
    def reduce(*dense: tf.Tensor) -> list:
        return sok.allreduce_dense_gradients([*dense, rows], [*variables, table], op="sum")

    out = reduce(*grads)
    for i, (shape, dtype) in enumerate(zip(shapes, dtypes)):
        want = sum(r + 1 + i for r in range(n))
        if out[i].dtype != dtype or tuple(out[i].shape) != shape or not np.all(out[i].numpy() == want):
            return f"gradient {i}: {out[i].dtype} {tuple(out[i].shape)} {out[i].numpy().tolist()}, want {want}"
    got = out[-1]
    want_rows = sum(r + 1 for r in range(n))
    if got.indices.dtype != tf.int32 or int(tf.size(got.indices)) != want_rows:
        return f"IndexedSlices: indices {got.indices.dtype} {got.indices.numpy().tolist()}, want {want_rows} int32"
    want_values = np.concatenate([np.full((r + 1, 2), float(r)) for r in range(n)])
    if not np.array_equal(got.values.numpy(), want_values):
        return f"IndexedSlices values {got.values.numpy().tolist()}"
    return None


def check_errors(rank: int, n: int) -> str | None:
    try:
        sok.broadcast_dense_variables([], root_rank=n)
    except ValueError as error:
        if f"root_rank {n} is not a rank" not in str(error):
            return f"unexpected message: {error}"
    else:
        return "root_rank out of range was accepted"
    try:
        sok.allreduce_dense_gradients([None], [], op="average")
    except ValueError as error:
        if "1 gradients for 0 variables" not in str(error):
            return f"unexpected message: {error}"
    else:
        return "a length mismatch was accepted"
    return None


def check_loss_scale_agreement(rank: int, n: int) -> str | None:
    # sok.OptimizerWrapper of a LossScaleOptimizer: a non-finite table gradient on one rank only
    # skips the step on every rank and halves the scale everywhere (the ranks keep one scale).
    table = sok.DynamicVariable(dimension=2, initializer="ones", name="scaled")
    dense = tf.Variable(np.ones(2, np.float32))
    scaler = tf.keras.optimizers.LossScaleOptimizer(tf.keras.optimizers.SGD(0.5), initial_scale=8.0)
    wrapper = sok.OptimizerWrapper(scaler)
    keys = tf.constant([rank], tf.int64)
    sok.assign(table, keys, tf.ones([1, 2]))

    @tf.function(autograph=False)
    def step(poison: tf.Tensor) -> None:
        with tf.GradientTape() as tape:
            rows = table.sparse_read(keys)
            loss = scaler.scale_loss(tf.reduce_sum(rows) + tf.reduce_sum(dense))
        table_grad, dense_grad = tape.gradient(loss, [table, dense])
        bad = tf.logical_and(poison, tf.equal(rank, 1))  # rank 1 only
        table_grad = tf.IndexedSlices(table_grad.values * tf.where(bad, np.inf, 1.0), table_grad.indices)
        wrapper.apply_gradients([(table_grad, table), (dense_grad, dense)])

    step(tf.constant(True))
    if float(scaler.dynamic_scale.numpy()) != 4.0:
        return f"after a step non-finite on rank 1: scale {scaler.dynamic_scale.numpy()}, expected 4.0"
    if not np.array_equal(table.sparse_read(keys).numpy(), [[1.0, 1.0]]) or not np.array_equal(dense.numpy(), [1, 1]):
        return "after a step non-finite on rank 1: the variables changed"
    step(tf.constant(False))
    want = 1.0 - 0.5  # SGD: lr 0.5 times the unscaled gradient 1
    if not np.allclose(table.sparse_read(keys).numpy(), [[want, want]]) or not np.allclose(dense.numpy(), want):
        return f"after a finite step: table {table.sparse_read(keys).numpy().tolist()}, dense {dense.numpy().tolist()}"
    return None


CHECKS = {
    "broadcast": check_broadcast,
    "allreduce_average_eager": lambda r, n: check_allreduce(r, n, "average", False),
    "allreduce_sum_function": lambda r, n: check_allreduce(r, n, "sum", True),
    "allreduce_indexed_slices": check_indexed_slices,
    "allreduce_two_dtypes_and_uneven_rows": check_two_dtypes_and_uneven_rows,
    "errors": check_errors,
    "loss_scale_agreement": check_loss_scale_agreement,
}


def main() -> int:
    import horovod.tensorflow as hvd

    print_stacks_before_timeout()
    hvd.init()
    sok.init()
    rank, n = hvd.rank(), hvd.size()
    failed = 0
    for name, check in CHECKS.items():
        try:
            problem = check(rank, n)
        except Exception:  # noqa: BLE001 (a check's crash is its failure, reported on one line)
            problem = " | ".join(traceback.format_exc().strip().splitlines()[-3:])
        failed += problem is not None
        print(f"CHECK {name} rank={rank} {'PASS' if problem is None else 'FAIL ' + problem}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
