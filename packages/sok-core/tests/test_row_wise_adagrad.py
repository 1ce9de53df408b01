"""sok.RowWiseAdagrad: one accumulator per row, alone and through sok.OptimizerWrapper.

Oracle: a NumPy step (repeated ids summed, ``acc += mean(g ** 2)`` per row, ``w -= lr * g /
(sqrt(acc) + eps)``), and the same optimizer on a plain ``tf.Variable``; a dynamic variable's rows
and a ``sok.Variable`` shard trained with it must equal them. Its state round-trips through
``sok.dump`` / ``sok.load`` as one float per row.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import sparse_operation_kit as sok  # noqa: E402
from sparse_operation_kit.checkpoint import format as fmt  # noqa: E402
from sparse_operation_kit.checkpoint import inspect as ckpt_inspect  # noqa: E402

LR, EPS, INIT = 0.1, 1e-8, 0.2
ROWS, DIM = 12, 4
#: ids per step (repeats within a step, rows untouched by every step)
STEPS = [[3, 7, 3], [0, 7, 11, 11, 11], [5]]


def numpy_steps(table: np.ndarray, grads: list[tuple[list[int], np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """The oracle: the table and its accumulators after row-wise Adagrad steps of ``(ids, values)``."""
    w, acc = table.astype(np.float64).copy(), np.full((table.shape[0], 1), INIT)
    for ids, values in grads:
        g = np.zeros_like(w)
        np.add.at(g, ids, values)
        rows = np.unique(ids)
        acc[rows] += np.mean(g[rows] ** 2, axis=1, keepdims=True)
        w[rows] -= LR * g[rows] / (np.sqrt(acc[rows]) + EPS)
    return w, acc


def optimizer() -> sok.RowWiseAdagrad:
    return sok.RowWiseAdagrad(learning_rate=LR, epsilon=EPS, initial_accumulator_value=INIT)


def gradients(seed: int = 0) -> list[tuple[list[int], np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [(ids, rng.standard_normal((len(ids), DIM)).astype(np.float32)) for ids in STEPS]


def start() -> np.ndarray:
    return np.random.default_rng(1).standard_normal((ROWS, DIM)).astype(np.float32)


def test_alone_sparse_and_dense_gradients_follow_the_numpy_step():
    v, opt = tf.Variable(start()), optimizer()
    for ids, values in gradients():
        opt.apply_gradients([(tf.IndexedSlices(tf.constant(values), tf.constant(ids)), v)])
    want_w, want_acc = numpy_steps(start(), gradients())
    np.testing.assert_allclose(v.numpy(), want_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(opt._accumulators[0].numpy(), want_acc, rtol=1e-5)

    dense, opt = tf.Variable(start()), optimizer()  # a dense gradient: every row is a row of the step
    full = np.random.default_rng(2).standard_normal((ROWS, DIM)).astype(np.float32)
    opt.apply_gradients([(tf.constant(full), dense)])
    want_w, _ = numpy_steps(start(), [(list(range(ROWS)), full)])
    np.testing.assert_allclose(dense.numpy(), want_w, rtol=1e-5, atol=1e-6)


def test_one_float_of_state_per_row_and_elementwise_below_rank_two():
    table, bias, opt = tf.Variable(start()), tf.Variable(np.ones(3, np.float32)), optimizer()
    opt.apply_gradients([(tf.ones_like(table), table), (tf.constant([1.0, 2.0, 3.0]), bias)])
    assert [tuple(a.shape) for a in opt._accumulators] == [(ROWS, 1), (3,)]
    acc = INIT + np.array([1.0, 4.0, 9.0])
    np.testing.assert_allclose(bias.numpy(), 1 - LR * np.array([1.0, 2.0, 3.0]) / (np.sqrt(acc) + EPS), rtol=1e-6)


@pytest.mark.parametrize("in_function", [False, True])
def test_wrapper_trains_dynamic_and_static_tables_as_a_plain_variable(in_function):
    """The same ids and gradients on a DynamicVariable (rows of width dim + 1), a sok.Variable shard
    and a tf.Variable: equal rows and accumulators, equal to the NumPy step."""
    initial = start()
    dynamic = sok.DynamicVariable(dimension=DIM, initializer="zeros", name="rw_dynamic")
    sok.assign(dynamic, tf.range(ROWS, dtype=tf.int64), initial)
    static = sok.Variable(initial.copy(), name="rw_static")
    plain = tf.Variable(initial.copy())
    wrapper, alone = sok.OptimizerWrapper(optimizer()), optimizer()

    def step(ids: tf.Tensor, values: tf.Tensor) -> None:
        grad = tf.IndexedSlices(values, ids)
        wrapper.apply_gradients([(grad, dynamic), (grad, static)])
        alone.apply_gradients([(grad, plain)])

    run = tf.function(step) if in_function else step
    for ids, values in gradients():
        run(tf.constant(ids, tf.int64), tf.constant(values))
    assert dynamic.storage.row_width == DIM + 1
    want_w, want_acc = numpy_steps(initial, gradients())
    keys, rows = sok.export(dynamic)
    order = np.argsort(keys.numpy())
    _, acc = sok.export(wrapper.slot_view(dynamic, "accumulator"))
    np.testing.assert_allclose(rows.numpy()[order], want_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(acc.numpy()[order], want_acc, rtol=1e-5)
    np.testing.assert_allclose(static.numpy(), plain.numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(plain.numpy(), want_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(wrapper.static_slots(static)["accumulator"].numpy(), want_acc, rtol=1e-5)


def test_state_dumps_and_loads_as_one_float_per_row(tmp_path):
    dynamic = sok.DynamicVariable(dimension=DIM, initializer="ones", name="rw_dump_dynamic")
    static = sok.Variable(start(), name="rw_dump_static")
    wrapper = sok.OptimizerWrapper(optimizer())
    for ids, values in gradients():
        grad = tf.IndexedSlices(tf.constant(values), tf.constant(ids, tf.int64))
        wrapper.apply_gradients([(grad, dynamic), (grad, static)])
    sok.dump(str(tmp_path), [dynamic, static], wrapper)
    tables = ckpt_inspect.inspect(str(tmp_path))["tables"]
    for table, rows in ((fmt.table_name(dynamic.name), len(set(sum(STEPS, [])))), (fmt.table_name(static.name), ROWS)):
        assert tables[table]["state_files"] == [fmt.state_file(table, "RowWiseAdagrad", "accumulator")]
        state = tmp_path / fmt.state_file(table, "RowWiseAdagrad", "accumulator")
        assert fmt.read_header(str(state)).elements == rows  # [rows, 1]

    loaded_dynamic = sok.DynamicVariable(dimension=DIM, initializer="zeros", name="rw_dump_dynamic")
    loaded_static = sok.Variable(np.zeros((ROWS, DIM), np.float32), name="rw_dump_static")
    loaded = sok.OptimizerWrapper(optimizer())
    loaded.optimizer.build([loaded_static])
    sok.load(str(tmp_path), [loaded_dynamic, loaded_static], loaded)
    for var, again, what in ((dynamic, loaded_dynamic, "accumulator"),):
        k1, w1 = sok.export(var)
        k2, w2 = sok.export(again)
        (_, a1), (_, a2) = sok.export(wrapper.slot_view(var, what)), sok.export(loaded.slot_view(again, what))
        o1, o2 = np.argsort(k1.numpy()), np.argsort(k2.numpy())
        np.testing.assert_array_equal(w1.numpy()[o1], w2.numpy()[o2])
        np.testing.assert_array_equal(a1.numpy()[o1], a2.numpy()[o2])
    np.testing.assert_array_equal(loaded_static.numpy(), static.numpy())
    np.testing.assert_array_equal(
        loaded.static_slots(loaded_static)["accumulator"].numpy(), wrapper.static_slots(static)["accumulator"].numpy()
    )


def test_an_adagrad_checkpoint_is_not_taken_as_row_wise_state(tmp_path):
    """Adagrad keeps one accumulator per column: its files are not row-wise state; the load says
    which file it looked for and how to load the weights alone."""
    v = sok.DynamicVariable(dimension=DIM, initializer="ones", name="rw_from_adagrad")
    adagrad = sok.OptimizerWrapper(tf.keras.optimizers.Adagrad(0.1))
    adagrad.apply_gradients([(tf.IndexedSlices(tf.ones([2, DIM]), tf.constant([1, 2], tf.int64)), v)])
    sok.dump(str(tmp_path), [v], adagrad)
    target = sok.DynamicVariable(dimension=DIM, initializer="zeros", name="rw_from_adagrad")
    missing = r"RowWiseAdagrad-accumulator is missing .*load without the optimizer"
    with pytest.raises(fmt.CheckpointError, match=missing):
        sok.load(str(tmp_path), [target], sok.OptimizerWrapper(optimizer()))


def test_a_per_row_slot_is_read_and_written_as_one_column():
    v = sok.DynamicVariable(dimension=DIM, initializer="ones", name="rw_slot")
    wrapper = sok.OptimizerWrapper(optimizer())
    wrapper.apply_gradients([(tf.IndexedSlices(tf.ones([1, DIM]), tf.constant([4], tf.int64)), v)])
    slot = wrapper.slot_view(v, "accumulator")
    assert slot.dimension == 1 and slot.columns == (DIM, DIM + 1)
    sok.assign(slot, tf.constant([4], tf.int64), tf.constant([[5.0]]))
    np.testing.assert_array_equal(sok.export(slot)[1].numpy(), [[5.0]])
    with pytest.raises(ValueError, match=r"values must have shape \[N, 1\], got \(1, 4\)"):
        sok.assign(slot, tf.constant([4], tf.int64), tf.ones([1, DIM]))


@pytest.mark.parametrize("option, value", [("epsilon", -1.0), ("initial_accumulator_value", -0.1), ("epsilon", "x")])
def test_negative_hyper_parameters_are_refused(option, value):
    with pytest.raises(ValueError, match=rf"RowWiseAdagrad {option} must be a number >= 0, got {value!r}"):
        sok.RowWiseAdagrad(**{option: value})


def test_the_wrapper_layout_keeps_one_column_of_state():
    wrapper = sok.OptimizerWrapper(optimizer())
    assert wrapper.name == "RowWiseAdagrad" and wrapper.get_slot_names() == ["accumulator"]
    assert wrapper.row_layout(8).parts == ((0, 8), (8, 9))
    assert os.path.basename(fmt.state_file("t", wrapper.name, "accumulator")) == "t-RowWiseAdagrad-accumulator"


def test_wrapper_steps_lookup_gradients_of_static_tables_in_one_op():
    """Gradients straight from sok.lookup_sparse (in a tf.function) take one row-wise
    SokSparseApplyAdagradTables op on their padded twin, with no tf.unique; the tables and their
    accumulators equal the same optimizer's own step on plain variables given those gradients."""
    initial = [start(), np.random.default_rng(2).standard_normal((7, 3)).astype(np.float32)]
    tables = [sok.Variable(x) for x in initial]
    references = [tf.Variable(x) for x in initial]
    wrapper, plain = sok.OptimizerWrapper(optimizer()), optimizer()
    ids = [tf.ragged.constant([[3, 7, 3], [], [0, 11, 11, 11]], tf.int64), tf.ragged.constant([[6], [1, 1], [0]])]

    def gradients_of_tables():
        with tf.GradientTape() as tape:
            out = sok.lookup_sparse(tables, ids, combiners=["sum", "mean"])
            loss = tf.add_n([tf.reduce_sum(o * o * (t + 1.0)) for t, o in enumerate(out)])
        return tape.gradient(loss, tables)

    @tf.function
    def step():
        wrapper.apply_gradients(zip(gradients_of_tables(), tables))

    @tf.function
    def reference():
        plain.apply_gradients(zip(gradients_of_tables(), references))

    graph = step.get_concrete_function().graph
    (apply,) = [op for op in graph.get_operations() if op.type == "SokSparseApplyAdagradTables"]
    assert apply.get_attr("row_wise") is True and apply.get_attr("check_indices") is False
    assert "Unique" not in [op.type for op in graph.get_operations()]
    for _ in range(3):
        reference()  # from the tables' rows, which equal the references' so far
        step()
        for t, table in enumerate(tables):
            np.testing.assert_allclose(table.numpy(), references[t].numpy(), rtol=2e-6, atol=1e-7)
            (accumulator,) = wrapper.static_slots(table).values()
            np.testing.assert_allclose(accumulator.numpy(), plain._accumulators[t].numpy(), rtol=2e-6, atol=1e-7)
            assert accumulator.shape == (initial[t].shape[0], 1)
