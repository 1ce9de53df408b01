"""Input distribution: each id of one ``sok.lookup_sparse`` call goes to the rank that holds it.

Every rank sorts the ids of all its tables by owner (stably: within an owner, by table, then by
sample) and sends each owner its part in one all-to-all of ``[ids, 2]`` int64 rows ``(table << 40 |
sample, id)``; weights, when given, travel in a second all-to-all with the same splits (so that
their gradient flows back). What a rank sends and receives grows with its own batch, not with the
number of ranks: an id travels once, to its owner.

The owner orders what it received by table, then by source rank, then by sample, and numbers the
samples of the whole call's batch with the sources in rank order (source ``r``'s sample ``s`` is
``s + sum(batch of ranks < r)``), so the pooling of each table sees sorted samples.

Each rank counts its ids per owner first (``route``); the call's checks gather those counts, so
every rank knows what it sends and receives before the all-to-all, on the host.

Example::

    routes = route(plan, keys)
    checks, batch_sizes, sends = agreed_checks(..., exchange=exchange, sends=routes.counts)
    owned = send_ids_to_owners(plan, keys, samples, None, routes, batch_sizes, sends, exchange)
    owned.keys[t], owned.samples[t]   # the ids of table t this rank holds, from every rank
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import tensorflow as tf

from sparse_operation_kit import device_ops
from sparse_operation_kit.lookup.exchange import Exchange, int32_counts
from sparse_operation_kit.lookup.plan import ExchangePlan, owner

__all__ = ["OwnedIds", "Routes", "route", "send_ids_to_owners"]

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


@dataclass(frozen=True)
class Routes:
    """Where the ids of one call go: ``destinations`` the owner of each id (int32, the tables' ids
    one after the other), ``counts`` how many go to each rank (int64 ``[n]``)."""

    destinations: tf.Tensor
    counts: tf.Tensor


def route(plan: ExchangePlan, keys: Sequence[tf.Tensor]) -> Routes:
    """The owners of ``keys`` (per table of the call: int64, a uint64 table's keys as their bits)."""
    destinations = tf.concat([owner(k, table, plan.n) for k, table in zip(keys, plan.tables)], 0)
    counts = tf.math.bincount(destinations, minlength=plan.n, maxlength=plan.n, dtype=tf.int32)
    return Routes(destinations, tf.cast(counts, tf.int64))


def send_ids_to_owners(
    plan: ExchangePlan,
    keys: Sequence[tf.Tensor],
    samples: Sequence[tf.Tensor],
    weights: Sequence[tf.Tensor] | None,
    routes: Routes,
    batch_sizes: tf.Tensor,
    sends: tf.Tensor,
    exchange: Exchange,
) -> OwnedIds:
    """Sends each id (``keys[t]``: int64, of local samples ``samples[t]``: int64, in sample order)
    to the rank that holds it (``routes``, of the same keys); returns what this rank received (see
    ``OwnedIds``). ``batch_sizes``: every rank's local batch (int64 ``[n]``); ``sends[r, o]``: the
    ids rank ``r`` sends rank ``o`` (int64 ``[n, n]``); both in host memory, gathered with the
    call's checks."""
    num_tables = len(plan.tables)
    with device_ops.on_host():
        global_batch = tf.reduce_sum(batch_sizes)
        send_counts = int32_counts(sends[plan.rank], "the ids this rank sends")
        received_counts = int32_counts(sends[:, plan.rank], "the ids this rank receives")
    destinations = routes.destinations
    tables = tf.concat(
        [tf.fill(tf.shape(k, out_type=tf.int64), tf.constant(t, tf.int64)) for t, k in enumerate(keys)], 0
    )
    order = tf.argsort(destinations, stable=True)
    packed = tf.bitwise.bitwise_or(tf.bitwise.left_shift(tables, _SAMPLE_BITS), tf.concat(samples, 0))
    rows = tf.gather(tf.stack([packed, tf.concat(keys, 0)], axis=1), order)
    received = exchange.alltoall(rows, send_counts, received_counts, name="sok.lookup_sparse: all-to-all of the ids")
    received_weights = None
    if weights is not None:
        received_weights = exchange.alltoall(
            tf.gather(tf.concat(weights, 0), order),
            send_counts,
            received_counts,
            name="sok.lookup_sparse: all-to-all of the weights",
        )

    # By table (stable: then by source rank, then by sample), samples numbered over the global batch.
    with device_ops.on_host():
        ends = tf.cumsum(sends[:, plan.rank])
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
