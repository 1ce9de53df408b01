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

from sparse_operation_kit import communication
from sparse_operation_kit.distributed_variable import Variable
from sparse_operation_kit.dynamic_variable import DynamicVariable
from sparse_operation_kit.lookup import all2all_dense_embedding
from sparse_operation_kit.validate import positive_int

__all__ = ["DynamicEmbedding", "All2AllDenseEmbedding"]

_COMBINERS = ("sum", "mean")


class _OwnsSokVariable(tf.keras.layers.Layer):
    """Adds ``self._variable`` (a SOK table Keras does not track) to the layer's weights.

    Under a mixed precision policy (``mixed_float16``, ``mixed_bfloat16``) the table and its
    optimizer state stay float32 and the layer returns its rows in the policy's compute dtype, as
    Keras' ``Embedding`` does (:meth:`_in_compute_dtype`); the gradient reaches the table as float32.

    SOK's ops have no XLA kernels: ``supports_jit = False`` (set after Keras' own ``__init__``, which
    sets it True) keeps Keras 3's ``jit_compile="auto"`` (XLA on a GPU) off for a model holding such
    a layer."""

    _variable: tf.Variable

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.supports_jit = False

    def _in_compute_dtype(self, rows: tf.Tensor) -> tf.Tensor:
        """``rows`` (float32) in the layer's compute dtype."""
        return rows if rows.dtype == self.compute_dtype else tf.cast(rows, self.compute_dtype)

    @property
    def variables(self) -> list:
        return super().variables + [self._variable]

    @property
    def weights(self) -> list:
        return super().weights + [self._variable]


class DynamicEmbedding(_OwnsSokVariable):
    """An embedding layer over a ``sok.DynamicVariable``.

    Args:
        dimension: embedding width.
        var_type: ``"hbm"`` (default), ``"hybrid"`` or a plugin's var_type.
        initializer: as for ``sok.DynamicVariable`` (default ``"random"``).
        key_type: ``tf.int64`` (default), ``tf.int32`` or ``tf.uint64``.
        combiner: None (output ``ids.shape + [dimension]``) or ``"sum"`` / ``"mean"`` over the last
            axis of the ids (output ``ids.shape[:-1] + [dimension]``).
        backend_options: backend options of the variable (``init_capacity``, ``max_capacity``, ...),
            and ``filter_ratio`` (see ``sok.DynamicVariable``).
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

    def call(self, ids: Any) -> tf.Tensor:
        embeddings = self._variable.sparse_read(ids)
        if self.combiner == "sum":
            embeddings = tf.reduce_sum(embeddings, axis=-2)
        elif self.combiner == "mean":
            embeddings = tf.reduce_mean(embeddings, axis=-2)
        return self._in_compute_dtype(embeddings)  # pooled in float32 first

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
                "backend_options": self._variable_options(),
            }
        )
        return config

    def _variable_options(self) -> dict[str, Any]:
        """The variable's keyword options: its backend's, and ``filter_ratio`` (a SOK option) when set."""
        options = self._variable.config_dict
        if self._variable.filter_ratio != 1.0:
            options["filter_ratio"] = self._variable.filter_ratio
        return options


class All2AllDenseEmbedding(_OwnsSokVariable):
    """SOK's model-parallel dense embedding layer: key ``k`` lives on rank ``k % n``.

    Args:
        max_vocabulary_size_per_gpu: rows per rank (a capacity hint for the hash table).
        embedding_vec_size: embedding width.
        slot_num: feature fields per sample.
        nnz_per_slot: ids per field.
        dynamic_input: inputs are any 1-D ids (output ``[None, embedding_vec_size]``) instead of
            ``[batch, slot_num, nnz_per_slot]`` (output ``[batch, slot_num, nnz_per_slot, size]``).
        use_hashtable: a ``sok.DynamicVariable`` (any key) instead of a static table whose ids must
            lie in ``[0, max_vocabulary_size_per_gpu * n)``.
        key_dtype: ``tf.int64`` (default) or ``tf.int32``.
        embedding_initializer: a Keras initializer or its name (default U[-0.05, 0.05)).

    Example::

        layer = sok.All2AllDenseEmbedding(1024, 16, slot_num=3, nnz_per_slot=2)
        vectors = layer(ids)   # ids [batch, 3, 2] -> [batch, 3, 2, 16]
    """

    def __init__(
        self,
        max_vocabulary_size_per_gpu: int,
        embedding_vec_size: int,
        slot_num: int,
        nnz_per_slot: int,
        dynamic_input: bool = False,
        use_hashtable: bool = True,
        key_dtype: Any = tf.int64,
        embedding_initializer: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        for name, value in (
            ("max_vocabulary_size_per_gpu", max_vocabulary_size_per_gpu),
            ("embedding_vec_size", embedding_vec_size),
            ("slot_num", slot_num),
            ("nnz_per_slot", nnz_per_slot),
        ):
            positive_int(value, name, numpy=False)
        self.embedding_vec_size, self.slot_num, self.nnz_per_slot = embedding_vec_size, slot_num, nnz_per_slot
        self.dynamic_input = dynamic_input
        initializer = (
            embedding_initializer
            if embedding_initializer is not None
            else tf.keras.initializers.RandomUniform(-0.05, 0.05)
        )
        if isinstance(initializer, str) and initializer == "random_uniform":
            initializer = tf.keras.initializers.RandomUniform(-0.05, 0.05)
        if use_hashtable:
            self._variable = DynamicVariable(
                embedding_vec_size,
                initializer=initializer,
                key_type=key_dtype,
                name=f"{self.name}/embeddings",
                init_capacity=max_vocabulary_size_per_gpu,
            )
        else:
            rows = max_vocabulary_size_per_gpu * communication.num_ranks()
            self._variable = Variable(
                shape=[rows, embedding_vec_size],
                initializer=tf.keras.initializers.get(initializer),
                dtype=tf.float32,
                name=f"{self.name}/embeddings",
            )

    @property
    def embedding_variable(self) -> tf.Variable:
        return self._variable

    def call(self, inputs: Any, training: bool = True) -> tf.Tensor:
        ids = tf.convert_to_tensor(inputs)
        if self.dynamic_input:
            return self._in_compute_dtype(all2all_dense_embedding(self._variable, tf.reshape(ids, [-1])))
        if ids.shape.rank != 3 or tuple(ids.shape[1:]) != (self.slot_num, self.nnz_per_slot):
            raise ValueError(
                f"inputs must have shape [batch, {self.slot_num}, {self.nnz_per_slot}] "
                f"(slot_num, nnz_per_slot), got {ids.shape}; or create the layer with dynamic_input=True"
            )
        vectors = all2all_dense_embedding(self._variable, tf.reshape(ids, [-1]))
        return self._in_compute_dtype(
            tf.reshape(vectors, [-1, self.slot_num, self.nnz_per_slot, self.embedding_vec_size])
        )

    def compute_output_shape(self, input_shape: Any) -> tuple:
        if self.dynamic_input:
            return (None, self.embedding_vec_size)
        return (input_shape[0], self.slot_num, self.nnz_per_slot, self.embedding_vec_size)
