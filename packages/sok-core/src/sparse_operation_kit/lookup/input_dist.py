"""Input distribution: each id of one ``sok.lookup_sparse`` call goes to the rank that holds it.

Every rank groups the ids of all its tables by owner (stably: within an owner, by table, then by
sample) and sends each owner its part in one all-to-all of ``[ids, 2]`` int64 rows ``(table << 40 |
sample, id)``; weights, when given, travel in a second all-to-all with the same splits (so that
their gradient flows back). What a rank sends and receives grows with its own batch, not with the
number of ranks: an id travels once, to its owner.

The owner orders what it received by table, then by source rank, then by sample, and numbers the
samples of the whole call's batch with the sources in rank order (source ``r``'s sample ``s`` is
``s + sum(batch of ranks < r)``), so the pooling of each table sees sorted samples.

Each rank counts its ids per owner and table first (``route``); the call's checks gather those
counts (``record_counts``), so every rank knows on the host what it sends and receives before the
all-to-all, and, for a call of at most ``RECORD_TABLES`` tables, how many ids of each table it
receives: the received ids are then split by table with no count read back from the device.

Example::

    routes = route(plan, keys)
    checks, batch_sizes, sends = agreed_checks(..., exchange=exchange, sends=record_counts(plan, routes))
    owned = send_ids_to_owners(plan, keys, samples, None, routes, batch_sizes, sends, exchange)
    owned.keys[t], owned.samples[t]   # the ids of table t this rank holds, from every rank
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import tensorflow as tf

from sparse_operation_kit import device_ops
from sparse_operation_kit.lookup.exchange import Exchange, int32_counts
from sparse_operation_kit.lookup.plan import ExchangePlan, owners

__all__ = ["RECORD_TABLES", "OwnedIds", "Routes", "record_counts", "route", "send_ids_to_owners"]

#: Bits of a packed ``table << 40 | sample``: samples of a rank's batch below 2**40.
_SAMPLE_BITS = 40
#: The tables per owner whose counts a rank's record of the call's allgather carries: the record
#: has one length whatever the call (NCCL's allgather takes one length from every rank, and a rank
#: whose call differs must get the checks' error, not a collective of mismatched sizes). A call of
#: more tables sends its counts per owner only, and splits what it receives by the device's counts.
RECORD_TABLES = 128


@dataclass(frozen=True)
class OwnedIds:
    """The ids this rank holds, from every rank, per table of the call (empty for the tables it
    does not hold): ``keys`` int64 (a uint64 table's keys as their bits), ``samples`` their sample
    in the call's global batch (non-decreasing), ``weights`` float32 or None. ``batch_sizes`` is
    every rank's local batch (int64 ``[n]``), ``global_batch`` their sum. ``table_rows`` is ``table
    * global_batch + sample`` of every id, by table (non-decreasing), and ``counts`` the ids of each
    table (int64 ``[tables]``): ``row_splits`` reads them."""

    keys: list[tf.Tensor]
    samples: list[tf.Tensor]
    weights: list[tf.Tensor] | None
    batch_sizes: tf.Tensor
    global_batch: tf.Tensor
    table_rows: tf.Tensor
    counts: tf.Tensor

    def row_splits(self, tables: Sequence[int]) -> list[tf.Tensor]:
        """The row splits over the global batch (int64 ``[global_batch + 1]``) of the ids of each of
        ``tables``, from one search for all of them."""
        if not tables:
            return []
        with device_ops.on_host():
            rows = self.global_batch + 1
        picked = tf.constant(list(tables), tf.int64)
        queries = tf.reshape(picked[:, None] * self.global_batch + device_ops.arange(rows)[None, :], [-1])
        starts = tf.gather(tf.cumsum(self.counts, exclusive=True), picked)
        found = tf.searchsorted(self.table_rows, queries, side="left", out_type=tf.int64)
        splits = tf.reshape(found, [len(tables), -1]) - starts[:, None]
        # Split as float64 bits: TensorFlow's Unpack and Split take no int64 values on the GPU.
        parts = tf.split(tf.bitcast(splits, tf.float64), len(tables), axis=0)
        return [tf.reshape(tf.bitcast(part, tf.int64), [-1]) for part in parts]


@dataclass(frozen=True)
class Routes:
    """Where the ids of one call go (the tables' ids one after the other): ``order`` groups them by
    owner (stably: within an owner, by table, then by sample), ``counts`` how many of each table go
    to each rank (int64 ``[n * tables]``, owner after owner), ``tables`` the table of each id (int64)."""

    order: tf.Tensor
    counts: tf.Tensor
    tables: tf.Tensor


def route(plan: ExchangePlan, keys: Sequence[tf.Tensor]) -> Routes:
    """The owners of ``keys`` (per table of the call: int64, a uint64 table's keys as their bits),
    computed for all the tables at once: grouped by ``owner * tables + table``, stably, which keeps
    the ids of an owner by table and then by sample (they come table after table)."""
    tables = device_ops.part_of_each(keys)
    num_tables = len(plan.tables)
    groups = owners(plan, tf.concat(keys, 0), tables) * num_tables + tables
    order, counts = device_ops.group_by_key(groups, plan.n * num_tables)
    return Routes(order, counts, tables)


def record_counts(plan: ExchangePlan, routes: Routes) -> tf.Tensor:
    """What this rank's record of the call's allgather says of its ids (int64 ``[n *
    RECORD_TABLES]``): per owner ``o``, from ``o * RECORD_TABLES``, the ids of each table it sends
    ``o`` (the ids per owner in the first ``n`` values instead, for a call of more tables), zeros
    after."""
    num_tables, n = len(plan.tables), plan.n
    counts = tf.reshape(routes.counts, [n, num_tables])
    if num_tables > RECORD_TABLES:
        return tf.pad(tf.reduce_sum(counts, axis=1), [[0, n * RECORD_TABLES - n]])
    return tf.reshape(tf.pad(counts, [[0, 0], [0, RECORD_TABLES - num_tables]]), [-1])


def send_ids_to_owners(
    plan: ExchangePlan,
    keys: Sequence[tf.Tensor],
    samples: tf.Tensor,
    weights: Sequence[tf.Tensor] | None,
    routes: Routes,
    batch_sizes: tf.Tensor,
    sends: tf.Tensor,
    exchange: Exchange,
) -> OwnedIds:
    """Sends each id (``keys[t]``: int64, in sample order; ``samples``: the local sample of each id of
    every table, one table after the other, int64) to the rank that holds it (``routes``, of the
    same keys); returns what this rank received (see ``OwnedIds``). ``batch_sizes``: every rank's
    local batch (int64 ``[n]``); ``sends[r]``: rank ``r``'s ``record_counts`` (int64 ``[n, n *
    RECORD_TABLES]``); both in host memory, gathered with the call's checks."""
    num_tables, n = len(plan.tables), plan.n
    counts_by_table = num_tables <= RECORD_TABLES  # as record_counts wrote them
    with device_ops.on_host():
        global_batch = tf.reduce_sum(batch_sizes)
        if counts_by_table:
            records = tf.reshape(sends, [n, n, RECORD_TABLES])
            to_me = records[:, plan.rank, :num_tables]  # [source, table]
            received_from, table_counts = tf.reduce_sum(to_me, axis=1), tf.reduce_sum(to_me, axis=0)
            mine = tf.reduce_sum(records[plan.rank, :, :num_tables], axis=1)
        else:
            by_owner = sends[:, :n]  # [source, owner]
            received_from, mine = by_owner[:, plan.rank], by_owner[plan.rank]
        send_counts = int32_counts(mine, "the ids this rank sends")
        received_counts = int32_counts(received_from, "the ids this rank receives")
    order = routes.order
    packed = tf.bitwise.bitwise_or(tf.bitwise.left_shift(routes.tables, _SAMPLE_BITS), samples)
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
        ends = tf.cumsum(received_from)
    positions = device_ops.arange(device_ops.length(received))
    sources = tf.searchsorted(ends, positions, side="right", out_type=tf.int64)
    first_sample = tf.cumsum(batch_sizes, exclusive=True)
    # Grouped by SOK's op and split as float64 bits: TensorFlow's argsort, Bincount and SplitV take no
    # int64 values on the GPU (nor int32 ones in device memory), so they would run on the host, with
    # copies of every id there and back.
    received_tables = tf.bitwise.right_shift(received[:, 0], _SAMPLE_BITS)
    global_samples = tf.bitwise.bitwise_and(received[:, 0], (1 << _SAMPLE_BITS) - 1) + tf.gather(first_sample, sources)
    # Split by the counts from the host where the records carry them (the device's own counts are
    # a copy back and a wait).
    by_table, counts = device_ops.group_by_key(received_tables, num_tables)
    if counts_by_table:
        counts = table_counts

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
        table_rows=tf.gather(received_tables * global_batch + global_samples, by_table),
        counts=counts,
    )
