"""Keras mixed precision around SOK's tables: under ``mixed_bfloat16`` the tables and their lookups
stay float32 and a training step updates them as a float32 ``tf.Variable`` with Keras' Adagrad is
updated from the same gradients; a ``LossScaleOptimizer`` is refused with what to do instead."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import sparse_operation_kit as sok  # noqa: E402


@pytest.fixture
def bfloat16_policy():
    before = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    yield
    keras.mixed_precision.set_global_policy(before)


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


def test_loss_scale_optimizer_is_refused_with_what_to_do():
    inner = keras.optimizers.Adagrad(0.1)
    with pytest.raises(ValueError, match=r"LossScaleOptimizer is not supported.*'mixed_bfloat16' policy"):
        sok.OptimizerWrapper(keras.optimizers.LossScaleOptimizer(inner))
