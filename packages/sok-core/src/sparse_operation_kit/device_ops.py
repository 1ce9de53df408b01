"""Id arithmetic that keeps to the GPU, and sizes that keep to the host: TensorFlow's own ops for
these make a host round trip (a copy to the host, which waits for the GPU) under a GPU.

- ``RaggedTensor.value_rowids`` (``tf.ragged.row_splits_to_segment_ids``) sizes its output from
  ``row_splits[-1]``, a value read back from the GPU (one host round trip per call); ``sample_ids``
  takes the size from the values' shape, which the host already knows.
- ``tf.shape(x, out_type=tf.int64)[0]`` is a slice of a host tensor that TensorFlow places on the
  GPU (an int64 op), so an op that takes it on the host (``tf.range``'s limit, ``tf.split``'s
  sizes) reads it back; ``length`` and ``on_host`` keep such scalars on the host.
- ``tf.range(n, dtype=tf.int64)`` makes its start and step int64 constants on the GPU, which its
  GPU kernel takes in host memory: two copies back per range; ``arange`` makes them on the host.
- ``x[:n]`` and ``x[n]`` with ``n`` an int64 scalar on the host stack ``n`` into an int64 vector on
  the GPU, which the slice's GPU kernel reads from host memory, and a slice's gradient pads with
  paddings made the same way: ``head_rows`` is a split whose sizes are made on the host (its
  gradient a concat); ``tf.gather`` takes one row.
- ``tf.math.floormod`` has no GPU kernel for int64, so TensorFlow copies the ids to the host and
  back; ``floormod`` computes it from ``floordiv``, which has one.
- ``tf.argsort`` (a ``TopKV2``) and ``tf.math.bincount`` take no int64 keys on the GPU, and int32
  tensors of GPU ops live on the host: grouping ids by owner or table with them ran on the host,
  every id copied there and back. ``group_by_key`` is SOK's own op (a radix sort on the GPU).
- One ``sample_ids`` per table is a range and a search per table; ``sample_ids_of`` does all the
  tables of a call in one of each.
- ``tf.unique`` on the GPU is a dozen kernels and a host round trip per tensor; ``unique_index_list``
  indexes the keys of every table of a call in one op, with one round trip for all of them.

Example::

    ids = tf.ragged.constant([[3, 4], [], [5]], dtype=tf.int64)
    sample_ids(ids.row_splits, ids.values)   # [0, 0, 2]
    floormod(tf.constant([-3, 4], tf.int64), 2)   # [1, 0]
    group_by_key(tf.constant([1, 0, 1], tf.int64), 2)   # order [1, 0, 2], counts [1, 2]
    unique_index_list([tf.constant([7, 5, 7], tf.int64)])   # ([[7, 5]], [[0, 1, 0]])
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from sparse_operation_kit import tf_ops

__all__ = [
    "arange",
    "floormod",
    "group_by_key",
    "head_rows",
    "int64_bits",
    "length",
    "lengths",
    "on_host",
    "part_of_each",
    "sample_ids",
    "sample_ids_of",
    "unique_index_list",
]


def on_host() -> contextlib.AbstractContextManager[Any]:
    """The scope of small integer arithmetic on sizes (a few int64 values) that host-side inputs
    (``tf.range``'s limit, ``tf.split``'s sizes, ``tf.reshape``'s shape) take."""
    return tf.device("/device:CPU:0")


def length(values: tf.Tensor) -> tf.Tensor:
    """``len(values)``: an int64 scalar in host memory, with no copy from the GPU. Call it outside
    ``on_host``: there, the shape would be taken on the host, after a copy of all of ``values``."""
    shape = tf.shape(values, out_type=tf.int64)  # on the values' device, into host memory
    with on_host():
        return shape[0]


def arange(limit: tf.Tensor) -> tf.Tensor:
    """``tf.range(limit)`` (int64) on the current device, ``limit`` an int64 scalar in host memory
    (``length``), its start and step made on the host too.

    Example::

        arange(length(ids))   # [0, 1, ..., len(ids) - 1]
    """
    with on_host():
        start, step = tf.constant(0, tf.int64), tf.constant(1, tf.int64)
    return tf.range(start, limit, step)


def head_rows(values: tf.Tensor, count: tf.Tensor) -> tf.Tensor:
    """``values[:count]`` (rows along the first axis), ``count`` an int64 scalar in host memory: the
    first part of a split whose sizes are made on the host.

    Example::

        head_rows(block, local_batch)   # block[:local_batch]
    """
    total = length(values)
    with on_host():
        sizes = tf.stack([count, total - count])
    return tf.split(values, sizes, num=2)[0]


def lengths(values: Sequence[tf.Tensor]) -> tf.Tensor:
    """``[len(v) for v in values]`` of 1-D tensors: an int64 vector in host memory, from one op over
    the shapes of all the tensors of a dtype (never the values themselves), not a shape and a slice
    per tensor."""
    values = list(values)
    positions: dict[tf.DType, list[int]] = {}
    for i, v in enumerate(values):
        positions.setdefault(v.dtype, []).append(i)
    shapes: list[Any] = [None] * len(values)
    for group in positions.values():  # ShapeN takes tensors of one dtype; its outputs are in host memory
        for i, shape in zip(group, tf.shape_n([values[i] for i in group], out_type=tf.int64)):
            shapes[i] = shape
    with on_host():
        return tf.concat(shapes, 0)


def sample_ids(row_splits: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
    """The row (sample) of each of ``values`` (int64 ``[len(values)]``), from ``row_splits``
    (int32 or int64, ``[batch + 1]``, starting at 0 and ending at ``len(values)``)."""
    positions = arange(length(values))
    return tf.searchsorted(tf.cast(row_splits[1:], tf.int64), positions, side="right", out_type=tf.int64)


def int64_bits(keys: tf.Tensor) -> tf.Tensor:
    """Keys as int64: int32 widened, uint64 as their bits (one order for sorting and searching, the
    owner of a key by ``floormod`` of them, as ``sok.load`` places uint64 keys).

    Example::

        int64_bits(tf.constant([2**63], tf.uint64))   # [-2**63]
    """
    if keys.dtype == tf.uint64:
        return tf.bitcast(keys, tf.int64)
    return tf.cast(keys, tf.int64)


def floormod(ids: tf.Tensor, n: int) -> tf.Tensor:
    """``ids mod n`` rounded towards minus infinity (``tf.math.floormod``), for int64 ids and
    ``n >= 1``: in ``[0, n)`` also for negative ids."""
    n = tf.constant(n, ids.dtype)
    return ids - tf.math.floordiv(ids, n) * n


def sample_ids_of(row_splits: Sequence[tf.Tensor], values: Sequence[tf.Tensor]) -> tf.Tensor:
    """``sample_ids`` of several ragged tensors of one batch (``row_splits[t]`` int32 or int64, all
    ``[batch + 1]``), their values one after the other (int64 ``[sum of len(values[t])]``)."""
    splits = tf.stack([tf.cast(s, tf.int64) for s in row_splits])  # [tables, batch + 1]
    offsets = tf.cumsum(splits[:, -1], exclusive=True)  # where each table's values start
    ends = tf.reshape(splits[:, 1:] + offsets[:, None], [-1])  # end of each (table, sample) row
    counts = lengths(values)
    splits_length = length(row_splits[0])
    with on_host():
        total = tf.reduce_sum(counts)
        batch = splits_length - 1
    rows = tf.searchsorted(ends, arange(total), side="right", out_type=tf.int64)
    return rows - tf.math.floordiv(rows, tf.maximum(batch, 1)) * batch


def part_of_each(values: Sequence[tf.Tensor]) -> tf.Tensor:
    """For the elements of ``values`` (1-D tensors) one after the other, the index of the tensor
    each comes from (int64 ``[sum of len(values[t])]``): one range and one search, not a fill per
    tensor."""
    counts = lengths(values)
    with on_host():
        ends = tf.cumsum(counts)
        total = ends[-1]
    return tf.searchsorted(ends, arange(total), side="right", out_type=tf.int64)


def group_by_key(keys: tf.Tensor, num_groups: int) -> tuple[tf.Tensor, tf.Tensor]:
    """``(order, counts)`` of int64 ``keys`` in ``[0, num_groups)``: the indices of the keys grouped
    by key, ascending and stable (``tf.argsort(keys, stable=True)``), and how many keys each group
    has (``tf.math.bincount``), both int64 on the keys' device."""
    return tf_ops.library().sok_group_by_key(keys, num_groups=num_groups)


def unique_index_list(keys: Sequence[tf.Tensor]) -> tuple[list[tf.Tensor], list[tf.Tensor]]:
    """``tf.unique`` of each 1-D key tensor of ``keys`` (int32, int64 or uint64, each its own), in
    one op: per tensor its distinct keys in order of first occurrence and, per key, the int32
    position of its distinct key, so that ``distinct[t][positions[t]] == keys[t]``."""
    keys = list(keys)
    distinct, positions = tf_ops.library().sok_unique_index_list(keys=keys, num_tables=len(keys))
    return list(distinct), list(positions)
