"""sok.sparse_read_and_evict: reads with eviction, as SOK's sparse_read_evict test."""

from __future__ import annotations

import numpy as np
import pytest
import sparse_operation_kit as sok
import tensorflow as tf


def test_evicted_rows_carry_their_trained_values_and_never_repeat():
    v = sok.DynamicVariable(dimension=16, var_type="hybrid", initializer="11", init_capacity=8192, max_capacity=16384)
    optimizer = sok.OptimizerWrapper(tf.keras.optimizers.SGD(learning_rate=1.0))
    seen_evicted: set[int] = set()
    total_evicted = 0
    for step in range(5):
        ids = tf.range(step * 8192, (step + 1) * 8192, dtype=tf.int64)  # new keys every step
        with tf.GradientTape() as tape:
            emb, evicted_keys, evicted_values = sok.sparse_read_and_evict(v, ids)
            loss = tf.reduce_sum(emb)
        np.testing.assert_array_equal(emb.numpy(), 11.0)
        grads = tape.gradient(loss, [v])
        optimizer.apply_gradients(zip(grads, [v]))
        keys = evicted_keys.numpy().tolist()
        np.testing.assert_array_equal(evicted_values.numpy(), 10.0)  # 11 - 1: trained once, then evicted
        assert not seen_evicted & set(keys)
        seen_evicted |= set(keys)
        total_evicted += len(keys)
        assert v.size.numpy()[0] <= 16384
    assert total_evicted > 0
    # Everything inserted is either still stored or was evicted exactly once.
    assert total_evicted + v.size.numpy()[0] == 5 * 8192


def test_backends_without_eviction_are_refused():
    v = sok.DynamicVariable(dimension=4, var_type="hbm")
    with pytest.raises(TypeError, match="needs a backend with eviction"):
        sok.sparse_read_and_evict(v, tf.constant([1], tf.int64))
