"""Id arithmetic that stays on the GPU: TensorFlow's own ops for these run on the host there.

- ``RaggedTensor.value_rowids`` (``tf.ragged.row_splits_to_segment_ids``) sizes its output from
  ``row_splits[-1]``, a value read back from the GPU (one host round trip per call); ``sample_ids``
  takes the size from the values' shape, which the host already knows.
- ``tf.math.floormod`` has no GPU kernel for int64, so TensorFlow copies the ids to the host and
  back; ``floormod`` computes it from ``floordiv``, which has one.

Example::

    ids = tf.ragged.constant([[3, 4], [], [5]], dtype=tf.int64)
    sample_ids(ids.row_splits, ids.values)   # [0, 0, 2]
    floormod(tf.constant([-3, 4], tf.int64), 2)   # [1, 0]
"""

from __future__ import annotations

import tensorflow as tf

__all__ = ["floormod", "sample_ids"]


def sample_ids(row_splits: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
    """The row (sample) of each of ``values`` (int64 ``[len(values)]``), from ``row_splits``
    (int32 or int64, ``[batch + 1]``, starting at 0 and ending at ``len(values)``)."""
    positions = tf.range(tf.shape(values, out_type=tf.int64)[0], dtype=tf.int64)
    return tf.searchsorted(tf.cast(row_splits[1:], tf.int64), positions, side="right", out_type=tf.int64)


def floormod(ids: tf.Tensor, n: int) -> tf.Tensor:
    """``ids mod n`` rounded towards minus infinity (``tf.math.floormod``), for int64 ids and
    ``n >= 1``: in ``[0, n)`` also for negative ids."""
    n = tf.constant(n, ids.dtype)
    return ids - tf.math.floordiv(ids, n) * n
