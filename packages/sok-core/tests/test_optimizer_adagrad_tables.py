"""Keras 3 Adagrad on many static tables in one op (``SokSparseApplyAdagradTables``).

``sok.OptimizerWrapper(Adagrad)`` collects the steps of all ``sok.Variable`` shards with
``IndexedSlices`` gradients and makes them with one op. Oracle: Keras' own Adagrad on plain
``tf.Variable`` tables with the same gradients, bitwise on the CPU. Also: the traced step holds one
such op and no ``Unique``; indices made by SOK's own gradient op are not checked again; a bad index
raises, naming it, and changes nothing; a read taken before the step keeps its values.
"""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
import sparse_operation_kit as sok  # noqa: E402

K = tf.keras.optimizers
SHAPES = [(13, 3), (7, 8), (29, 1)]
RNG = np.random.default_rng(5)
INITIAL = [RNG.uniform(-1.0, 1.0, s).astype(np.float32) for s in SHAPES]
IDS = [[0, 3, 3, 12, 0], [6, 1], [28, 0, 28, 5, 9, 9]]


def assert_keras_equal(actual: np.ndarray, expected: np.ndarray, variable) -> None:
    """Bitwise on the CPU; on a GPU within float rounding (rows repeated in a gradient are added with
    atomics in any order, by Keras' scatter kernels as by SOK's)."""
    if "GPU" in variable.device:
        np.testing.assert_allclose(actual, expected, rtol=2e-6, atol=1e-7)
    else:
        np.testing.assert_array_equal(actual, expected)


def gradients(step: int) -> list[tf.IndexedSlices]:
    out = []
    for t, ((rows, dim), ids) in enumerate(zip(SHAPES, IDS)):
        values = np.random.default_rng([step, t]).normal(0.0, 1.0, (len(ids), dim)).astype(np.float32)
        out.append(
            tf.IndexedSlices(tf.constant(values), tf.constant(ids, tf.int64), tf.constant([rows, dim], tf.int64))
        )
    return out


def make_adagrad() -> K.Optimizer:
    return K.Adagrad(learning_rate=0.05, initial_accumulator_value=0.2, epsilon=1e-6)


def op_types(fn, *args) -> list[str]:
    return [op.type for op in fn.get_concrete_function(*args).graph.get_operations()]


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_many_tables_in_one_op_are_bitwise_keras(mode):
    tables = [sok.Variable(x) for x in INITIAL]
    dense = tf.Variable(INITIAL[0])
    references = [tf.Variable(x) for x in INITIAL] + [tf.Variable(INITIAL[0])]
    wrapper, keras = sok.OptimizerWrapper(make_adagrad()), make_adagrad()

    def step(grads):
        wrapper.apply_gradients(list(zip(grads + [grads[0]], tables + [dense])))
        keras.apply_gradients(list(zip(grads + [grads[0]], references)))

    step = tf.function(step) if mode == "function" else step
    for i in range(3):
        step(gradients(i))

    for t, table in enumerate(tables):
        assert_keras_equal(table.numpy(), references[t].numpy(), table)
        (accumulator,) = wrapper.static_slots(table).values()
        assert_keras_equal(accumulator.numpy(), keras._accumulators[t].numpy(), table)
    np.testing.assert_array_equal(dense.numpy(), references[-1].numpy())
    assert int(wrapper.optimizer.iterations.numpy()) == 3


def test_traced_step_has_one_op_for_all_tables_and_no_unique():
    tables = [sok.Variable(x) for x in INITIAL]
    wrapper = sok.OptimizerWrapper(make_adagrad())

    @tf.function
    def step(grads):
        wrapper.apply_gradients(list(zip(grads, tables)))

    types = op_types(step, gradients(0))
    assert types.count("SokSparseApplyAdagradTables") == 1
    assert "Unique" not in types and "ResourceScatterAdd" not in types


def test_indices_of_sok_gradient_op_are_not_checked_again():
    tables = [sok.Variable(x) for x in INITIAL]
    wrapper = sok.OptimizerWrapper(make_adagrad())
    ids = [tf.ragged.constant([[0, 1], [2]], tf.int64) for _ in tables]

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            out = sok.lookup_sparse(tables, ids, combiners=["sum"] * len(tables))
            loss = tf.add_n([tf.reduce_sum(o * o) for o in out])
        wrapper.apply_gradients(zip(tape.gradient(loss, tables), tables))

    ops = [op for op in step.get_concrete_function().graph.get_operations() if op.type == "SokSparseApplyAdagradTables"]
    assert len(ops) == 1 and ops[0].get_attr("check_indices") is False
    step()
    for table, initial in zip(tables, INITIAL):
        changed = ~np.isclose(table.numpy(), initial).all(axis=1)
        assert changed[:3].all() and not changed[3:].any()


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_bad_index_raises_naming_it_and_changes_nothing(mode):
    tables = [sok.Variable(x) for x in INITIAL]
    wrapper = sok.OptimizerWrapper(make_adagrad())
    wrapper.apply_gradients(zip(gradients(0), tables))
    before = [t.numpy() for t in tables]
    accumulators_before = [a.numpy() for t in tables for a in wrapper.static_slots(t).values()]
    grads = gradients(1)
    grads[1] = tf.IndexedSlices(grads[1].values, tf.constant([6, 7], tf.int64), grads[1].dense_shape)

    def step(grads):
        wrapper.apply_gradients(zip(grads, tables))

    step = tf.function(step) if mode == "function" else step
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"indices\[1\]\[1\] = 7 is outside \[0, 7\)"):
        step(grads)
    for table, b in zip(tables, before):
        np.testing.assert_array_equal(table.numpy(), b)
    after = [a.numpy() for t in tables for a in wrapper.static_slots(t).values()]
    for a, b in zip(after, accumulators_before):
        np.testing.assert_array_equal(a, b)


def test_a_read_before_the_step_keeps_its_values():
    table = sok.Variable(INITIAL[0])
    wrapper = sok.OptimizerWrapper(make_adagrad())
    read = table.value()  # shares the variable's buffer until the step writes
    wrapper.apply_gradients([(gradients(0)[0], table)])
    np.testing.assert_array_equal(read.numpy(), INITIAL[0])
    assert not np.array_equal(table.numpy(), INITIAL[0])
