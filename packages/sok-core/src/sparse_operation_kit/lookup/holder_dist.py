"""Input distribution with nothing read from a GPU: each table's ids and row splits go whole to
every rank that holds rows of it.

The routed exchange (``input_dist``) sends each id to its owner alone, so the sizes of its
all-to-all are counts the device makes, which the host must read back before it can start the
collective: the GPU drains there, and waits again while the host launches what follows. Here every
size is a tensor's shape, which the host knows when the tensor is allocated: rank ``r`` sends rank
``o``, for each table ``o`` holds rows of (``ExchangePlan.held``: every distributed table, and the
tables localized on ``o``), its ``batch + 1`` row splits and all its ids of that table (a uint64
table's keys as their int64 bits), and one more value, its count of problems (ids outside a table,
...), which every rank then checks after the exchange (``checks.agreed_shapes``). The holder pools
the rows it holds and skips the ids it does not (``pooled_lookup``'s shards); of a dynamic table it
keeps the keys it owns before the lookup, which inserts them (``local_lookup.pool_received_dynamic``).
A distributed table's ids reach all ``n`` ranks, so each sends ``n`` times its ids of those tables
(8 bytes an id, where the routed exchange sends 16 to one owner), while the pooled rows, the larger
part at any dim, do not change. Which calls take it: ``exchange.IDS_SETTING`` (by default every
call with Horovod's collectives, but one with the low-frequency filter).

Example::

    agreement = agreed_shapes(..., record_tables=RECORD_TABLES)
    held = send_ids_to_holders(plan, ragged, weights, agreement, exchange)
    held.ids[t], held.row_splits[t]   # table t's ids over the global batch, from every rank
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import tensorflow as tf

from sparse_operation_kit import device_ops
from sparse_operation_kit.lookup.checks import ShapeAgreement
from sparse_operation_kit.lookup.exchange import Exchange, int32_counts
from sparse_operation_kit.lookup.plan import ExchangePlan

__all__ = ["HeldIds", "send_ids_to_holders"]


@dataclass(frozen=True)
class HeldIds:
    """What a rank received for the tables it holds (``plan.held(rank)``), per table: ``ids`` (int64,
    a uint64 table's keys as their bits) and ``row_splits`` (int64 ``[global_batch + 1]``) over
    the call's global batch (source rank ``s``'s sample ``b`` is sample ``b + sum(batch of ranks <
    s)``), ``weights`` (float32) or None; ``totals`` every rank's count of problems (int64 ``[n]``,
    on the device)."""

    ids: dict[int, tf.Tensor]
    row_splits: dict[int, tf.Tensor]
    weights: dict[int, tf.Tensor] | None
    totals: tf.Tensor


def send_ids_to_holders(
    plan: ExchangePlan,
    ragged: Sequence[tf.RaggedTensor],
    weights: Sequence[tf.RaggedTensor] | None,
    agreement: ShapeAgreement,
    exchange: Exchange,
) -> HeldIds:
    """Sends every rank the row splits and ids (and weights) of each table it holds, with this
    rank's count of problems (``agreement.total``), in one all-to-all (a second for the weights);
    returns what this rank received. ``ragged``: one table's ids per entry (int32, int64 or a
    dynamic table's uint64 keys), the same local batch for all."""
    n, rank = plan.n, plan.rank
    held = [plan.held(o) for o in range(n)]
    mine = held[rank]
    ids = [device_ops.int64_bits(r.values) for r in ragged]
    splits = [tf.cast(r.row_splits, tf.int64) for r in ragged]
    total = tf.reshape(tf.cast(agreement.total, tf.int64), [1])
    send = tf.concat([part for o in range(n) for part in [total] + _pieces(held[o], splits, ids)], 0)

    with device_ops.on_host():
        batch, nnz = agreement.batch_sizes, agreement.nnz  # [n], [n, tables]
        local = nnz[rank]
        send_counts = tf.stack([tf.reduce_sum(_pieces_of(held[o], batch[rank], local)) for o in range(n)])
        from_each = [_pieces_of(mine, batch[s], nnz[s]) for s in range(n)]  # [total, splits, ids per table]
        sizes = tf.concat(from_each, 0)
        received_counts = tf.stack([tf.reduce_sum(part) for part in from_each])
        send_counts = int32_counts(send_counts, "the ids this rank sends")
        received_counts = int32_counts(received_counts, "the ids this rank receives")
    received = exchange.alltoall(send, send_counts, received_counts, name="sok.lookup_sparse: all-to-all of the ids")
    # Split as float64 bits: TensorFlow's SplitV takes no int64 values on the GPU.
    each = 2 + len(mine)  # pieces from each source
    parts = [tf.bitcast(p, tf.int64) for p in tf.split(tf.bitcast(received, tf.float64), sizes, num=n * each)]
    per_source = [parts[s * each : (s + 1) * each] for s in range(n)]
    totals = tf.concat([p[0] for p in per_source], 0)
    received_weights = None if weights is None else _send_weights(plan, held, weights, agreement.nnz, exchange)
    if not mine:
        return HeldIds({}, {}, received_weights, totals)

    with device_ops.on_host():
        mine_nnz = tf.gather(nnz, mine, axis=1)  # [n, held tables]
        before = tf.cumsum(mine_nnz, axis=0, exclusive=True)  # ids of each table from lower ranks
        shifts = [before[s][:, None] for s in range(n)]
        ends = tf.reshape(tf.reduce_sum(mine_nnz, axis=0), [len(mine), 1])
        shapes = [tf.stack([tf.constant(len(mine), tf.int64), batch[s] + 1]) for s in range(n)]
    # Each source's splits of every held table, shifted past the lower ranks' ids: [held, batch_s + 1].
    starts = [tf.reshape(p[1], shapes[s])[:, :-1] + shifts[s] for s, p in enumerate(per_source)]
    global_splits = tf.concat(starts + [ends], axis=1)
    rows = tf.split(tf.bitcast(global_splits, tf.float64), len(mine), axis=0)
    row_splits = {t: tf.reshape(tf.bitcast(r, tf.int64), [-1]) for t, r in zip(mine, rows)}
    by_table = {t: tf.concat([p[2 + k] for p in per_source], 0) for k, t in enumerate(mine)}
    return HeldIds(by_table, row_splits, received_weights, totals)


def _send_weights(
    plan: ExchangePlan,
    held: list[list[int]],
    weights: Sequence[tf.RaggedTensor],
    nnz: tf.Tensor,
    exchange: Exchange,
) -> dict[int, tf.Tensor]:
    """The weights of the ids of each table this rank holds, over the global batch (as the ids), in
    one all-to-all with the ids' counts (every rank makes it, also one that holds no table)."""
    n, mine = plan.n, held[plan.rank]
    values = [w.values for w in weights]
    with device_ops.on_host():
        mine_nnz = tf.gather(nnz, mine, axis=1) if mine else tf.zeros([n, 0], tf.int64)
        received = int32_counts(tf.reduce_sum(mine_nnz, axis=1), "the weights this rank receives")
        local = nnz[plan.rank]
        sent = int32_counts(
            tf.stack([tf.reduce_sum(tf.gather(local, held[o])) if held[o] else _zero() for o in range(n)]),
            "the weights this rank sends",
        )
        sizes = tf.reshape(mine_nnz, [-1])  # source after source, table after table
    moved = exchange.alltoall(
        tf.concat([values[t] for o in range(n) for t in held[o]], 0),
        sent,
        received,
        name="sok.lookup_sparse: all-to-all of the weights",
    )
    if not mine:
        return {}
    pieces = tf.split(moved, sizes, num=n * len(mine))
    return {t: tf.concat([pieces[s * len(mine) + k] for s in range(n)], 0) for k, t in enumerate(mine)}


def _pieces(tables: list[int], splits: list[tf.Tensor], ids: list[tf.Tensor]) -> list[tf.Tensor]:
    """What one rank sends a holder of ``tables`` after its count: their row splits, then their ids."""
    return [splits[t] for t in tables] + [ids[t] for t in tables]


def _pieces_of(tables: list[int], batch: tf.Tensor, nnz: tf.Tensor) -> tf.Tensor:
    """The sizes of what a rank of ``batch`` samples and ``nnz`` ids per table sends a holder of
    ``tables`` (int64, host): its count, the row splits of all of them, and each one's ids."""
    head = tf.stack([tf.constant(1, tf.int64), len(tables) * (batch + 1)])
    return tf.concat([head, tf.gather(nnz, tables)], 0) if tables else head


def _zero() -> tf.Tensor:
    return tf.constant(0, tf.int64)
