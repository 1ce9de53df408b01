"""The embedding cache of one HPS table: a SOK dynamic table that the lookups read in the graph.

The cache is a non-trainable ``sok.DynamicVariable``: the HKV backend (``var_type="hybrid"``, a
bucketed table that evicts the lowest-score row of a full bucket, LRU by write time) when a
database tier stands behind it, on the GPU when TensorFlow sees one and on the CPU otherwise. Its
capacity is ``gpucacheper`` x the table's rows, rounded up to a power of two (HKV's capacities are
powers of two) and at least one bucket (128 rows).

With no database at all the cache is the table's only store: it must hold every row and never
drop one, so it is then a det table (``var_type="hbm"``, it grows and never evicts) and
``gpucacheper`` does not apply.

Reads (:meth:`EmbeddingCache.find`) and writes (:meth:`EmbeddingCache.insert`,
:meth:`EmbeddingCache.update_present`) are TensorFlow ops of sok-core's op library
(``SokFind``, ``SokInsertOrAssign``) on the cache's device; the storage is safe for concurrent
calls from many threads.

Example::

    cache = EmbeddingCache("hps_et.foo.sparse_embedding0", dim=16, rows=30000, fraction=0.2,
                           key_dtype=tf.int64, evicting=True)
    values, found = cache.find(tf.constant([1, 2, 3], tf.int64))
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import tensorflow as tf
from sok_backend_hkv.plugin import DEFAULT_INIT_CAPACITY, rounded_capacity
from sparse_operation_kit import tf_ops
from sparse_operation_kit.dynamic_variable import DynamicVariable

logger = logging.getLogger(__name__)

__all__ = ["EmbeddingCache", "cache_device"]


def cache_device() -> str:
    """The TensorFlow device of the caches: the first GPU TensorFlow sees, else the CPU."""
    return "/GPU:0" if tf.config.list_logical_devices("GPU") else "/CPU:0"


def capacity_of(rows: int, fraction: float) -> int:
    """The capacity of an evicting cache for ``rows`` rows at ``gpucacheper`` = ``fraction``: what
    the hkv backend makes of ``ceil(fraction * rows)`` (``rounded_capacity``: a power of two, at
    least one bucket).

    Example::

        >>> capacity_of(30000, 0.2)
        8192
    """
    wanted = max(1, math.ceil(fraction * rows))
    capacity = rounded_capacity(wanted)
    if capacity is None:
        raise ValueError(f"a cache of {wanted:,} rows ({fraction} of {rows:,}) is beyond what an hkv table holds")
    return capacity


def hkv_options(capacity: int) -> dict[str, Any]:
    """The ``DynamicVariable`` storage options of an evicting cache of ``capacity`` rows (a power
    of two, :func:`capacity_of`): an hkv table that never grows past it and evicts the least
    recently written row. The C++ server creates its evicting caches with the same options
    (``_serving.hkv_cache_options``, csrc/serving/storage_options.hpp).

    Example::

        >>> hkv_options(8192)
        {'var_type': 'hybrid', 'init_capacity': 8192, 'max_capacity': 8192, 'evict_strategy': 'lru'}
    """
    return {
        "var_type": "hybrid",
        "init_capacity": min(capacity, DEFAULT_INIT_CAPACITY),
        "max_capacity": capacity,
        "evict_strategy": "lru",
    }


class EmbeddingCache:
    """The cache of one table (``tag``) of ``dim`` float32 columns.

    Args:
        tag: the table's tag (``hps_et.<model>.<table>``), the variable's name.
        dim: the embedding width.
        rows: the rows of the table (sizes the cache).
        fraction: ``gpucacheper``, the fraction of ``rows`` the cache holds (evicting caches).
        key_dtype: ``tf.int64`` (``supportlonglong``) or ``tf.int32``.
        evicting: True for an HKV cache of bounded capacity in front of a database; False for a
            det table that holds every row (no database, ``static`` / ``uvm``, or ``gpucacheper``
            1.0).
    """

    def __init__(self, tag: str, dim: int, rows: int, fraction: float, key_dtype: Any, evicting: bool) -> None:
        self.tag = tag
        self.dim = int(dim)
        self.key_dtype = tf.as_dtype(key_dtype)
        self.device = cache_device()
        name = tag.replace(".", "_")
        if evicting:
            self.capacity: int | None = capacity_of(rows, fraction)
            storage: dict[str, Any] = hkv_options(self.capacity)
        else:
            self.capacity = None
            storage = {"var_type": "hbm"}
        with tf.device(self.device):
            self.variable = DynamicVariable(
                dimension=self.dim, name=name, trainable=False, key_type=self.key_dtype, initializer="zeros", **storage
            )
        logger.info(
            "HPS cache of %s on %s: %s",
            tag,
            self.variable.table_device,
            f"{self.capacity} rows (hkv, evicting)" if evicting else "every row (det, never evicting)",
        )

    @property
    def evicting(self) -> bool:
        """Whether rows can leave the cache (an HKV cache in front of a database)."""
        return self.capacity is not None

    def find(self, keys: tf.Tensor, inputs: tuple[tf.Tensor, tf.Tensor] | None = None) -> tuple[tf.Tensor, tf.Tensor]:
        """``(values [n, dim], found [n])`` of the 1-D ``keys`` (zeros where not found); an op in
        the current graph, on the cache's device. ``inputs``: the table inputs of the op (a
        lookup graph's own, :func:`sparse_operation_kit.python_ops.resolved_table_inputs`), by
        default the variable's."""
        with tf.device(self.variable.table_device):
            inputs = inputs or self.variable.table_inputs
            return tf_ops.library().sok_find(*inputs, keys, col_begin=0, col_end=self.dim)

    def find_or_default(
        self, keys: tf.Tensor, default_value: float, inputs: tuple[tf.Tensor, tf.Tensor] | None = None
    ) -> tf.Tensor:
        """The rows ``[n, dim]`` of the 1-D ``keys``, ``default_value`` in every column of a key not
        found (written by the lookup kernel itself); an op in the current graph, on the cache's
        device. ``inputs`` as :meth:`find`'s."""
        with tf.device(self.variable.table_device):
            row = tf.constant(np.full([self.dim], default_value, np.float32))
            inputs = inputs or self.variable.table_inputs
            values, _ = tf_ops.library().sok_find_or_default(*inputs, keys, row, col_begin=0, col_end=self.dim)
            return values

    def insert(self, keys: Any, values: Any) -> None:
        """Insert or overwrite the rows of ``keys`` (1-D, the cache's key dtype) with ``values``
        ``[n, dim]``; an evicting cache drops other rows to make room."""
        keys = tf.convert_to_tensor(keys, self.key_dtype)
        values = tf.convert_to_tensor(values, tf.float32)
        with tf.device(self.variable.table_device):
            tf_ops.library().sok_insert_or_assign(
                *self.variable.table_inputs, keys, values, col_begin=0, col_end=self.dim
            )

    def update_present(self, keys: Any, values: Any) -> int:
        """Overwrite the rows of those ``keys`` the cache holds (an online update: rows not cached
        stay out, so an update never evicts hot rows); returns how many were cached. Eager."""
        keys = tf.convert_to_tensor(keys, self.key_dtype)
        values = tf.convert_to_tensor(values, tf.float32)
        _, found = self.find(keys)
        present = tf.where(found)[:, 0]
        if int(tf.size(present)) > 0:
            self.insert(tf.gather(keys, present), tf.gather(values, present))
        return int(tf.size(present))

    def size(self) -> int:
        """The rows in the cache now."""
        with tf.device(self.variable.table_device):
            return int(tf_ops.library().sok_size(*self.variable.table_inputs))
