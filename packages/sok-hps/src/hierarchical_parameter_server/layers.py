"""``hps.LookupLayer`` and ``hps.SparseLookupLayer``: Keras layers over the parameter server.

They return what ``tf.nn.embedding_lookup`` and ``tf.nn.embedding_lookup_sparse`` return on the
same table, bit for bit: the server finds the rows of the ids (cache, then the database tiers,
then the table's default value); ``max_norm`` clips them as ``tf.nn.embedding_lookup`` does, and
``tf.nn.embedding_lookup_sparse`` itself combines them. Eager and inside ``tf.function``; on the
CPU and, under a CUDA TensorFlow, on the GPU.

The layers are layers of ``tf.keras``: Keras 3, or under ``TF_USE_LEGACY_KERAS=1`` the Keras 2
(tf_keras) that NVIDIA's HPS notebooks were written for, whose functional models call them on
symbolic inputs (dense and sparse ``tf.keras.Input``) as on tensors. They have no weights and save
with the model (``model.save("m.keras")``): their config is their constructor's arguments, and a
model loaded in another process initialises HPS from the layers' ``ps_config_file`` on its first
call.

Where this differs from NVIDIA HPS: the checks of ``forward_check`` (reference §1.6) raise
``ValueError`` (at the call: unknown model, ``table_id`` out of range, ``emb_vec_size`` or the ids'
dtype not the config's) or ``tf.errors.InvalidArgumentError`` (in the graph: more keys than
``max_batch_size`` x ``maxnum_catfeature_query_per_table_per_sample``) instead of returning
uninitialised memory; ``SparseLookupLayer`` also takes ``tf.RaggedTensor`` ids and weights, and
returns a row per sample even where samples have no ids (zeros; the seed assumes none is empty).

Example::

    lookup = hps.LookupLayer(model_name="foo", table_id=0, emb_vec_size=16, emb_vec_dtype=tf.float32,
                             ps_config_file="ps.json", global_batch_size=1024)
    emb = lookup(tf.constant([[1, 2], [3, 4]], tf.int32))          # [2, 2, 16]
"""

from __future__ import annotations

import logging
import os
from typing import Any

import tensorflow as tf
from sparse_operation_kit import python_ops
from sparse_operation_kit.lookup import COMBINERS
from sparse_operation_kit.validate import positive_int

from hierarchical_parameter_server import graph_context, init
from hierarchical_parameter_server.server import ServedTable

logger = logging.getLogger(__name__)

__all__ = ["LookupLayer", "SparseLookupLayer"]


class _HpsLayer(tf.keras.layers.Layer):
    """What both layers share: the constructor of the seed, the config, the served table."""

    def __init__(
        self,
        model_name: str,
        table_id: int,
        emb_vec_size: int,
        emb_vec_dtype: Any = tf.float32,
        ps_config_file: str = "",
        global_batch_size: int = 1,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        try:
            dtype = tf.as_dtype(emb_vec_dtype)
        except TypeError:
            dtype = None
        if dtype != tf.float32:
            raise ValueError(f"emb_vec_dtype must be tf.float32 (HPS tables hold float32 rows), got {emb_vec_dtype!r}")
        positive_int(emb_vec_size, "emb_vec_size", numpy=False)
        if isinstance(table_id, bool) or not isinstance(table_id, int) or table_id < 0:
            raise ValueError(f"table_id must be an integer >= 0, got {table_id!r}")
        self.model_name = model_name
        self.table_id = table_id
        self.emb_vec_size = emb_vec_size
        self.emb_vec_dtype = tf.float32
        self.ps_config_file = ps_config_file
        self.global_batch_size = global_batch_size
        self.supports_jit = False  # the lookup's misses run Python (SokPyCall)
        #: Whether a start from ps_config_file failed while this layer was traced: later traces
        #: (a save traces several times) do not try it again.
        self._start_failed_while_tracing = False

    def _started_while_tracing(self) -> bool:
        """Whether HPS is running after a start from ``ps_config_file``, where the file is there, so
        that the graph being traced holds the lookup itself. Tracing needs no config: a start that
        fails is logged, not raised, and not tried again by this layer's later traces (the first
        lookup starts HPS from the file again, and raises if it still cannot)."""
        if self._start_failed_while_tracing or not os.path.isfile(self.ps_config_file):
            return False
        try:
            init.get_server(self.ps_config_file, self.global_batch_size)
        except (OSError, ValueError, TypeError, ImportError, RuntimeError, tf.errors.OpError) as error:
            self._start_failed_while_tracing = True
            logger.warning(
                "HPS cannot start from %r while %s is traced (%s: %s); the traced lookups start it from that "
                "file when they first run, and raise then if it still cannot",
                self.ps_config_file,
                self.name,
                type(error).__name__,
                error,
            )
            return False
        return True

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            model_name=self.model_name,
            table_id=self.table_id,
            emb_vec_size=self.emb_vec_size,
            emb_vec_dtype="float32",
            ps_config_file=self.ps_config_file,
            global_batch_size=self.global_batch_size,
        )
        return config

    def _served(self, ids_dtype: tf.DType) -> ServedTable:
        """The served table, HPS initialised first if needed; the call's checks."""
        server = init.get_server(self.ps_config_file, self.global_batch_size)
        table = server.table(self.model_name, self.table_id)
        table.check_call(self.emb_vec_size, ids_dtype, self.name)
        return table

    @tf.autograph.experimental.do_not_convert  # tf_keras converts call(); this is host logic
    def _rows(self, keys: tf.Tensor) -> tf.Tensor:
        """The rows of ``keys`` (any shape), ``float32 keys.shape + [emb_vec_size]``: the served
        table's lookup (:meth:`.server.ServedTable.lookup`). A graph traced while HPS is not running and cannot start
        (no ``ps_config_file``, no file there yet: NVIDIA's flow builds and saves the model before it
        writes the config and calls ``hps.Init``; or a config this process cannot serve, such as
        model files or databases only the serving host has) gets a lookup that finds the table when
        it first runs, starting HPS from ``ps_config_file`` if nothing has; it serves through Python."""
        if tf.executing_eagerly() or init.is_initialized() or self._started_while_tracing():
            return self._served(keys.dtype).lookup(keys)
        logger.info(
            "HPS is not running while %s is traced: its lookup finds model %r table %d when it first runs "
            "(starting HPS from ps_config_file %r if nothing has) and serves through Python (call hps.Init "
            "before tracing for the lookup in the graph)",
            self.name,
            self.model_name,
            self.table_id,
            self.ps_config_file,
        )
        path = os.path.abspath(self.ps_config_file) if self.ps_config_file else ""
        context = graph_context.untraced_context(
            path, self.global_batch_size, self.model_name, self.table_id, self.emb_vec_size, keys.dtype.name
        )
        flat = tf.reshape(keys, [-1])
        (rows,) = python_ops.py_call(graph_context.LOOKUP, context, [flat], [tf.float32], name="HpsLookup")
        rows.set_shape([flat.shape[0], self.emb_vec_size])
        if keys.shape.rank == 1:
            return rows
        return tf.reshape(rows, tf.concat([tf.shape(keys), [self.emb_vec_size]], axis=0))


def _check_ids_dtype(dtype: tf.DType, layer: str) -> None:
    if dtype not in (tf.int32, tf.int64):
        raise ValueError(f"ids of {layer} must be tf.int32 or tf.int64, got {dtype.name}")


def _with_trailing_zero_rows(rows: tf.Tensor, samples: tf.Tensor) -> tf.Tensor:
    """``rows`` followed by zero rows up to ``samples`` rows (int64 scalar): the combined rows of
    ``tf.nn.embedding_lookup_sparse``, whose segment ops stop at the last sample that has an id."""
    missing = samples - tf.shape(rows, out_type=tf.int64)[0]
    return tf.pad(rows, [[0, missing], [0, 0]])


@tf.keras.utils.register_keras_serializable(package="hps")
class LookupLayer(_HpsLayer):
    """HPS's equivalent of ``tf.nn.embedding_lookup``: rows of one table of a model.

    Args:
        model_name: the model (``models[].model`` of the ps_config) that holds the table.
        table_id: the table's index in the model's ``sparse_files``.
        emb_vec_size: the table's width (``embedding_vecsize_per_table[table_id]``).
        emb_vec_dtype: ``tf.float32`` (the only one).
        ps_config_file: the ps_config JSON for implicit initialisation ("" where ``hps.Init`` is
            called first). It may be written, and its model files and databases be there, only after
            the model is traced or saved: the first lookup reads it.
        global_batch_size: the ``global_batch_size`` of the implicit initialisation.
        **kwargs: Keras layer arguments (``name``, ...).

    Example::

        lookup = hps.LookupLayer(model_name="foo", table_id=0, emb_vec_size=16,
                                 emb_vec_dtype=tf.float32, ps_config_file="ps.json",
                                 global_batch_size=1024)

        @tf.function
        def infer(ids):                      # ids: int32 [batch, slots] (supportlonglong false)
            return lookup(ids)               # float32 [batch, slots, 16]
    """

    def call(self, ids: Any, max_norm: Any = None) -> tf.Tensor:
        """The rows of ``ids`` (int32 or int64 per ``supportlonglong``, any shape): float32
        ``ids.shape + [emb_vec_size]``; keys no tier has get the table's default value.

        Args:
            ids: the ids, a dense tensor.
            max_norm: if not None, each row whose l2-norm is larger is clipped to it.

        Raises:
            ValueError: a check of the call (the message says which and how to fix it).
            tf.errors.InvalidArgumentError: more ids than the table's per-lookup capacity.
        """
        ids = tf.convert_to_tensor(ids)
        _check_ids_dtype(ids.dtype, self.name)
        out = self._rows(ids)
        out.set_shape(ids.shape.concatenate([self.emb_vec_size]))
        if max_norm is not None:  # as tf.nn.embedding_lookup clips: each row, over the last axis
            out = tf.clip_by_norm(out, max_norm, axes=[out.shape.rank - 1])
        return tf.identity(out)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        return tuple(input_shape) + (self.emb_vec_size,)


@tf.keras.utils.register_keras_serializable(package="hps")
class SparseLookupLayer(_HpsLayer):
    """HPS's equivalent of ``tf.nn.embedding_lookup_sparse``: combined rows of one table.

    Args: as :class:`LookupLayer`.

    Example::

        sparse_lookup = hps.SparseLookupLayer(model_name="foo", table_id=0, emb_vec_size=16,
                                              emb_vec_dtype=tf.float32, ps_config_file="ps.json",
                                              global_batch_size=1024)

        @tf.function
        def infer(sp_ids):                   # SparseTensor [batch, nnz] of int32 ids
            return sparse_lookup(sp_ids=sp_ids, sp_weights=None, combiner="mean")   # [batch, 16]
    """

    def call(
        self,
        sp_ids: Any,
        sp_weights: Any = None,
        name: str | None = None,
        combiner: str | None = None,
        max_norm: Any = None,
    ) -> tf.Tensor:
        """The combined rows of each row of ``sp_ids`` (``[d0, emb_vec_size]``), as
        ``tf.nn.embedding_lookup_sparse`` combines them; zeros for a row without ids, wherever it
        is (``tf.nn.embedding_lookup_sparse`` leaves out the rows after the last that has one).

        Args:
            sp_ids: ``tf.SparseTensor`` (rank 2, indices in row-major order) or ``tf.RaggedTensor``
                of int32 or int64 ids per ``supportlonglong``.
            sp_weights: None (every weight 1) or float weights of the same kind and layout.
            name: accepted for the seed's signature; unused.
            combiner: ``"mean"`` (None: the default), ``"sqrtn"`` or ``"sum"``.
            max_norm: if not None, each row is clipped to this l2-norm before combining.

        Raises:
            TypeError: ``sp_ids`` or ``sp_weights`` of the wrong kind.
            ValueError: an unknown ``combiner``, or a check of the call.
            tf.errors.InvalidArgumentError: more distinct ids than the table's per-lookup capacity.
        """
        combiner = "mean" if combiner is None else combiner
        if combiner not in COMBINERS:
            raise ValueError(f"combiner must be one of 'mean', 'sqrtn' or 'sum', got {combiner!r}")
        kinds = (tf.SparseTensor, tf.RaggedTensor)
        kind = next((k for k in kinds if isinstance(sp_ids, k)), None)
        if kind is not None and sp_weights is not None and not isinstance(sp_weights, kind):
            got = type(sp_weights).__name__
            raise TypeError(f"sp_weights must be None or a {kind.__name__} like sp_ids, got {got}")
        if kind is tf.SparseTensor:
            flat = sp_ids.values
        elif kind is tf.RaggedTensor:
            flat = sp_ids.flat_values
        else:
            raise TypeError(f"sp_ids must be a SparseTensor or a RaggedTensor, got {type(sp_ids).__name__}")
        _check_ids_dtype(flat.dtype, self.name)
        rows = self._rows(flat)
        positions = tf.range(tf.size(flat, out_type=tf.int64))  # row i of rows is id i's
        if kind is tf.SparseTensor:
            by_position = tf.SparseTensor(sp_ids.indices, positions, sp_ids.dense_shape)
        else:
            by_position = sp_ids.with_flat_values(positions)
        out = tf.nn.embedding_lookup_sparse(rows, by_position, sp_weights, combiner=combiner, max_norm=max_norm)
        samples = sp_ids.dense_shape[0] if kind is tf.SparseTensor else sp_ids.nrows(out_type=tf.int64)
        out = _with_trailing_zero_rows(out, samples)
        out.set_shape([sp_ids.shape[0], self.emb_vec_size])
        return out

    def compute_output_shape(self, input_shape: Any) -> tuple:
        return (tuple(input_shape)[0], self.emb_vec_size)
