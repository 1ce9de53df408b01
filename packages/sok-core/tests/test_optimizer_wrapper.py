"""sok.OptimizerWrapper and sok.SGD: row-wise Keras-3 updates of sok.DynamicVariable rows.

The oracle is the wrapped Keras optimizer itself, applied to a plain ``tf.Variable`` holding the
same rows and read with ``tf.gather``. Every row is touched at every step there, so Keras' dense
update and the wrapper's lazy one must agree. Reference §1.9.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
from collections.abc import Iterator

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
import sparse_operation_kit as sok  # noqa: E402
from sparse_operation_kit import table_ref  # noqa: E402
from sparse_operation_kit.testing.abi_fields import field_offset  # noqa: E402

VAR_TYPES = ["hbm", "hybrid"]
OPTIONS = {"hbm": {}, "hybrid": {"init_capacity": 1024, "max_capacity": 1 << 16}}
MODES = ["eager", "function"]
K = tf.keras.optimizers


def make_var(var_type: str, dimension: int = 4, **kwargs) -> sok.DynamicVariable:
    return sok.DynamicVariable(dimension=dimension, var_type=var_type, **OPTIONS[var_type], **kwargs)


def exported(var) -> tuple[np.ndarray, np.ndarray]:
    """sok.export sorted by key (hkv exports in table order)."""
    keys, values = sok.export(var)
    keys, values = keys.numpy(), values.numpy()
    order = np.argsort(keys, kind="stable")
    return keys[order], values[order]


def compiled(fn, mode):
    return tf.function(fn) if mode == "function" else fn


# -- the oracle: the same Keras optimizer on a tf.Variable ------------------------------------

V, D, STEPS = 6, 4, 5
INITIAL = np.random.default_rng(0).uniform(-1.0, 1.0, (V, D)).astype(np.float32)
# Every key 0..V-1 at every step, with duplicates (0 twice, 3 three times).
IDS = tf.constant([0, 1, 2, 3, 4, 5, 0, 3, 3], tf.int64)
WEIGHTS = tf.constant(np.linspace(0.5, 1.5, 9, dtype=np.float32).reshape(9, 1))

OPTIMIZERS = {
    "SGD": lambda: K.SGD(learning_rate=0.1),
    "SGD-momentum": lambda: K.SGD(learning_rate=0.1, momentum=0.9),
    "SGD-nesterov": lambda: K.SGD(learning_rate=0.1, momentum=0.9, nesterov=True),
    "Adagrad": lambda: K.Adagrad(learning_rate=0.1),
    "Adagrad-custom": lambda: K.Adagrad(learning_rate=0.2, initial_accumulator_value=0.5, epsilon=1e-3),
    "Adam": lambda: K.Adam(learning_rate=0.05),
    "Adam-amsgrad": lambda: K.Adam(learning_rate=0.05, amsgrad=True),
    "Adamax": lambda: K.Adamax(learning_rate=0.05),
    "Adadelta": lambda: K.Adadelta(learning_rate=1.0),
    "Ftrl": lambda: K.Ftrl(learning_rate=0.1),
    "Ftrl-regularized": lambda: K.Ftrl(
        learning_rate=0.1,
        l1_regularization_strength=0.01,
        l2_regularization_strength=0.01,
        l2_shrinkage_regularization_strength=0.01,
        beta=0.1,
    ),
    "RMSprop": lambda: K.RMSprop(learning_rate=0.01),
    "RMSprop-momentum-centered": lambda: K.RMSprop(learning_rate=0.01, momentum=0.9, centered=True),
    "RowWiseAdagrad": lambda: sok.RowWiseAdagrad(learning_rate=0.1),
}


def weighted_square_loss(embeddings):
    return tf.reduce_sum(WEIGHTS * tf.square(embeddings))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("var_type", VAR_TYPES)
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_matches_keras_on_a_dense_variable(name, var_type, mode):
    v = make_var(var_type, dimension=D, initializer="zeros")
    sok.assign(v, tf.range(V, dtype=tf.int64), INITIAL)
    dense = tf.Variable(INITIAL)
    wrapper, keras = sok.OptimizerWrapper(OPTIMIZERS[name]()), OPTIMIZERS[name]()

    def sok_step():
        with tf.GradientTape() as tape:
            loss = weighted_square_loss(tf.nn.embedding_lookup(v, IDS))
        wrapper.apply_gradients(zip(tape.gradient(loss, [v]), [v]))

    def keras_step():
        with tf.GradientTape() as tape:
            loss = weighted_square_loss(tf.gather(dense, IDS))
        # Densified: Keras 3's own IndexedSlices path mishandles duplicate indices (squares each
        # duplicate's gradient separately, or fails for centered RMSprop).
        keras.apply_gradients([(tf.convert_to_tensor(tape.gradient(loss, dense)), dense)])

    sok_step, keras_step = compiled(sok_step, mode), compiled(keras_step, mode)
    for _ in range(STEPS):
        sok_step()
        keras_step()
    keys, values = exported(v)
    assert keys.tolist() == list(range(V))
    assert np.abs(dense.numpy() - INITIAL).max() > 1e-3  # the oracle did move
    np.testing.assert_allclose(values, dense.numpy(), rtol=1e-5, atol=1e-6)
    assert int(wrapper.iterations.numpy()) == STEPS


#: The optimizers whose rule also runs natively (SokSparseApply, one op per step on CPU tables).
NATIVE = ["SGD", "SGD-momentum", "SGD-nesterov", "Adagrad", "Adagrad-custom", "RowWiseAdagrad"]


@pytest.mark.parametrize("var_type", VAR_TYPES)
@pytest.mark.parametrize("name", NATIVE)
def test_native_rule_equals_the_tensorflow_ops_bit_for_bit(name, var_type):
    # The ops run eagerly: inside tf.function grappler rewrites x / sqrt(y) into x * rsqrt(y), one ulp
    # off at times; the native rule computes the formula as written, in tf.function too.
    def train(native: bool) -> np.ndarray:
        v = make_var(var_type, dimension=D, initializer="zeros")
        sok.assign(v, tf.range(V, dtype=tf.int64), INITIAL)
        wrapper = sok.OptimizerWrapper(OPTIMIZERS[name]())
        assert wrapper._rule.native is not None
        if not native:
            wrapper._rule = dataclasses.replace(wrapper._rule, native=None)

        def step():
            with tf.GradientTape() as tape:
                loss = weighted_square_loss(tf.nn.embedding_lookup(v, IDS))
            wrapper.apply_gradients(zip(tape.gradient(loss, [v]), [v]))

        step = tf.function(step) if native else step
        for _ in range(STEPS):
            step()
        return exported(v)[1]

    native, ops = train(native=True), train(native=False)
    if name == "RowWiseAdagrad":  # the mean over a row: TensorFlow's reduction adds in its own order
        np.testing.assert_allclose(native, ops, rtol=2e-6, atol=1e-7)
    elif make_var(var_type).storage.device == "cpu":
        np.testing.assert_array_equal(native, ops)
    else:  # TensorFlow's GPU kernels of sqrt and division are not correctly rounded: the ops and the
        # native rule's kernel agree to a few ulp, not to the bit
        np.testing.assert_allclose(native, ops, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_native_step_reuses_the_distinct_keys_of_its_lookup(var_type):
    # One SokUniqueIndex per step: the optimizer takes the lookup's distinct keys and positions.
    v = make_var(var_type, dimension=D)
    wrapper = sok.OptimizerWrapper(K.Adagrad(learning_rate=0.1))

    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            loss = weighted_square_loss(tf.nn.embedding_lookup(v, ids))
        wrapper.apply_gradients(zip(tape.gradient(loss, [v]), [v]))

    step(IDS)
    ops = step.get_concrete_function(IDS).graph.get_operations()
    op_types = [op.type for op in ops]
    assert op_types.count("SokUniqueIndex") == 1 and "SokSparseApply" in op_types
    # SOK's own index: the update does not check its positions again (a wait for the GPU).
    assert all(op.get_attr("positions_checked") for op in ops if op.type == "SokSparseApply")


@pytest.mark.parametrize("promised", [True, False])
def test_native_step_indexes_keys_promised_distinct_not_again(promised):
    # The multi-rank lookup_sparse reads tf.unique's keys with try_sparse_read(..., distinct=True):
    # the step then takes them as their own index (no SokUniqueIndex); unpromised, it indexes them.
    from sparse_operation_kit.dynamic_variable import try_sparse_read

    v = make_var("hbm", dimension=D, initializer="1")
    wrapper = sok.OptimizerWrapper(K.Adagrad(learning_rate=0.1))

    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(try_sparse_read(v, tf.unique(ids)[0], distinct=promised)[0]))
        wrapper.apply_gradients(zip(tape.gradient(loss, [v]), [v]))

    step(IDS)
    op_types = [op.type for op in step.get_concrete_function(IDS).graph.get_operations()]
    assert op_types.count("SokUniqueIndex") == (0 if promised else 1) and "SokSparseApply" in op_types
    # Each key read once: gradient 2 * w = 2; one Keras 3 Adagrad step from accumulator 0.1.
    oracle = np.ones(D, np.float32) - 0.1 * 2.0 / np.sqrt(0.1 + 4.0 + 1e-7)
    np.testing.assert_allclose(exported(v)[1], np.tile(oracle, (V, 1)), rtol=1e-6)


def test_a_wrapper_binds_the_variables_it_updates():
    v = make_var("hbm", dimension=D)
    first, second = sok.OptimizerWrapper(K.Adagrad(0.1)), sok.OptimizerWrapper(K.Adagrad(0.1))
    assert v.optimizer_wrapper is None
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.embedding_lookup(v, IDS))
    first.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
    assert v.optimizer_wrapper is first
    v.bind_optimizer_wrapper(first)  # the same wrapper again: nothing changes
    with pytest.raises(ValueError, match="wrapper does not change"):
        v.bind_optimizer_wrapper(second)
    assert v.optimizer_wrapper is first


def test_native_rule_refuses_rows_of_another_width():
    from sparse_operation_kit import tf_ops

    v = make_var("hbm", dimension=D)  # rows of D floats: no room for Adagrad's accumulator
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"need table rows of {2 * D} floats"):
        distinct, positions = tf_ops.library().sok_unique_index(IDS)
        tf_ops.library().sok_sparse_apply(
            *v.table_inputs, distinct, positions, tf.ones([9, D]), tf.constant(0.1), rule="adagrad", hyper=[1e-7, 0.0]
        )


# SOK_ERROR_UNSUPPORTED from an update_rows (its arguments: 11 words, unread).
_UNSUPPORTED_UPDATE_ROWS = ctypes.CFUNCTYPE(ctypes.c_int, *[ctypes.c_void_p] * 11)(lambda *args: 3)
WITHOUT_UPDATE_ROWS = ["old header", "unsupported"]


@contextlib.contextmanager
def without_update_rows(how: str) -> Iterator[None]:
    """Tables made inside are driven through a copy of their backend's function table without
    update_rows: one built against the header before it (``"old header"``: its struct_size ends
    before the field), or one whose update_rows answers SOK_ERROR_UNSUPPORTED (``"unsupported"``,
    sok::Storage's default)."""
    original, copies = table_ref.native_pointers, []

    def native_pointers(storage):
        api, handle = original(storage)
        size = ctypes.c_uint32.from_address(api + 4).value  # sok_storage_api.struct_size
        copy = ctypes.create_string_buffer(ctypes.string_at(api, size), size)
        field = field_offset("update_rows")
        if how == "old header":
            ctypes.c_uint32.from_buffer(copy, 4).value = field
        else:
            unsupported = ctypes.cast(_UNSUPPORTED_UPDATE_ROWS, ctypes.c_void_p).value
            ctypes.c_void_p.from_buffer(copy, field).value = unsupported
        copies.append(copy)  # alive while the tables made inside are used
        return ctypes.addressof(copy), handle

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(table_ref, "native_pointers", native_pointers)
        yield


def train_native(var_type: str, erase_before_update: bool = False, **options) -> tuple[np.ndarray, ...]:
    """(keys, rows, scores) after STEPS Adagrad steps through SokSparseApply; with
    erase_before_update, key 3 leaves the table between the last lookup and its update."""
    v = make_var(var_type, dimension=D, initializer="zeros", **options)
    sok.assign(v, tf.range(V, dtype=tf.int64), INITIAL)
    wrapper = sok.OptimizerWrapper(OPTIMIZERS["Adagrad"]())
    for step in range(STEPS):
        with tf.GradientTape() as tape:
            loss = weighted_square_loss(tf.nn.embedding_lookup(v, IDS))
        grads = tape.gradient(loss, [v])
        if erase_before_update and step == STEPS - 1:
            assert v.storage.erase(np.array([3])) == 1
        wrapper.apply_gradients(zip(grads, [v]))
    keys, values, scores = v.storage.export(columns=(0, v.storage.row_width))
    order = np.argsort(keys, kind="stable")
    return keys[order], values[order], scores[order]


@pytest.mark.parametrize("how", WITHOUT_UPDATE_ROWS)
@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_native_step_without_update_rows_gives_the_same_rows(var_type, how):
    in_place = train_native(var_type)
    with without_update_rows(how):
        copied = train_native(var_type)
    np.testing.assert_array_equal(in_place[0], copied[0])
    np.testing.assert_array_equal(in_place[1], copied[1])


@pytest.mark.parametrize("how", WITHOUT_UPDATE_ROWS)
def test_native_step_without_update_rows_reads_and_writes_copies(how):
    """The copy path (find_or_insert, insert_or_assign) counts two LFU accesses per update where
    update_rows counts one, as one insert_or_assign: so the fallback did run. Host tables: update_rows
    is for host rows (a GPU table always takes the copy path)."""
    with tf.device("/CPU:0"):
        in_place = train_native("hybrid", evict_strategy="lfu")
        with without_update_rows(how):
            copied = train_native("hybrid", evict_strategy="lfu")
    np.testing.assert_array_equal(copied[2] - in_place[2], np.full(V, STEPS, np.uint64))


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_native_step_reinserts_keys_that_left_since_the_lookup(var_type):
    """update_rows finds key 3 missing and changes nothing; the op then takes the copy path, which
    inserts it with initial values and updates it (as the TensorFlow-ops path does)."""
    in_place = train_native(var_type, erase_before_update=True)
    with without_update_rows("old header"):
        copied = train_native(var_type, erase_before_update=True)
    assert in_place[0].tolist() == list(range(V))
    np.testing.assert_array_equal(in_place[1], copied[1])
    assert not np.array_equal(in_place[1], train_native(var_type)[1])  # key 3 restarted


# -- lazy updates ------------------------------------------------------------------------------

LAZY = {
    "SGD-momentum": lambda: K.SGD(learning_rate=0.1, momentum=0.9),
    "Adam": lambda: K.Adam(learning_rate=0.05),
    "RMSprop-momentum": lambda: K.RMSprop(learning_rate=0.01, momentum=0.9),
}


def check_untouched_rows_stay_bit_identical(optimizer, var_type: str) -> None:
    """Rows a step does not touch keep their values and state bit for bit (any Keras flavour)."""
    v = make_var(var_type, dimension=D, initializer="zeros")
    sok.assign(v, tf.range(V, dtype=tf.int64), INITIAL)
    opt = sok.OptimizerWrapper(optimizer)

    def step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(tf.nn.embedding_lookup(v, tf.constant(ids, tf.int64))))
        opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))

    step([0, 1, 2])  # rows 0-2 get optimizer state
    after_first = exported(v)[1]
    for _ in range(3):
        step([0, 1])  # row 2 has state but is not touched again; rows 3-5 never are
    _, values = exported(v)
    np.testing.assert_array_equal(values[2], after_first[2])
    np.testing.assert_array_equal(values[3:], INITIAL[3:])
    assert not np.array_equal(values[:2], after_first[:2])


def check_learning_rate_schedule_is_followed(sgd_with_schedule, var_type: str, mode: str) -> None:
    """``sgd_with_schedule``: an SGD whose learning rate is ExponentialDecay(0.1, decay_steps=1,
    decay_rate=0.5), of any Keras flavour."""
    v = make_var(var_type, dimension=2, initializer="1")
    opt = sok.OptimizerWrapper(sgd_with_schedule)
    ids = tf.constant([4, 9], tf.int64)

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.nn.embedding_lookup(v, ids))
        opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))

    step = compiled(step, mode)
    for _ in range(3):
        step()
    # lr 0.1, 0.05, 0.025 on a gradient of 1
    np.testing.assert_allclose(exported(v)[1], np.full((2, 2), 1.0 - 0.175), rtol=1e-6)


def check_learning_rate_change_after_tracing_is_followed(sgd, set_learning_rate, var_type: str) -> None:
    """``sgd``: an SGD with learning rate 0.5; ``set_learning_rate(sgd, 0.25)`` changes it the way
    that flavour's users do."""
    v = make_var(var_type, dimension=2, initializer="1")
    opt = sok.OptimizerWrapper(sgd)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.nn.embedding_lookup(v, tf.constant([3], tf.int64)))
        opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))

    step()
    set_learning_rate(sgd, 0.25)
    step()
    np.testing.assert_allclose(exported(v)[1], [[0.25, 0.25]], rtol=1e-6)


@pytest.mark.parametrize("var_type", VAR_TYPES)
@pytest.mark.parametrize("name", list(LAZY))
def test_rows_not_touched_stay_bit_identical(name, var_type):
    check_untouched_rows_stay_bit_identical(LAZY[name](), var_type)


# -- learning rate -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_learning_rate_schedule_is_followed(var_type, mode):
    schedule = K.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5)
    check_learning_rate_schedule_is_followed(K.SGD(learning_rate=schedule), var_type, mode)


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_learning_rate_change_after_tracing_is_followed(var_type):
    check_learning_rate_change_after_tracing_is_followed(
        K.SGD(learning_rate=0.5), lambda sgd, lr: sgd.learning_rate.assign(lr), var_type
    )


# -- gradients of duplicates, new keys, plain variables ----------------------------------------


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_duplicate_keys_are_summed_before_the_update(var_type):
    v = make_var(var_type, dimension=2, initializer="zeros")
    opt = sok.OptimizerWrapper(K.Adagrad(learning_rate=1.0))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.embedding_lookup(v, tf.constant([7, 7, 7], tf.int64)))
    opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
    # one gradient of 3 (not three of 1): acc = 0.1 + 9, w = -1 * 3 / sqrt(9.1 + 1e-7)
    keys, values = exported(v)
    assert keys.tolist() == [7]
    np.testing.assert_allclose(values, np.full((1, 2), -3.0 / np.sqrt(9.1 + 1e-7)), rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_unseen_keys_start_from_the_initializer(var_type, mode):
    v = make_var(var_type, dimension=3, initializer="13")
    opt = sok.OptimizerWrapper(K.SGD(learning_rate=1.0))
    ids = tf.constant([0, 1, 2**40], tf.int64)

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.nn.embedding_lookup(v, ids))
        opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))

    compiled(step, mode)()
    keys, values = exported(v)
    assert keys.tolist() == [0, 1, 2**40]
    np.testing.assert_array_equal(values, np.full((3, 3), 12.0, np.float32))


def test_plain_tf_variable_is_updated_by_the_wrapped_optimizer():
    keras = K.SGD(learning_rate=0.5)
    opt = sok.OptimizerWrapper(keras)
    w = tf.Variable([1.0, 2.0, 3.0])
    opt.apply_gradients([(tf.constant([1.0, 2.0, -2.0]), w)])
    np.testing.assert_allclose(w.numpy(), [0.5, 1.0, 4.0])
    assert int(keras.iterations.numpy()) == 1
    assert int(opt.iterations.numpy()) == 0  # the wrapper counts dynamic steps only


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_dynamic_and_plain_variables_in_one_call(var_type):
    v = make_var(var_type, dimension=2, initializer="2")
    w = tf.Variable([[1.0, 1.0]])
    opt = sok.OptimizerWrapper(K.SGD(learning_rate=0.5))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.embedding_lookup(v, tf.constant([5], tf.int64)) * w)
    grads = tape.gradient(loss, [v, w])
    opt.apply_gradients(zip(grads, [v, w]))
    np.testing.assert_allclose(exported(v)[1], [[1.5, 1.5]])  # 2 - 0.5 * w
    np.testing.assert_allclose(w.numpy(), [[0.0, 0.0]])  # 1 - 0.5 * v


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_sok_sgd(var_type):
    v = make_var(var_type, dimension=2, initializer="1")
    opt = sok.SGD(0.25)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.embedding_lookup(v, tf.constant([1, 1, 2], tf.int64)))
    opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
    np.testing.assert_allclose(exported(v)[1], [[0.5, 0.5], [0.75, 0.75]])


def test_filter_variables_splits_dynamic_from_the_rest():
    a, b = sok.DynamicVariable(dimension=2), sok.DynamicVariable(dimension=2)
    w = tf.Variable([1.0])
    sok_vars, other = sok.filter_variables([w, a, b])
    assert sok_vars == [a, b] and len(other) == 1 and other[0] is w


# -- slots -------------------------------------------------------------------------------------


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_get_slot_returns_the_adagrad_accumulator(var_type):
    v = make_var(var_type, dimension=2, initializer="zeros")
    opt = sok.OptimizerWrapper(K.Adagrad(learning_rate=0.1))
    assert opt.get_slot_names() == ["accumulator"]
    with tf.GradientTape() as tape:
        loss = 2.0 * tf.reduce_sum(tf.nn.embedding_lookup(v, tf.constant([3, 4], tf.int64)))
    opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
    keys, values = opt.get_slot(v, "accumulator")
    order = np.argsort(keys.numpy())
    assert keys.numpy()[order].tolist() == [3, 4]
    np.testing.assert_allclose(values.numpy()[order], np.full((2, 2), 0.1 + 2.0**2), rtol=1e-6)


def test_get_slot_of_an_unknown_name_raises():
    v = sok.DynamicVariable(dimension=2)
    opt = sok.OptimizerWrapper(K.Adagrad())
    with pytest.raises(ValueError, match="momentum"):
        opt.get_slot(v, "momentum")


def test_get_slot_before_any_update_raises():
    v = sok.DynamicVariable(dimension=2)
    opt = sok.OptimizerWrapper(K.Adagrad())
    with pytest.raises(ValueError, match="apply"):
        opt.get_slot(v, "accumulator")


# -- what is refused ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["Lion", "Nadam"])
def test_unsupported_optimizer_lists_the_supported_ones(name):
    with pytest.raises(ValueError, match=name) as info:
        sok.OptimizerWrapper(getattr(K, name)())
    for supported in ("SGD", "Adagrad", "Adam", "Adamax", "Adadelta", "Ftrl", "RMSprop"):
        assert supported in str(info.value)


@pytest.mark.parametrize("option", ["clipnorm", "clipvalue", "global_clipnorm"])
def test_gradient_clipping_is_not_implemented(option):
    with pytest.raises(NotImplementedError, match=option):
        sok.OptimizerWrapper(K.SGD(learning_rate=0.1, **{option: 1.0}))


def test_a_variable_takes_one_wrapper_only():
    v = sok.DynamicVariable(dimension=2)
    first, second = sok.OptimizerWrapper(K.SGD(1.0)), sok.OptimizerWrapper(K.Adagrad(1.0))
    for opt in (first, second):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.nn.embedding_lookup(v, tf.constant([1], tf.int64)))
        if opt is second:
            with pytest.raises(ValueError, match="one wrapper per variable"):
                opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
        else:
            opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))


@pytest.mark.parametrize(
    "options",
    [
        {"loss_scale_factor": 4.0},
        {"gradient_accumulation_steps": 2},
        {"use_ema": True, "ema_overwrite_frequency": 1},
    ],
    ids=["loss_scale_factor", "gradient_accumulation_steps", "use_ema"],
)
def test_options_that_change_the_update_are_refused_or_honoured(options):
    try:
        wrapper = sok.OptimizerWrapper(K.SGD(learning_rate=1.0, **options))
    except NotImplementedError:
        return  # refused, as clipnorm is
    keras = K.SGD(learning_rate=1.0, **options)
    v = sok.DynamicVariable(dimension=1, initializer="0")
    dense = tf.Variable([[0.0]])
    for _ in range(2):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.nn.embedding_lookup(v, tf.constant([0], tf.int64)))
        wrapper.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
        keras.apply_gradients([(tf.ones([1, 1]), dense)])
    np.testing.assert_allclose(exported(v)[1], dense.numpy(), rtol=1e-6)


# -- graph inspection --------------------------------------------------------------------------

PYTHON_OPS = {"PyFunc", "EagerPyFunc", "PyFuncStateless"}


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_traced_training_step_has_no_python_ops(var_type):
    v = make_var(var_type, dimension=4)
    dense = tf.Variable(tf.ones([4, 1]))
    opt = sok.OptimizerWrapper(K.Adam(learning_rate=0.01))

    @tf.function
    def train_step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.matmul(tf.nn.embedding_lookup(v, ids), dense))
        grads = tape.gradient(loss, [v, dense])
        opt.apply_gradients(zip(grads, [v, dense]))
        return loss

    ids = tf.constant([1, 2, 2, 2**40], tf.int64)
    train_step(ids)
    graph_def = train_step.get_concrete_function(ids).graph.as_graph_def()
    op_types = {node.op for node in graph_def.node}
    for function in graph_def.library.function:
        op_types |= {node.op for node in function.node_def}
    assert {"SokLookupDistinct", "SokFindOrInsert", "SokInsertOrAssign"} <= op_types
    assert not op_types & PYTHON_OPS
