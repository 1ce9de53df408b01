"""Keras mixed precision around SOK's tables: under ``mixed_bfloat16`` the tables and their lookups
stay float32 and a training step updates them as a float32 ``tf.Variable`` with Keras' Adagrad is
updated from the same gradients; under ``mixed_float16`` a Keras 3 ``LossScaleOptimizer`` through
``sok.OptimizerWrapper`` unscales, skips and moves the scale as Keras' own does for plain variables."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import sparse_operation_kit as sok  # noqa: E402
from sparse_operation_kit.optimizer import wrappers_of  # noqa: E402


def _global_policy(name: str) -> Iterator[None]:
    """Keras' global dtype policy ``name`` while the fixture lasts."""
    before = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(name)
    yield
    keras.mixed_precision.set_global_policy(before)


@pytest.fixture
def bfloat16_policy():
    yield from _global_policy("mixed_bfloat16")


@pytest.fixture
def float16_policy():
    yield from _global_policy("mixed_float16")


def test_bfloat16_step_updates_sok_tables_as_float32_variables(bfloat16_policy):
    rows = np.random.default_rng(5).normal(size=(12, 4)).astype(np.float32)
    table = sok.Variable(rows)
    plain = tf.Variable(rows)
    ids = tf.ragged.constant([[1, 2, 2], [3], [7, 1]], dtype=tf.int64)
    dense = keras.layers.Dense(1, kernel_initializer="ones")
    sok_opt = sok.OptimizerWrapper(keras.optimizers.Adagrad(0.1))
    keras_opt = keras.optimizers.Adagrad(0.1)

    @tf.function
    def step():
        with tf.GradientTape(persistent=True) as tape:
            ours = sok.lookup_sparse(table, ids, combiners="sum")
            theirs = tf.nn.embedding_lookup_sparse(plain, ids.to_sparse(), None, combiner="sum")
            loss_ours = tf.reduce_sum(tf.cast(dense(ours), tf.float32) ** 2)
            loss_theirs = tf.reduce_sum(tf.cast(dense(theirs), tf.float32) ** 2)
        sok_opt.apply_gradients([(tape.gradient(loss_ours, table), table)])
        keras_opt.apply_gradients([(tape.gradient(loss_theirs, plain), plain)])
        return ours, dense(ours)

    for _ in range(3):
        pooled, out = step()
    assert pooled.dtype == tf.float32 and out.dtype == tf.bfloat16 and table.dtype == tf.float32
    np.testing.assert_allclose(table.numpy(), plain.numpy(), rtol=1e-6, atol=1e-7)
    assert not np.array_equal(table.numpy(), rows)


ROWS = (0.05 * np.random.default_rng(7).normal(size=(10, 4))).astype(np.float32)  # no float16 overflow at 2**11
IDS = tf.ragged.constant([[1, 2, 2], [3], [7, 1]], dtype=tf.int64)


def _scaler(growth_steps: int = 2000) -> keras.optimizers.LossScaleOptimizer:
    return keras.optimizers.LossScaleOptimizer(
        keras.optimizers.Adagrad(0.1), initial_scale=2.0**10, dynamic_growth_steps=growth_steps
    )


def _pair(with_dense: bool, growth_steps: int = 2000):
    """A step on SOK tables (a DynamicVariable and a sok.Variable) through sok.OptimizerWrapper of a
    LossScaleOptimizer, and the same step on plain tf.Variables through Keras' own LossScaleOptimizer
    (the oracle): ``step(poison)`` returns both; a true ``poison`` makes the loss infinite."""
    dynamic = sok.DynamicVariable(dimension=4, initializer="zeros", name="scaled_table")
    sok.assign(dynamic, tf.range(10, dtype=tf.int64), ROWS)
    static = sok.Variable(ROWS)
    plain_dynamic, plain_static = tf.Variable(ROWS), tf.Variable(ROWS)
    dense = keras.layers.Dense(1, kernel_initializer="ones") if with_dense else None
    ours, theirs = _scaler(growth_steps), _scaler(growth_steps)
    wrapper = sok.OptimizerWrapper(ours)

    def loss_of(a, b, poison):
        pooled = tf.concat([a, b], axis=1)
        out = tf.cast(dense(pooled), tf.float32) if dense is not None else tf.reduce_sum(pooled, axis=1)
        loss = tf.reduce_sum(out**2)
        return loss * tf.where(poison, np.inf, 1.0)  # (tf.where over the loss itself: NaN gradients)

    @tf.function
    def step(poison):
        with tf.GradientTape(persistent=True) as tape:
            a = sok.lookup_sparse(dynamic, IDS, combiners="sum")
            b = sok.lookup_sparse(static, IDS, combiners="sum")
            scaled = ours.scale_loss(loss_of(a, b, poison))
            pa = tf.nn.embedding_lookup_sparse(plain_dynamic, IDS.to_sparse(), None, combiner="sum")
            pb = tf.nn.embedding_lookup_sparse(plain_static, IDS.to_sparse(), None, combiner="sum")
            scaled_theirs = theirs.scale_loss(loss_of(pa, pb, poison))
        ours_vars = [dynamic, static] + (dense.trainable_variables if dense is not None else [])
        wrapper.apply_gradients(zip(tape.gradient(scaled, ours_vars), ours_vars))
        plain_vars = [plain_dynamic, plain_static]
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(scaled_theirs, plain_vars)]
        theirs.apply_gradients(zip(grads, plain_vars))

    def rows():
        keys, values = (np.asarray(t) for t in sok.export(dynamic))
        return values[np.argsort(keys)], static.numpy()

    return SimpleNamespace(
        step=step, rows=rows, plain=(plain_dynamic, plain_static), ours=ours, theirs=theirs, wrapper=wrapper,
        dynamic=dynamic, static=static,
    )  # fmt: skip


@pytest.mark.parametrize("with_dense", [True, False], ids=["with dense variables", "tables only"])
def test_loss_scaled_steps_update_tables_as_keras_updates_plain_variables(float16_policy, with_dense):
    # Finite steps: the tables' gradients are unscaled by the step's loss scale, as Keras unscales a
    # plain tf.Variable's. A poisoned step: nothing changes, the scale halves (both).
    pair = _pair(with_dense)
    step, rows, plain, ours, theirs, wrapper = pair.step, pair.rows, pair.plain, pair.ours, pair.theirs, pair.wrapper
    for poison in (False, False, True, False):
        before = rows()
        step(tf.constant(poison))
        if poison:
            for now, then in zip(rows(), before):
                np.testing.assert_array_equal(now, then)
        for now, expected in zip(rows(), plain):
            np.testing.assert_allclose(now, expected.numpy(), rtol=1e-5, atol=1e-6)
        assert float(ours.dynamic_scale.numpy()) == float(theirs.dynamic_scale.numpy())
    assert float(ours.dynamic_scale.numpy()) == 2.0**9  # halved once
    assert int(wrapper.iterations.numpy()) == 3  # the poisoned step is not counted


def test_a_tables_only_step_moves_the_scale_as_the_scaler_would(float16_policy):
    # No variable of the scaler's own in the call: the wrapper doubles the scale after
    # dynamic_growth_steps finite steps and halves it after a non-finite one, as Keras does.
    pair = _pair(with_dense=False, growth_steps=2)
    step, ours, theirs = pair.step, pair.ours, pair.theirs
    scales = []
    for poison in (False, False, False, True, False):
        step(tf.constant(poison))
        scales.append((float(ours.dynamic_scale.numpy()), float(theirs.dynamic_scale.numpy())))
    assert [s for s, _ in scales] == [s for _, s in scales] == [2.0**10, 2.0**11, 2.0**11, 2.0**10, 2.0**10]


def test_loss_scale_optimizer_with_check_finite_is_refused():
    with pytest.raises(ValueError, match="check_finite=True with a LossScaleOptimizer"):
        sok.OptimizerWrapper(_scaler(), check_finite=True)


def test_the_wrapper_of_a_loss_scale_optimizer_answers_to_it_and_to_its_inner_optimizer():
    scaler = _scaler()
    wrapper = sok.OptimizerWrapper(scaler)
    assert wrapper.optimizer is scaler.inner_optimizer and wrapper.loss_scale_optimizer is scaler
    assert wrapper.wraps(scaler) and wrapper.wraps(scaler.inner_optimizer)
    assert wrappers_of(scaler) == [wrapper] == wrappers_of(scaler.inner_optimizer)
    assert wrapper.name == "Adagrad"


def test_tf_keras_loss_scale_optimizer_is_refused_with_what_to_do():
    tf_keras = pytest.importorskip("tf_keras")
    inner = tf_keras.optimizers.Adagrad(0.1)
    with pytest.raises(ValueError, match=r"takes Keras 3's keras.optimizers.LossScaleOptimizer.*'mixed_bfloat16'"):
        sok.OptimizerWrapper(tf_keras.mixed_precision.LossScaleOptimizer(inner))


def test_dump_and_load_with_the_loss_scale_optimizer_keep_the_table_and_its_state(float16_policy, tmp_path):
    # sok.dump / sok.load given the LossScaleOptimizer find the wrapper of it: the rows and the
    # Adagrad accumulator of the dynamic table come back in a fresh variable of a fresh wrapper.
    pair = _pair(with_dense=False)
    for _ in range(2):
        pair.step(tf.constant(False))
    path = str(tmp_path / "ckpt")
    sok.dump(path, [pair.dynamic], optimizer=pair.ours)
    fresh_scaler = _scaler()
    fresh = sok.DynamicVariable(dimension=4, initializer="zeros", name="scaled_table")
    fresh_wrapper = sok.OptimizerWrapper(fresh_scaler)
    sok.load(path, [fresh], optimizer=fresh_scaler)
    assert fresh.optimizer_wrapper is fresh_wrapper
    for name in pair.wrapper.get_slot_names():
        (k1, v1), (k2, v2) = pair.wrapper.get_slot(pair.dynamic, name), fresh_wrapper.get_slot(fresh, name)
        np.testing.assert_array_equal(np.asarray(v1)[np.argsort(k1)], np.asarray(v2)[np.argsort(k2)])
    keys, values = (np.asarray(t) for t in sok.export(fresh))
    np.testing.assert_array_equal(pair.rows()[0], values[np.argsort(keys)])


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_layers_return_the_compute_dtype_and_keep_float32_tables(policy):
    # As Keras' Embedding: rows in the policy's compute dtype, the table and its gradient float32.
    for _ in _global_policy(policy):
        compute = keras.mixed_precision.global_policy().compute_dtype
        dynamic = sok.DynamicEmbedding(4, initializer="ones", combiner="sum")
        dense = sok.All2AllDenseEmbedding(
            max_vocabulary_size_per_gpu=16, embedding_vec_size=4, slot_num=2, nnz_per_slot=1
        )
        ids = tf.constant([[1, 2], [3, 3]], tf.int64)
        with tf.GradientTape() as tape:
            pooled = dynamic(ids)
            rows = dense(tf.reshape(ids, [2, 2, 1]))
            loss = tf.reduce_sum(tf.cast(pooled, tf.float32)) + tf.reduce_sum(tf.cast(rows, tf.float32))
        assert pooled.dtype == compute and rows.dtype == compute
        np.testing.assert_array_equal(tf.cast(pooled, tf.float32).numpy(), np.full((2, 4), 2.0))
        grads = tape.gradient(loss, [dynamic.embedding_variable, dense.embedding_variable])
        assert [g.values.dtype for g in grads] == [tf.float32, tf.float32]
        assert dynamic.embedding_variable.dtype == tf.float32 and dense.embedding_variable.dtype == tf.float32
