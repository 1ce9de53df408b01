"""Keras layers that own SOK variables and show them to Keras models.

Keras 3 tracks only Keras variables: a ``tf.Variable`` (or a ``sok.DynamicVariable``) stored on a
layer is missing from ``model.trainable_variables``. :class:`DynamicEmbedding` adds its
DynamicVariable to the layer's weights, so ``model.trainable_variables`` lists it and
``sok.filter_variables`` can split it from the dense ones.

Example::

    class Model(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.embedding = sok.DynamicEmbedding(16, var_type="hybrid", combiner="mean")
            self.dense = tf.keras.layers.Dense(1)

        def call(self, ids):                       # ids: [batch, hotness] int64
            return self.dense(self.embedding(ids))

With ``model.fit``, Keras builds the compiled optimizer on ``model.trainable_variables``; build it
yourself on the dense variables first (``model.optimizer.build(sok.filter_variables(
model.trainable_variables)[1])``) and apply a ``sok.OptimizerWrapper`` to the SOK variables in
``train_step`` (see the README).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from sparse_operation_kit.dynamic_variable import DynamicVariable

__all__ = ["DynamicEmbedding"]

_COMBINERS = ("sum", "mean")


class DynamicEmbedding(tf.keras.layers.Layer):
    """An embedding layer over a ``sok.DynamicVariable``.

    Args:
        dimension: embedding width.
        var_type: ``"hbm"`` (default), ``"hybrid"`` or a plugin's var_type.
        initializer: as for ``sok.DynamicVariable`` (default ``"random"``).
        key_type: ``tf.int64`` (default), ``tf.int32`` or ``tf.uint64``.
        combiner: None (output ``ids.shape + [dimension]``) or ``"sum"`` / ``"mean"`` over the last
            axis of the ids (output ``ids.shape[:-1] + [dimension]``).
        backend_options: backend options of the variable (``init_capacity``, ``max_capacity``, ...).
        **kwargs: Keras layer arguments (``name``, ``trainable``).
    """

    def __init__(
        self,
        dimension: int,
        var_type: str | None = None,
        initializer: Any = None,
        key_type: Any = None,
        combiner: str | None = None,
        backend_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if combiner is not None and combiner not in _COMBINERS:
            raise ValueError(f"combiner {combiner!r} is not valid; valid: None, {', '.join(_COMBINERS)}")
        self.combiner = combiner
        self.dimension = int(dimension)
        self._variable = DynamicVariable(
            dimension,
            initializer=initializer,
            var_type=var_type,
            key_type=key_type,
            name=f"{self.name}/embeddings",
            trainable=self.trainable,
            **(backend_options or {}),
        )

    @property
    def embedding_variable(self) -> DynamicVariable:
        """The layer's DynamicVariable."""
        return self._variable

    @property
    def variables(self) -> list:
        return super().variables + [self._variable]

    @property
    def weights(self) -> list:
        return super().weights + [self._variable]

    def call(self, ids: Any) -> tf.Tensor:
        embeddings = self._variable.sparse_read(ids)
        if self.combiner == "sum":
            return tf.reduce_sum(embeddings, axis=-2)
        if self.combiner == "mean":
            return tf.reduce_mean(embeddings, axis=-2)
        return embeddings

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shape = tuple(input_shape)
        if self.combiner is not None:
            shape = shape[:-1]
        return shape + (self.dimension,)

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(
            {
                "dimension": self.dimension,
                "var_type": self._variable.backend_type,
                "initializer": self._variable.initializer_str,
                "combiner": self.combiner,
                "key_type": self._variable.key_type.name,
                "backend_options": self._variable.config_dict,
            }
        )
        return config
