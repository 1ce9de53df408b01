"""DynamicEmbedding in Keras 3 models: visible to the model, trainable in a loop and with fit."""

from __future__ import annotations

import numpy as np
import pytest
import sparse_operation_kit as sok
import tensorflow as tf

VAR_TYPES = {"hbm": {}, "hybrid": {"init_capacity": 1024, "max_capacity": 1 << 16}}


class TinyModel(tf.keras.Model):
    """Embedding (mean over 4 ids) → Dense(1): learns a per-id target."""

    def __init__(self, var_type: str) -> None:
        super().__init__()
        self.embedding = sok.DynamicEmbedding(
            8, var_type=var_type, combiner="mean", backend_options=VAR_TYPES[var_type]
        )
        self.dense = tf.keras.layers.Dense(1)
        self.sok_optimizer = sok.OptimizerWrapper(tf.keras.optimizers.Adagrad(learning_rate=0.5))
        self.loss_tracker = tf.keras.metrics.Mean(name="loss")

    def call(self, ids):
        return self.dense(self.embedding(ids))

    def train_step(self, data):
        ids, target = data
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(self(ids, training=True) - target))
        sok_vars, dense_vars = sok.filter_variables(self.trainable_variables)
        grads = tape.gradient(loss, sok_vars + dense_vars)
        self.sok_optimizer.apply_gradients(zip(grads[: len(sok_vars)], sok_vars))
        self.optimizer.apply_gradients(zip(grads[len(sok_vars) :], dense_vars))
        self.loss_tracker.update_state(loss)
        return {"loss": self.loss_tracker.result()}

    @property
    def metrics(self):
        return [self.loss_tracker]


def _data(n=512, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 50, size=(n, 4)).astype(np.int64) * 7919 - 10**12  # sparse, negative keys
    target = (ids % 3 == 0).mean(axis=1, keepdims=True).astype(np.float32)
    return ids, target


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_the_dynamic_variable_is_a_model_weight(var_type):
    model = TinyModel(var_type)
    model(tf.constant(_data(4)[0]))
    sok_vars, dense_vars = sok.filter_variables(model.trainable_variables)
    assert sok_vars == [model.embedding.embedding_variable]
    assert len(dense_vars) == 2  # kernel and bias


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_custom_loop_reduces_the_loss(var_type):
    model = TinyModel(var_type)
    model.optimizer = tf.keras.optimizers.Adam(0.05)
    ids, target = _data()
    step = tf.function(model.train_step)
    losses = []
    for _ in range(30):
        model.loss_tracker.reset_state()
        losses.append(float(step((tf.constant(ids), tf.constant(target)))["loss"]))
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_fit_reduces_the_loss(var_type):
    model = TinyModel(var_type)
    ids, target = _data()
    model.compile(optimizer=tf.keras.optimizers.Adam(0.05))
    model(tf.constant(ids[:2]))
    model.optimizer.build(sok.filter_variables(model.trainable_variables)[1])
    history = model.fit(ids, target, batch_size=64, epochs=6, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < 0.5 * losses[0]


def test_layer_output_shapes():
    layer = sok.DynamicEmbedding(5)
    assert layer(tf.constant([[1, 2, 3]], tf.int64)).shape == (1, 3, 5)
    assert layer.compute_output_shape((None, 3)) == (None, 3, 5)
    pooled = sok.DynamicEmbedding(5, combiner="sum")
    assert pooled(tf.constant([[1, 2, 3]], tf.int64)).shape == (1, 5)


def test_bad_combiner():
    with pytest.raises(ValueError, match="combiner 'max' is not valid"):
        sok.DynamicEmbedding(4, combiner="max")


@pytest.mark.parametrize("use_hashtable", [True, False])
def test_all2all_dense_embedding_layer_shapes_and_gradients(use_hashtable):
    layer = sok.All2AllDenseEmbedding(
        64,
        4,
        slot_num=3,
        nnz_per_slot=2,
        use_hashtable=use_hashtable,
        embedding_initializer=tf.keras.initializers.Constant(0.5),
    )
    ids = tf.constant(np.arange(12).reshape(2, 3, 2), tf.int64)
    with tf.GradientTape() as tape:
        out = layer(ids)
        loss = tf.reduce_sum(out)
    assert out.shape == (2, 3, 2, 4)
    np.testing.assert_allclose(out.numpy(), 0.5)
    assert layer.embedding_variable in layer.trainable_weights
    grad = tape.gradient(loss, layer.embedding_variable)
    assert isinstance(grad, tf.IndexedSlices)
    np.testing.assert_allclose(tf.math.unsorted_segment_sum(grad.values, grad.indices, 64).numpy()[:12], 1.0)


def test_all2all_dense_embedding_checks_the_input_shape():
    layer = sok.All2AllDenseEmbedding(8, 4, slot_num=3, nnz_per_slot=2)
    with pytest.raises(ValueError, match=r"inputs must have shape \[batch, 3, 2\]"):
        layer(tf.constant([[1, 2]], tf.int64))
    dynamic = sok.All2AllDenseEmbedding(8, 4, slot_num=3, nnz_per_slot=2, dynamic_input=True)
    assert dynamic(tf.constant([5, 6, 7], tf.int64)).shape == (3, 4)


@pytest.mark.parametrize("ratio", [0.25, 1.0])
def test_config_round_trip_keeps_the_variable_options(ratio):
    options = {"init_capacity": 1024, "max_capacity": 4096}
    if ratio != 1.0:
        options["filter_ratio"] = ratio
    layer = sok.DynamicEmbedding(4, var_type="hybrid", initializer="2", backend_options=options)
    config = layer.get_config()
    rebuilt = sok.DynamicEmbedding.from_config({**config, "name": "rebuilt"})
    assert rebuilt.embedding_variable.filter_ratio == ratio
    assert rebuilt.embedding_variable.config_dict == layer.embedding_variable.config_dict
    assert ("filter_ratio" in config["backend_options"]) == (ratio != 1.0)
    ids = tf.constant([[1, 2]], tf.int64)
    np.testing.assert_array_equal(rebuilt(ids).numpy(), layer(ids).numpy())


def test_layers_keep_keras_from_compiling_them_with_xla():
    """Keras 3's jit_compile="auto" turns XLA on for fit on a GPU unless a layer says it cannot run
    under XLA; SOK's ops have no XLA kernels (seen on the H100: fit failed to compile SokUniqueIndex)."""
    assert sok.DynamicEmbedding(4).supports_jit is False
    assert sok.All2AllDenseEmbedding(8, 4, slot_num=3, nnz_per_slot=2).supports_jit is False
