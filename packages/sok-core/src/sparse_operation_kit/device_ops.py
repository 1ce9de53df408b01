"""Id arithmetic that keeps to the GPU, and sizes that keep to the host: TensorFlow's own ops for
these make a host round trip (a copy to the host, which waits for the GPU) under a GPU.

- ``RaggedTensor.value_rowids`` (``tf.ragged.row_splits_to_segment_ids``) sizes its output from
  ``row_splits[-1]``, a value read back from the GPU (one host round trip per call); ``sample_ids``
  takes the size from the values' shape, which the host already knows.
- ``tf.shape(x, out_type=tf.int64)[0]`` is a slice of a host tensor that TensorFlow places on the
  GPU (an int64 op), so an op that takes it on the host (``tf.range``'s limit, ``tf.split``'s
  sizes) reads it back; ``length`` and ``on_host`` keep such scalars on the host.
- ``tf.math.floormod`` has no GPU kernel for int64, so TensorFlow copies the ids to the host and
  back; ``floormod`` computes it from ``floordiv``, which has one.

Example::

    ids = tf.ragged.constant([[3, 4], [], [5]], dtype=tf.int64)
    sample_ids(ids.row_splits, ids.values)   # [0, 0, 2]
    floormod(tf.constant([-3, 4], tf.int64), 2)   # [1, 0]
"""

from __future__ import annotations

import contextlib
from typing import Any

import tensorflow as tf

__all__ = ["floormod", "length", "on_host", "sample_ids"]


def on_host() -> contextlib.AbstractContextManager[Any]:
    """The scope of small integer arithmetic on sizes (a few int64 values) that host-side inputs
    (``tf.range``'s limit, ``tf.split``'s sizes, ``tf.reshape``'s shape) take."""
    return tf.device("/device:CPU:0")


def length(values: tf.Tensor) -> tf.Tensor:
    """``len(values)``: an int64 scalar in host memory, with no copy from the GPU."""
    shape = tf.shape(values, out_type=tf.int64)  # on the values' device, into host memory
    with on_host():
        return shape[0]


def sample_ids(row_splits: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
    """The row (sample) of each of ``values`` (int64 ``[len(values)]``), from ``row_splits``
    (int32 or int64, ``[batch + 1]``, starting at 0 and ending at ``len(values)``)."""
    positions = tf.range(length(values), dtype=tf.int64)
    return tf.searchsorted(tf.cast(row_splits[1:], tf.int64), positions, side="right", out_type=tf.int64)


def floormod(ids: tf.Tensor, n: int) -> tf.Tensor:
    """``ids mod n`` rounded towards minus infinity (``tf.math.floormod``), for int64 ids and
    ``n >= 1``: in ``[0, n)`` also for negative ids."""
    n = tf.constant(n, ids.dtype)
    return ids - tf.math.floordiv(ids, n) * n
