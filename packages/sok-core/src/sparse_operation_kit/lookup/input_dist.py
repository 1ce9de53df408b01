"""Input distribution: each id of one ``sok.lookup_sparse`` call goes to the rank that holds it.

Every rank sorts the ids of all its tables by owner (stably: within an owner, by table, then by
sample) and sends each owner its part in one all-to-all of ``[ids, 2]`` int64 rows ``(table << 40 |
sample, id)``; weights, when given, travel in a second all-to-all with the same splits (so that
their gradient flows back). What a rank sends and receives grows with its own batch, not with the
number of ranks: an id travels once, to its owner.

The owner orders what it received by table, then by source rank, then by sample, and numbers the
samples of the whole call's batch with the sources in rank order (source ``r``'s sample ``s`` is
``s + sum(batch of ranks < r)``), so the pooling of each table sees sorted samples.

Example::

    owned = send_ids_to_owners(plan, keys, samples, None, batch_sizes, comm)
    owned.keys[t], owned.samples[t]   # the ids of table t this rank holds, from every rank
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import tensorflow as tf

from sparse_operation_kit import communication, device_ops
from sparse_operation_kit.lookup.plan import ExchangePlan, owner

__all__ = ["OwnedIds", "send_ids_to_owners"]

#: Bits of a packed ``table << 40 | sample``: samples of a rank's batch below 2**40.
_SAMPLE_BITS = 40


@dataclass(frozen=True)
class OwnedIds:
    """The ids this rank holds, from every rank, per table of the call (empty for the tables it
    does not hold): ``keys`` int64 (a uint64 table's keys as their bits), ``samples`` their sample
    in the call's global batch (non-decreasing), ``weights`` float32 or None. ``batch_sizes`` is
    every rank's local batch (int64 ``[n]``), ``global_batch`` their sum."""

    keys: list[tf.Tensor]
    samples: list[tf.Tensor]
    weights: list[tf.Tensor] | None
    batch_sizes: tf.Tensor
    global_batch: tf.Tensor


def send_ids_to_owners(
    plan: ExchangePlan,
    keys: Sequence[tf.Tensor],
    samples: Sequence[tf.Tensor],
    weights: Sequence[tf.Tensor] | None,
    batch_sizes: tf.Tensor,
    comm: communication.CommunicationTool,
) -> OwnedIds:
    """Sends each id (``keys[t]``: int64, of local samples ``samples[t]``: int64, in sample order)
    to the rank that holds it; returns what this rank received (see ``OwnedIds``). ``batch_sizes``:
    every rank's local batch (int64 ``[n]``, gathered with the call's checks)."""
    n, num_tables = plan.n, len(plan.tables)
    with device_ops.on_host():  # one copy of the batch sizes to the host, for every size below
        batch_sizes = tf.identity(batch_sizes)
        global_batch = tf.reduce_sum(batch_sizes)
    destinations = tf.concat([owner(k, table, n) for k, table in zip(keys, plan.tables)], 0)
    tables = tf.concat(
        [tf.fill(tf.shape(k, out_type=tf.int64), tf.constant(t, tf.int64)) for t, k in enumerate(keys)], 0
    )
    order = tf.argsort(destinations, stable=True)
    packed = tf.bitwise.bitwise_or(tf.bitwise.left_shift(tables, _SAMPLE_BITS), tf.concat(samples, 0))
    rows = tf.gather(tf.stack([packed, tf.concat(keys, 0)], axis=1), order)
    splits = tf.math.bincount(destinations, minlength=n, maxlength=n, dtype=tf.int32)
    received, received_splits = comm.alltoall(rows, splits, name="sok.lookup_sparse: all-to-all of the ids")
    received_weights = None
    if weights is not None:
        received_weights, _ = comm.alltoall(
            tf.gather(tf.concat(weights, 0), order), splits, name="sok.lookup_sparse: all-to-all of the weights"
        )

    # By table (stable: then by source rank, then by sample), samples numbered over the global batch.
    ends = tf.cumsum(tf.cast(received_splits, tf.int64))
    positions = tf.range(device_ops.length(received), dtype=tf.int64)
    sources = tf.searchsorted(ends, positions, side="right", out_type=tf.int64)
    first_sample = tf.cumsum(batch_sizes, exclusive=True)
    # int32 tables, counts and sort keys, float64 bits: TensorFlow's GPU kernels of Bincount and
    # SplitV take no int64 values (nor, we suspect, the TopKV2 under argsort), and the placer would
    # run them on the CPU, with copies of every id to the host and back.
    received_tables = tf.cast(tf.bitwise.right_shift(received[:, 0], _SAMPLE_BITS), tf.int32)
    global_samples = tf.bitwise.bitwise_and(received[:, 0], (1 << _SAMPLE_BITS) - 1) + tf.gather(first_sample, sources)
    by_table = tf.argsort(received_tables, stable=True)
    counts = tf.math.bincount(received_tables, minlength=num_tables, maxlength=num_tables, dtype=tf.int32)

    def per_table(values: tf.Tensor) -> list[tf.Tensor]:
        ordered = tf.gather(values, by_table)
        if ordered.dtype != tf.int64:
            return tf.split(ordered, counts, num=num_tables)
        parts = tf.split(tf.bitcast(ordered, tf.float64), counts, num=num_tables)
        return [tf.bitcast(part, tf.int64) for part in parts]

    return OwnedIds(
        keys=per_table(received[:, 1]),
        samples=per_table(global_samples),
        weights=None if received_weights is None else per_table(received_weights),
        batch_sizes=batch_sizes,
        global_batch=global_batch,
    )
