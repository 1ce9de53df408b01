"""The bad inputs that ``SokSparseApplyAdagradTables`` refuses (CPU kernel).

Every call here has two tables, "first" and "second": the first always valid, the fault in the
second (or in an input of the whole call), so that a kernel that wrote a table before checking the
next one would be caught. Each refusal must raise its error type, name the offending
input and what is valid, and leave every table and accumulator as it was, bit for bit. Bad indices
are tested in test_optimizer_rowwise.py.
"""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
import sparse_operation_kit as sok  # noqa: E402
from sparse_operation_kit import tf_ops  # noqa: E402
from tensorflow.python.ops import resource_variable_ops  # noqa: E402

NAMES = ["first", "second"]
SHAPES = [(5, 3), (7, 2)]
IDS = [[0, 2, 2], [6, 1]]
#: How long a call may take before it counts as deadlocked (a variable locked twice never returns).
DEADLINE_S = 60.0


def rows(seed: int, shape, dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0.1, 1.0, shape).astype(dtype)


class Call:
    """Two valid tables with their accumulators, and the arguments of a valid call on them."""

    def __init__(self):
        self.tables = [tf.Variable(rows(t, s), name=n) for t, (s, n) in enumerate(zip(SHAPES, NAMES))]
        self.accumulators = [
            tf.Variable(rows(10 + t, s), name=f"{n}_acc") for t, (s, n) in enumerate(zip(SHAPES, NAMES))
        ]
        self.extra: list[tf.Variable] = []  # variables put in place of a table or accumulator by a test

    def variable(self, seed: int, shape, dtype=np.float32) -> tf.Variable:
        """A further variable, also checked for writes."""
        self.extra.append(tf.Variable(rows(seed, shape, dtype)))
        return self.extra[-1]

    def args(self, **overrides) -> dict:
        args = dict(
            tables=[v.handle for v in self.tables],
            accumulators=[a.handle for a in self.accumulators],
            learning_rate=tf.constant(0.1),
            indices=[tf.constant(ids, tf.int64) for ids in IDS],
            grads=[tf.constant(rows(20 + t, (len(ids), s[1]))) for t, (ids, s) in enumerate(zip(IDS, SHAPES))],
            epsilon=1e-7,
            names=NAMES,
        )
        args.update(overrides)
        return args

    def snapshot(self) -> list[np.ndarray]:
        return [v.numpy().copy() for v in self.tables + self.accumulators + self.extra]

    def assert_refused(self, error: type, pattern: str, **overrides) -> None:
        """The call with `overrides` raises `error` matching `pattern` and writes nothing."""
        before = self.snapshot()
        with pytest.raises(error, match=pattern):
            apply(self.args(**overrides))
        for b, a in zip(before, self.snapshot()):
            assert a.dtype == b.dtype and a.shape == b.shape
            assert a.tobytes() == b.tobytes()


def within_deadline(fn) -> None:
    """Runs `fn`, failing the test (instead of hanging it) if it does not return in time."""
    outcome: list[BaseException | None] = []

    def run():
        try:
            fn()
            outcome.append(None)
        except BaseException as error:  # handed to the test's thread
            outcome.append(error)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(DEADLINE_S)
    assert outcome, f"no return within {DEADLINE_S} s (deadlocked?)"
    if outcome[0] is not None:
        raise outcome[0]


def apply(args: dict) -> None:
    """SokSparseApplyAdagradTables with `args`, within the deadline."""
    within_deadline(lambda: tf_ops.library().sok_sparse_apply_adagrad_tables(**args))


@pytest.fixture
def call() -> Call:
    return Call()


def test_the_valid_call_writes_every_table_and_accumulator(call):
    """The calls below differ from this one in one input only: what they leave unwritten, this writes."""
    before = call.snapshot()
    apply(call.args())
    for b, a in zip(before, call.snapshot()):
        assert a.tobytes() != b.tobytes()


# -- the learning rate ------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [[1], [2], [1, 1]], ids=str)
def test_learning_rate_that_is_not_a_scalar(call, shape):
    call.assert_refused(
        tf.errors.InvalidArgumentError,
        rf"learning_rate must be a float32 scalar, got shape \[{','.join(map(str, shape))}\]",
        learning_rate=tf.fill(shape, 0.1),
    )


# -- indices and gradients --------------------------------------------------------------------


def test_indices_not_1d(call):
    call.assert_refused(
        tf.errors.InvalidArgumentError,
        r"indices\[1\] \(table second\) must be 1-D, got shape \[2,1\]",
        indices=[tf.constant(IDS[0], tf.int64), tf.constant([[6], [1]], tf.int64)],
    )


@pytest.mark.parametrize(
    "shape",
    [[4], [3, 2], [1, 2], [2, 3], [2, 1], [2, 2, 1]],
    ids=["rank-1", "more-rows", "fewer-rows", "wider", "narrower", "rank-3"],
)
def test_gradient_not_one_row_of_table_width_per_index(call, shape):
    grads = call.args()["grads"]
    call.assert_refused(
        tf.errors.InvalidArgumentError,
        rf"grads\[1\] \(table second\) must be \[2, 2\] \(one row of the table's width per index\), "
        rf"got \[{','.join(map(str, shape))}\]",
        grads=[grads[0], tf.ones(shape)],
    )


# -- the variables ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype, shape, got",
    [(np.float64, (7, 2), r"double \[7,2\]"), (np.float32, (7, 2, 1), r"float \[7,2,1\]")],
    ids=["float64", "rank-3"],
)
def test_table_not_a_float32_matrix(call, dtype, shape, got):
    table = call.variable(30, shape, dtype)
    accumulator = call.variable(31, shape, np.float32)
    call.assert_refused(
        tf.errors.InvalidArgumentError,
        rf"tables\[1\] \(table second\) must be a \[rows, dim\] variable of float32, got {got}",
        tables=[call.tables[0].handle, table.handle],
        accumulators=[call.accumulators[0].handle, accumulator.handle],
    )


TF_NAMES = {"float16": "half", "bfloat16": "bfloat16"}  # DataTypeString's names


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_table_needs_the_row_wise_step(call, dtype):
    """Half-width rows are updated by the row-wise step only (its float32 accumulators are one column);
    Keras' element-wise Adagrad refuses them, naming the dtype it takes."""
    table = tf.Variable(tf.cast(rows(30, (7, 2)), dtype))
    call.extra.append(table)
    call.assert_refused(
        tf.errors.InvalidArgumentError,
        rf"tables\[1\] \(table second\) must be a \[rows, dim\] variable of float32, got {TF_NAMES[dtype]} \[7,2\]",
        tables=[call.tables[0].handle, table.handle],
    )


def test_row_wise_table_of_a_dtype_rows_cannot_have(call):
    table = call.variable(30, (7, 2), np.float64)
    first_accumulator = call.variable(29, (5, 1), np.float32)
    accumulator = call.variable(31, (7, 1), np.float32)
    call.assert_refused(
        tf.errors.InvalidArgumentError,
        r"tables\[1\] \(table second\) must be a \[rows, dim\] variable of float32, float16 or bfloat16, got "
        r"double \[7,2\]",
        tables=[call.tables[0].handle, table.handle],
        accumulators=[first_accumulator.handle, accumulator.handle],
        row_wise=True,
    )


@pytest.mark.parametrize(
    "dtype, shape, got",
    [
        (np.float32, (6, 2), r"float \[6,2\]"),
        (np.float32, (7, 3), r"float \[7,3\]"),
        (np.float32, (14,), r"float \[14\]"),
        (np.float64, (7, 2), r"double \[7,2\]"),
        (np.float16, (7, 2), r"half \[7,2\]"),
    ],
    ids=["fewer-rows", "wider", "rank-1", "float64", "float16"],
)
def test_accumulator_unlike_its_table(call, dtype, shape, got):
    accumulator = call.variable(32, shape, dtype)
    call.assert_refused(
        tf.errors.InvalidArgumentError,
        rf"accumulators\[1\] \(table second\) is {got}; it must be float32 with the table's shape: float \[7,2\]",
        accumulators=[call.accumulators[0].handle, accumulator.handle],
    )


def test_row_wise_accumulator_is_one_column(call):
    """row_wise takes [rows, 1] accumulators: a table's own shape is refused, naming the one wanted."""
    call.assert_refused(
        tf.errors.InvalidArgumentError,
        r"accumulators\[0\] \(table first\) is float \[5,3\]; it must be float32 with the table's rows and one "
        r"column: float \[5,1\]",
        row_wise=True,
    )


def test_row_wise_step_of_distinct_rows():
    """row_wise: acc[i] += mean(g_i ** 2), w[i] -= lr * g_i / (sqrt(acc[i]) + eps), per distinct row, in
    float32 (NumPy's order within rounding); padding (-1) at the end of the indices is skipped."""
    table = tf.Variable(rows(1, (6, 3)))
    accumulator = tf.Variable(rows(2, (6, 1)))
    grads = rows(3, (4, 3))
    w, acc = table.numpy().astype(np.float64), accumulator.numpy().astype(np.float64)
    tf_ops.library().sok_sparse_apply_adagrad_tables(
        tables=[table.handle],
        accumulators=[accumulator.handle],
        learning_rate=tf.constant(0.1),
        indices=[tf.constant([4, 0, 2, -1], tf.int64)],
        grads=[tf.constant(grads)],
        epsilon=1e-3,
        check_indices=False,
        row_wise=True,
        names=["t"],
    )
    for i, row in enumerate([4, 0, 2]):
        acc[row] += np.mean(grads[i].astype(np.float64) ** 2)
        w[row] -= 0.1 * grads[i] / (np.sqrt(acc[row]) + 1e-3)
    np.testing.assert_allclose(accumulator.numpy(), acc, rtol=1e-6)
    np.testing.assert_allclose(table.numpy(), w, rtol=1e-6)


@pytest.mark.parametrize("role", ["tables", "accumulators"])
def test_handle_whose_variable_was_never_assigned(call, role):
    never_assigned = resource_variable_ops.var_handle_op(dtype=tf.float32, shape=[7, 2], shared_name="never_assigned")
    handles = call.args()[role]
    call.assert_refused(
        tf.errors.FailedPreconditionError,
        rf"{role}\[1\] \(table second\) has no variable: it was never assigned a value, or was deleted; "
        r"assign it one before the step \(.*never_assigned",
        **{role: [handles[0], never_assigned]},
    )


def test_handle_of_a_resource_that_is_not_a_variable(call):
    lookup_table = tf.lookup.experimental.MutableHashTable(tf.int64, tf.float32, 0.0)
    # With the variables on a GPU, TensorFlow's placer refuses the host-only hash table first.
    call.assert_refused(
        tf.errors.InvalidArgumentError,
        r"accumulators\[1\] \(table second\): Trying to access a handle's resource using the wrong type"
        r"|Cannot place the graph because a reference or resource edge connects colocation groups",
        accumulators=[call.accumulators[0].handle, lookup_table.resource_handle],
    )


# -- a variable given twice -------------------------------------------------------------------

#: (input replaced, by which variable, the two positions the error names, in input order).
TWICE = {
    "table-twice": ("tables", ("tables", 0), "tables\\[0\\] \\(table first\\) and tables\\[1\\] \\(table second\\)"),
    "accumulator-twice": (
        "accumulators",
        ("accumulators", 0),
        "accumulators\\[0\\] \\(table first\\) and accumulators\\[1\\] \\(table second\\)",
    ),
    "table-as-accumulator": (
        "accumulators",
        ("tables", 0),
        "tables\\[0\\] \\(table first\\) and accumulators\\[1\\] \\(table second\\)",
    ),
    "accumulator-as-table": (
        "tables",
        ("accumulators", 0),
        "accumulators\\[0\\] \\(table first\\) and tables\\[1\\] \\(table second\\)",
    ),
}


@pytest.mark.parametrize("case", list(TWICE))
def test_same_variable_twice_in_one_call(call, case):
    replaced, (source, index), positions = TWICE[case]
    handles = call.args()[replaced]
    twice = getattr(call, source)[index].handle
    call.assert_refused(
        tf.errors.InvalidArgumentError,
        positions + " are the same variable; nothing was updated. Every table and every accumulator of one call "
        "must be a different variable",
        **{replaced: [handles[0], twice]},
    )


def test_table_as_its_own_accumulator(call):
    call.assert_refused(
        tf.errors.InvalidArgumentError,
        r"tables\[1\] \(table second\) and accumulators\[1\] \(table second\) are the same variable",
        accumulators=[call.accumulators[0].handle, call.tables[1].handle],
    )


def test_wrapper_given_one_table_twice_refuses_and_writes_nothing():
    """Through sok.OptimizerWrapper: the same table twice in one apply_gradients is refused, naming
    the table, before its rows, its accumulator or the optimizer's step counter change."""
    table = sok.Variable(rows(40, SHAPES[1]))
    wrapper = sok.OptimizerWrapper(tf.keras.optimizers.Adagrad(learning_rate=0.1))
    grad = tf.IndexedSlices(tf.ones((2, 2)), tf.constant(IDS[1], tf.int64), tf.constant(SHAPES[1], tf.int64))
    wrapper.apply_gradients([(grad, table)])
    (accumulator,) = wrapper.static_slots(table).values()
    before = [table.numpy().tobytes(), accumulator.numpy().tobytes(), int(wrapper.optimizer.iterations.numpy())]
    with pytest.raises(ValueError, match=rf"variable {re.escape(table.name)} appears twice in one apply_gradients"):
        within_deadline(lambda: wrapper.apply_gradients([(grad, table), (grad, table)]))
    assert [table.numpy().tobytes(), accumulator.numpy().tobytes(), int(wrapper.optimizer.iterations.numpy())] == before


# -- the attributes ---------------------------------------------------------------------------


@pytest.mark.parametrize("names", [["first"], ["first", "second", "third"]], ids=["fewer", "more"])
def test_names_not_one_per_table(call, names):
    call.assert_refused(
        tf.errors.InvalidArgumentError,
        rf"SokSparseApplyAdagradTables has 2 tables but {len(names)} names; give one name per table",
        names=names,
    )
