"""sok.OptimizerWrapper's row-wise Adagrad step for static tables (``sok.Variable`` shards).

The oracle is Keras 3's own Adagrad applied to a plain ``tf.Variable`` with the same rows and the
same ``IndexedSlices`` gradients (repeated ids across steps, duplicate ids within a step): the
wrapper's row-wise step must give bitwise the same variable and accumulator (on a GPU, within float
rounding: repeated ids are added with atomics there, by Keras as by SOK). Rows outside the batch
are not read or written: a NaN planted in one stays where it is (Keras' sparse division widens its
update to rows whose ``sqrt(accumulator + epsilon)`` is zero or NaN).
"""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
import sparse_operation_kit as sok  # noqa: E402

K = tf.keras.optimizers
ROWS, DIM = 13, 3  # odd sizes, so that no row or table is a whole number of SIMD packets
INITIAL = np.random.default_rng(1).uniform(-1.0, 1.0, (ROWS, DIM)).astype(np.float32)
# Per step: ids with duplicates (in and across steps), and rows 11 and 12 never in a batch.
STEP_IDS = [[0, 3, 3, 7, 0, 3], [5, 3, 10, 5], [7, 7, 7, 1, 2, 0], [3, 9, 4, 6, 8, 3]]
UNTOUCHED = [11, 12]


def assert_keras_equal(actual: np.ndarray, expected: np.ndarray, variable) -> None:
    """Bitwise on the CPU; on a GPU within float rounding (rows repeated in a gradient are added with
    atomics in any order, by Keras' scatter kernels as by SOK's)."""
    if "GPU" in variable.device:
        np.testing.assert_allclose(actual, expected, rtol=2e-6, atol=1e-7)
    else:
        np.testing.assert_array_equal(actual, expected)


def gradients(step: int) -> tf.IndexedSlices:
    ids = tf.constant(STEP_IDS[step], tf.int64)
    values = np.random.default_rng(100 + step).normal(0.0, 1.0, (len(STEP_IDS[step]), DIM)).astype(np.float32)
    return tf.IndexedSlices(tf.constant(values), ids, tf.constant([ROWS, DIM], tf.int64))


def make_adagrad() -> K.Optimizer:
    return K.Adagrad(learning_rate=0.1, initial_accumulator_value=0.3, epsilon=1e-5)


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_rowwise_adagrad_is_bitwise_keras(mode):
    table = sok.Variable(INITIAL)
    reference = tf.Variable(INITIAL)
    wrapper = sok.OptimizerWrapper(make_adagrad())
    keras = make_adagrad()

    def step(g):
        wrapper.apply_gradients([(g, table)])
        keras.apply_gradients([(g, reference)])

    step = tf.function(step) if mode == "function" else step
    for i in range(len(STEP_IDS)):
        step(gradients(i))

    assert_keras_equal(table.numpy(), reference.numpy(), table)
    (accumulator,) = wrapper.static_slots(table).values()
    assert_keras_equal(accumulator.numpy(), keras._accumulators[0].numpy(), table)
    assert accumulator is wrapper.optimizer._accumulators[0]
    assert int(wrapper.optimizer.iterations.numpy()) == len(STEP_IDS)
    assert not np.array_equal(table.numpy(), INITIAL)  # the steps did change the table
    np.testing.assert_array_equal(table.numpy()[UNTOUCHED], INITIAL[UNTOUCHED])


def test_rowwise_adagrad_leaves_rows_outside_the_batch():
    table = sok.Variable(INITIAL)
    wrapper = sok.OptimizerWrapper(make_adagrad())
    wrapper.apply_gradients([(gradients(0), table)])
    (accumulator,) = wrapper.static_slots(table).values()
    planted = accumulator.numpy()
    planted[UNTOUCHED[0]] = np.nan
    accumulator.assign(planted)

    for i in range(1, len(STEP_IDS)):
        wrapper.apply_gradients([(gradients(i), table)])

    after = accumulator.numpy()
    assert np.isnan(after[UNTOUCHED[0]]).all()  # the NaN stays where it was
    assert np.isfinite(np.delete(after, UNTOUCHED[0], axis=0)).all()  # and spreads nowhere
    assert np.isfinite(table.numpy()).all()
    np.testing.assert_array_equal(table.numpy()[UNTOUCHED], INITIAL[UNTOUCHED])
    np.testing.assert_array_equal(after[UNTOUCHED[1]], planted[UNTOUCHED[1]])


def test_dense_variables_keep_the_keras_step():
    """Only sok.Variable shards take the row-wise step; a plain tf.Variable beside them, given the
    same wrapper, is updated by Keras' own step (bitwise as by a second Keras Adagrad)."""
    table, dense, reference = sok.Variable(INITIAL), tf.Variable(INITIAL), tf.Variable(INITIAL)
    wrapper, keras = sok.OptimizerWrapper(make_adagrad()), make_adagrad()
    for i in range(len(STEP_IDS)):
        wrapper.apply_gradients([(gradients(i), table), (gradients(i), dense)])
        keras.apply_gradients([(gradients(i), reference)])
    np.testing.assert_array_equal(dense.numpy(), reference.numpy())
    assert_keras_equal(table.numpy(), reference.numpy(), table)
    assert "update_step" not in vars(wrapper.optimizer)  # the Keras optimizer's own step again
