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


# -- many tables in one op (SokSparseApplyAdagradTables) ---------------------------------------
# The wrapper collects the steps of all sok.Variable shards and makes them with one op. Also: the
# traced step holds one such op and no Unique; indices made by SOK's own gradient op are not
# checked again; a bad index raises, naming it, and changes nothing; a read taken before the step
# keeps its values.

TABLE_SHAPES = [(13, 3), (7, 8), (29, 1)]
TABLE_RNG = np.random.default_rng(5)
TABLE_INITIAL = [TABLE_RNG.uniform(-1.0, 1.0, s).astype(np.float32) for s in TABLE_SHAPES]
TABLE_IDS = [[0, 3, 3, 12, 0], [6, 1], [28, 0, 28, 5, 9, 9]]


def table_gradients(step: int) -> list[tf.IndexedSlices]:
    out = []
    for t, ((rows, dim), ids) in enumerate(zip(TABLE_SHAPES, TABLE_IDS)):
        values = np.random.default_rng([step, t]).normal(0.0, 1.0, (len(ids), dim)).astype(np.float32)
        out.append(
            tf.IndexedSlices(tf.constant(values), tf.constant(ids, tf.int64), tf.constant([rows, dim], tf.int64))
        )
    return out


def make_tables_adagrad() -> K.Optimizer:
    return K.Adagrad(learning_rate=0.05, initial_accumulator_value=0.2, epsilon=1e-6)


def op_types(fn, *args) -> list[str]:
    return [op.type for op in fn.get_concrete_function(*args).graph.get_operations()]


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_many_tables_in_one_op_are_bitwise_keras(mode):
    tables = [sok.Variable(x) for x in TABLE_INITIAL]
    dense = tf.Variable(TABLE_INITIAL[0])
    references = [tf.Variable(x) for x in TABLE_INITIAL] + [tf.Variable(TABLE_INITIAL[0])]
    wrapper, keras = sok.OptimizerWrapper(make_tables_adagrad()), make_tables_adagrad()

    def step(grads):
        wrapper.apply_gradients(list(zip(grads + [grads[0]], tables + [dense])))
        keras.apply_gradients(list(zip(grads + [grads[0]], references)))

    step = tf.function(step) if mode == "function" else step
    for i in range(3):
        step(table_gradients(i))

    for t, table in enumerate(tables):
        assert_keras_equal(table.numpy(), references[t].numpy(), table)
        (accumulator,) = wrapper.static_slots(table).values()
        assert_keras_equal(accumulator.numpy(), keras._accumulators[t].numpy(), table)
    np.testing.assert_array_equal(dense.numpy(), references[-1].numpy())
    assert int(wrapper.optimizer.iterations.numpy()) == 3


def test_traced_step_has_one_op_for_all_tables_and_no_unique():
    tables = [sok.Variable(x) for x in TABLE_INITIAL]
    wrapper = sok.OptimizerWrapper(make_tables_adagrad())

    @tf.function
    def step(grads):
        wrapper.apply_gradients(list(zip(grads, tables)))

    types = op_types(step, table_gradients(0))
    assert types.count("SokSparseApplyAdagradTables") == 1
    assert "Unique" not in types and "ResourceScatterAdd" not in types


def test_indices_of_sok_gradient_op_are_not_checked_again():
    tables = [sok.Variable(x) for x in TABLE_INITIAL]
    wrapper = sok.OptimizerWrapper(make_tables_adagrad())
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
    for table, initial in zip(tables, TABLE_INITIAL):
        changed = ~np.isclose(table.numpy(), initial).all(axis=1)
        assert changed[:3].all() and not changed[3:].any()


def test_gradients_of_the_lookup_come_padded_and_update_as_keras():
    """In a traced step, the update takes the gradient op's padded twin (a row per id, -1 after the
    distinct ones: no size read back on a GPU); the original op is left with no consumer, and the
    tables and accumulators equal Keras' Adagrad on the original gradients."""
    tables = [sok.Variable(x) for x in TABLE_INITIAL]
    references = [tf.Variable(x) for x in TABLE_INITIAL]
    wrapper, keras = sok.OptimizerWrapper(make_tables_adagrad()), make_tables_adagrad()
    ids = [tf.ragged.constant([[0, 1, 1], [2], [], [3, 0, 3, 3]], tf.int64) for _ in tables]
    combiners = ["sum", "mean", "sqrtn"]

    def gradients():
        with tf.GradientTape() as tape:
            out = sok.lookup_sparse(tables, ids, combiners=combiners)
            loss = tf.add_n([tf.reduce_sum(o * o * (t + 1.0)) for t, o in enumerate(out)])
        return tape.gradient(loss, tables)

    @tf.function
    def step():
        wrapper.apply_gradients(zip(gradients(), tables))

    @tf.function
    def reference():
        keras.apply_gradients(zip(gradients(), references))

    graph = step.get_concrete_function().graph
    (apply,) = [op for op in graph.get_operations() if op.type == "SokSparseApplyAdagradTables"]
    grads = [op for op in graph.get_operations() if op.type == "SokPooledLookupGrad"]
    assert sorted(op.get_attr("padded") for op in grads) == [False, True]
    original = next(op for op in grads if not op.get_attr("padded"))
    assert all(not out.consumers() for out in original.outputs)
    assert {x.op.get_attr("padded") for x in apply.inputs[-2 * len(tables) :]} == {True}
    for _ in range(3):
        reference()  # from the tables' rows, which equal the references' so far
        step()
        for t, table in enumerate(tables):
            assert_keras_equal(table.numpy(), references[t].numpy(), table)
            (accumulator,) = wrapper.static_slots(table).values()
            assert_keras_equal(accumulator.numpy(), keras._accumulators[t].numpy(), table)


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_bad_index_raises_naming_it_and_changes_nothing(mode):
    tables = [sok.Variable(x) for x in TABLE_INITIAL]
    wrapper = sok.OptimizerWrapper(make_tables_adagrad())
    wrapper.apply_gradients(zip(table_gradients(0), tables))
    before = [t.numpy() for t in tables]
    accumulators_before = [a.numpy() for t in tables for a in wrapper.static_slots(t).values()]
    grads = table_gradients(1)
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
    table = sok.Variable(TABLE_INITIAL[0])
    wrapper = sok.OptimizerWrapper(make_tables_adagrad())
    read = table.value()  # shares the variable's buffer until the step writes
    wrapper.apply_gradients([(table_gradients(0)[0], table)])
    np.testing.assert_array_equal(read.numpy(), TABLE_INITIAL[0])
    assert not np.array_equal(table.numpy(), TABLE_INITIAL[0])
