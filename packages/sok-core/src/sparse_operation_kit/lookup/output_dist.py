"""Output distribution: each owner sends every rank the sums of that rank's samples, for the tables
it holds only.

Rank ``o`` sends rank ``r`` a ``[batch of r, width(o)]`` block: the columns of the tables ``o``
holds (``ExchangePlan.width``; those every rank holds first, ``ExchangePlan.held``), flattened, in
one all-to-all for the whole call. A localized table travels from its rank alone, whole sums; a
distributed table's partial sums come from every rank and the requester adds them up. When ``o``
holds a dynamic table, its block ends with one more row: the TensorFlow error code of its lookup of
each dynamic table, in that table's first column, so a rank whose lookup failed (a full ``"hbm"``
table, say) still joins the exchange and every rank then raises an error naming the table and the
failing ranks.

Example::

    pooled = return_sums(plan, partial, statuses, empty, owned.batch_sizes, local_batch, exchange)
    pooled[t]   # [local_batch, dim_t], not yet divided by the combiner
"""

from __future__ import annotations

import tensorflow as tf

from sparse_operation_kit import device_ops
from sparse_operation_kit.lookup.asserts import gate, raise_unless
from sparse_operation_kit.lookup.exchange import Exchange, int32_counts
from sparse_operation_kit.lookup.local_lookup import Status
from sparse_operation_kit.lookup.plan import ExchangePlan

__all__ = ["return_sums"]


def return_sums(
    plan: ExchangePlan,
    partial: dict[int, tf.Tensor],
    statuses: dict[int, Status],
    empty: list[tf.Tensor],
    batch_sizes: tf.Tensor,
    local_batch: tf.Tensor,
    exchange: Exchange,
) -> list[tf.Tensor]:
    """Sends each rank its samples' rows of ``partial`` (this rank's sums over the global batch, per
    table it holds) and returns the sums ``[local_batch, dim_t]`` of every table of the call.
    ``empty`` (``[0, dim]`` reads of the tables this rank does not hold) travel along, adding no
    element: their gradient comes back empty."""
    n, rank = plan.n, plan.rank
    # What rank o sends each rank: [that rank's batch (+ o's status row), o's width], flattened.
    widths = [plan.width(o) for o in range(n)]
    extras = [1 if plan.reports_status(o) else 0 for o in range(n)]
    if widths[rank]:
        send = tf.concat([partial[t] for t in plan.held(rank)], axis=1)
        if extras[rank]:
            row = _status_row(plan, statuses)
            chunks = tf.split(send, batch_sizes, num=n)
            send = tf.concat([part for chunk in chunks for part in (chunk, row)], axis=0)
        send = tf.reshape(send, [-1])
    else:
        send = tf.zeros([0], tf.float32)
    with device_ops.on_host():
        splits = int32_counts((batch_sizes + extras[rank]) * widths[rank], "the pooled rows this rank sends")
        sizes = int32_counts(
            tf.stack([(local_batch + extras[o]) * widths[o] for o in range(n)]), "the pooled rows this rank receives"
        )
        shapes = [tf.stack([local_batch + extras[o], widths[o]]) for o in range(n)]
    send = tf.concat([send] + [tf.reshape(rows, [-1]) for rows in empty], 0)
    received = exchange.alltoall(send, splits, sizes, name="sok.lookup_sparse: all-to-all of the pooled rows")

    blocks = [tf.reshape(part, shape) for part, shape in zip(tf.split(received, sizes, num=n), shapes)]
    columns = [plan.columns(o) for o in range(n)]
    checks = _assert_lookups_worked(plan, blocks, columns, statuses, local_batch)
    # Every block leads with the spread tables' partial sums (plan.held's order): one sum of those
    # columns over the blocks and one split into tables, not a sum per table; the columns of the
    # tables a rank holds alone are split from its block. Splits, not slices: the gradient of a
    # split is one concat, that of a slice a whole block of zeros.
    spread = plan.spread()
    spread_width = sum(plan.tables[t].dim for t in spread)
    partial_sums, outputs_of = [], {}
    for o, block in enumerate(blocks):
        rows = device_ops.head_rows(block, local_batch) if extras[o] else block
        alone = plan.held(o)[len(spread) :]
        parts = tf.split(rows, [spread_width, widths[o] - spread_width], axis=1) if spread and alone else [rows]
        if spread:
            partial_sums.append(parts[0])
        if alone:
            outputs_of.update(zip(alone, tf.split(parts[-1], [plan.tables[t].dim for t in alone], axis=1)))
    if spread:
        summed = tf.add_n(partial_sums)
        outputs_of.update(zip(spread, tf.split(summed, [plan.tables[t].dim for t in spread], axis=1)))
    outputs = [outputs_of[t] for t in range(len(plan.tables))]
    if checks:
        with tf.control_dependencies(checks):
            outputs = [tf.identity(out) for out in outputs]
    return outputs


def _status_row(plan: ExchangePlan, statuses: dict[int, Status]) -> tf.Tensor:
    """``[1, width]``: zeros, but the first column of each dynamic table's block holds the TensorFlow
    error code of this rank's lookup of it (0: it worked); one scatter for all the tables."""
    columns = plan.columns(plan.rank)
    reported = [t for t in plan.held(plan.rank) if t in statuses]
    width = plan.width(plan.rank)
    if not reported:
        return tf.zeros([1, width], tf.float32)
    codes = tf.cast(tf.stack([statuses[t][0] for t in reported]), tf.float32)
    row = tf.scatter_nd([[columns[t]] for t in reported], codes, [width])
    return tf.reshape(row, [1, width])


def _assert_lookups_worked(
    plan: ExchangePlan,
    blocks: list[tf.Tensor],
    columns: list[dict[int, int]],
    statuses: dict[int, Status],
    local_batch: tf.Tensor,
) -> list[tf.Operation]:
    """Asserts, on every rank, that every holder's lookup of each dynamic table worked (the status
    rows at the end of the holders' blocks): one gather of every code and one check read on the
    host, whatever the number of tables; the messages are made only when a lookup failed. The error
    names the table and the failing ranks; on a failing rank it also gives the backend's message."""
    dynamic = [t for t, table in enumerate(plan.tables) if table.kind == "dynamic"]
    if not dynamic:
        return []
    # codes[k]: the code that rank holders[k] sent for table tables[k]; one gather per block.
    pairs = [(o, t) for o in range(plan.n) for t in dynamic if o in plan.tables[t].holders]
    codes = tf.cast(
        tf.concat(
            [
                tf.gather(tf.gather(blocks[o], local_batch), [columns[o][t] for p, t in pairs if p == o])
                for o in sorted({o for o, _ in pairs})
            ],
            0,
        ),
        tf.int32,
    )
    worked = tf.reduce_all(tf.equal(codes, 0))

    def report() -> tf.Tensor:
        checks = []
        for t in dynamic:
            table = plan.tables[t]
            mine = [k for k, (_, u) in enumerate(pairs) if u == t]
            holders = tf.constant([pairs[k][0] for k in mine], tf.int64)
            table_codes = tf.gather(codes, mine)
            failed = tf.strings.reduce_join(
                tf.strings.as_string(tf.gather(holders, tf.where(tf.not_equal(table_codes, 0))[:, 0])), separator=", "
            )
            own = statuses.get(t)
            local = (
                tf.constant("none (it does not hold this table)")
                if own is None
                else tf.where(tf.equal(own[0], 0), tf.constant("none (its lookup worked)"), own[1])
            )
            message = tf.strings.join(
                [
                    f"sok.lookup_sparse: the lookup of table {table.param.name} (params[{t}], var_type "
                    f"{table.param.backend_type}) failed on rank(s) [",
                    failed,
                    f"], so the call fails on every rank; later calls work again. Fix the cause (e.g. a larger "
                    f"max_capacity, or a var_type with eviction). The error on rank {plan.rank}: ",
                    local,
                ]
            )
            check = raise_unless(tf.reduce_all(tf.equal(table_codes, 0)), message)
            if check is not None:
                checks.append(check)
        with tf.control_dependencies(checks):
            return tf.identity(worked)

    checked = gate(worked, report)
    return [] if tf.executing_eagerly() else [checked.op]
