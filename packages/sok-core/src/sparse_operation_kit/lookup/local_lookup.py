"""Local lookup: the owner reads the rows of the ids it holds and pools them per sample.

Each distinct id is read once (a dynamic table inserts it once; the gradient has one row per
distinct id: for a dynamic table it carries its distinct index to the optimizer), then the rows
are summed per sample, weighted, with no division (the requester divides: it knows its samples'
lengths and weights). The static tables this rank holds on one device are pooled by one
``pooled_lookup`` op for all of them; the dynamic ones per device by ``pool_dynamic``: one op
indexes the keys of all of them, each table reads the rows of its distinct keys, and one
``pooled_lookup`` pools those rows. Static tables elsewhere, and dynamic ones under the filter, by
TensorFlow ops. With ``low_frequency_filter`` the occurrences of a dynamic table's keys that
``_admitted`` drops are left out before the read: not inserted, not summed, no gradient.

Example::

    partial, statuses = pool_held(plan, owned, low_frequency_filter=False)
    partial[t]   # [global_batch, dim_t]: this rank's share of table t's sums
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from sparse_operation_kit import device_ops, pooled_lookup, tf_ops
from sparse_operation_kit.dynamic_variable import DynamicVariable, read_distinct, try_sparse_read
from sparse_operation_kit.lookup.holder_dist import HeldIds
from sparse_operation_kit.lookup.input_dist import OwnedIds
from sparse_operation_kit.lookup.plan import ExchangePlan, TablePlan, dynamic_groups, fused_tables, on_gpu, shard
from sparse_operation_kit.serving_table import saving

__all__ = [
    "Status",
    "empty_reads",
    "pool_dynamic",
    "pool_fused",
    "pool_held",
    "pool_received_dynamic",
    "pool_rows",
]

#: A dynamic table's lookup on this rank: TensorFlow's error code (0: it worked) and the message.
Status = tuple[tf.Tensor, tf.Tensor]


def _as_table_keys(keys: tf.Tensor, param: DynamicVariable) -> tf.Tensor:
    """Ids as the table's key dtype (int32/int64 ids for int64 tables, int64 bits for uint64 ones;
    int64 ids for int32 tables were range-checked by checks.agreed_checks)."""
    if keys.dtype == param.key_type:
        return keys
    if param.key_type == tf.uint64:
        return tf.bitcast(tf.cast(keys, tf.int64), tf.uint64)
    return tf.cast(keys, param.key_type)


def _admitted(param: DynamicVariable, keys: tf.Tensor) -> tf.Tensor | None:
    """SOK's low-frequency filter: a bool mask of the occurrences of ``keys`` to look up, or None
    (all of them) when the table's ``filter_ratio`` is 1. An occurrence of a key the table holds is
    kept; one of a key it does not hold is kept with probability ``filter_ratio``, independently
    per occurrence (``tf.random.uniform``: reproducible under ``tf.random.set_seed``). The table is
    read without inserting anything."""
    ratio = param.filter_ratio
    if ratio >= 1.0 or saving():  # a SavedModel's lookups admit every key (and insert none)
        return None
    unique, position = tf.unique(keys, out_idx=tf.int64)
    _, found = tf_ops.library().sok_find(*param.table_inputs, _as_table_keys(unique, param), col_begin=0, col_end=1)
    held = tf.gather(found, position)
    if ratio <= 0.0:
        return held
    return held | (tf.random.uniform(tf.shape(keys), dtype=tf.float32) < ratio)


def pool_rows(
    param: Any,
    kind: str,
    keys: tf.Tensor,
    samples: tf.Tensor,
    weights: tf.Tensor | None,
    num_samples: tf.Tensor,
    n: int,
    low_frequency_filter: bool = False,
    report_status: bool = False,
) -> tuple[tf.Tensor, Status | None]:
    """Sums ``[num_samples, dim]`` of the rows of ``keys`` (ids this rank holds; ``samples`` sorted),
    and with ``report_status``, for a dynamic table, the ``(code, message)`` of its lookup (else
    None): there a failed lookup does not raise (its rows are zeros), so that the rank still joins
    the exchange."""
    status = None
    if kind == "dynamic" and low_frequency_filter:
        mask = _admitted(param, keys)
        if mask is not None:
            keys, samples = tf.boolean_mask(keys, mask), tf.boolean_mask(samples, mask)
            if weights is not None:
                weights = tf.boolean_mask(weights, mask)
    unique, position = tf.unique(keys, out_idx=tf.int64)
    if kind == "dynamic" and report_status:
        rows, code, message = try_sparse_read(param, _as_table_keys(unique, param), distinct=True)
        status = (code, message)
    elif kind == "dynamic":
        rows = param.sparse_read(_as_table_keys(unique, param))
    else:
        local = tf.cast(unique, tf.int64) // n if kind == "distributed" else tf.cast(unique, tf.int64)
        rows = tf.cast(tf.gather(param, local), tf.float32)  # half-width rows are summed in float32
    if weights is None and not on_gpu(param):
        return tf.sparse.segment_sum(rows, position, samples, num_segments=num_samples), status
    # TensorFlow's GPU kernel of sparse.segment_sum refuses some valid edge batches ("segment ids must
    # be >= 0"); the sum of gathered rows is the same sum.
    gathered = tf.gather(rows, position) if weights is None else tf.gather(rows, position) * weights[:, None]
    return tf.math.unsorted_segment_sum(gathered, samples, num_samples), status


def pool_dynamic(
    params: list[DynamicVariable],
    keys: list[tf.Tensor],
    row_splits: list[tf.Tensor],
    weights: list[tf.Tensor] | None,
    combiners: list[str],
    positions: list[int],
    report_status: bool = False,
    checked: bool = False,
) -> tuple[list[tf.Tensor], list[Status | None]]:
    """Pooled rows ``[batch, dim_t]`` of dynamic tables on one device, from each table's ids
    (``keys[t]``, int64 ``row_splits[t]``, float32 ``weights[t]`` or None): one op indexes the
    distinct keys of every table, each table reads the rows of its distinct keys once (inserting the
    new ones), and one ``pooled_lookup`` pools those rows with ``combiners`` (``positions``: each
    table's index in the caller's ``sp_ids``). With ``report_status`` each table's read does not
    raise but gives the ``(code, message)`` of its lookup (else None), as :func:`pool_rows`;
    ``checked``: the row splits were made by the exchange (``pooled_lookup``'s ``checked``)."""
    keys = [_as_table_keys(k, p) for k, p in zip(keys, params)]
    with tf.name_scope("pool_dynamic"), tf.device(params[0].table_device):
        distinct, numbering = device_ops.unique_index_list(keys)
        rows, statuses = [], []
        for param, d in zip(params, distinct):
            if report_status:
                r, code, message = try_sparse_read(param, d, distinct=True)
                statuses.append((code, message))
            else:
                r = read_distinct(param, d)
                statuses.append(None)
            rows.append(r)
        pooled = pooled_lookup.pooled_lookup(
            rows,
            [tf.RaggedTensor.from_row_splits(i, s, validate=False) for i, s in zip(numbering, row_splits)],
            None
            if weights is None
            else [tf.RaggedTensor.from_row_splits(w, s, validate=False) for w, s in zip(weights, row_splits)],
            combiners,
            positions,
            names=[p.name for p in params],
            numbered=True,
            checked=checked,
        )
    return pooled, statuses


def pool_held(
    plan: ExchangePlan, owned: OwnedIds, low_frequency_filter: bool
) -> tuple[dict[int, tf.Tensor], dict[int, Status], list[tf.Tensor]]:
    """This rank's partial sums ``[global_batch, dim_t]`` of each table ``t`` it holds, from the ids
    it received (``owned``), the status of each dynamic table's lookup, and an empty read (``[0,
    dim]`` rows) of each table it does not hold: sent along, so that every table still has a
    gradient on this rank (an empty ``tf.IndexedSlices``, not None, as Keras optimizers and
    Horovod's gradient tape expect)."""
    held = plan.held(plan.rank)
    params = [table.param for table in plan.tables]
    fused = [t for t in fused_tables(params, [table.kind for table in plan.tables]) if t in held]
    dynamic = [] if low_frequency_filter else [t for t in held if plan.tables[t].kind == "dynamic"]
    groups = dynamic_groups(params, dynamic)
    pooled_here = fused + [t for group in groups for t in group]
    splits = dict(zip(pooled_here, owned.row_splits(pooled_here)))  # one search for all of them
    keys, weights = dict(enumerate(owned.keys)), _by_table(owned.weights)
    partial, statuses = _pool_groups(plan, groups, keys, splits, weights)
    if fused:
        partial.update(pool_fused(plan, fused, keys, splits, weights))
    for t in held:
        if t in partial:
            continue
        table = plan.tables[t]
        partial[t], status = pool_rows(
            table.param,
            table.kind,
            owned.keys[t],
            owned.samples[t],
            None if owned.weights is None else owned.weights[t],
            owned.global_batch,
            plan.n,
            low_frequency_filter,
            report_status=True,
        )
        if status is not None:
            statuses[t] = status
    return partial, statuses, empty_reads(plan, partial)


def pool_fused(
    plan: ExchangePlan,
    tables: list[int],
    ids: dict[int, tf.Tensor],
    row_splits: dict[int, tf.Tensor],
    weights: dict[int, tf.Tensor] | None,
) -> dict[int, tf.Tensor]:
    """This rank's partial sums ``[global_batch, dim_t]`` of the static ``tables`` it holds, all on
    one device, from their ids over the global batch (int64, with int64 ``row_splits``; ids the
    rank does not hold are skipped), by one ``pooled_lookup``: checked, as the call's agreement
    counted the ids outside each table on every rank and the exchange made the splits."""

    def ragged(values: dict[int, tf.Tensor], t: int) -> tf.RaggedTensor:
        return tf.RaggedTensor.from_row_splits(values[t], row_splits[t], validate=False)

    pooled = pooled_lookup.pooled_lookup(
        [plan.tables[t].param for t in tables],
        [ragged(ids, t) for t in tables],
        None if weights is None else [ragged(weights, t) for t in tables],
        ["sum"] * len(tables),
        tables,
        [shard(plan.tables[t], plan.rank, plan.n) for t in tables],
        checked=True,
    )
    return dict(zip(tables, pooled))


def pool_received_dynamic(
    plan: ExchangePlan, tables: list[int], held: HeldIds
) -> tuple[dict[int, tf.Tensor], dict[int, Status]]:
    """This rank's partial sums ``[global_batch, dim_t]`` of the dynamic ``tables`` it holds rows
    of, and their lookups' statuses, from every rank's keys of each (``holder_dist``: all of them,
    also those another rank owns): the keys this rank owns are kept (``key mod n``, or all of a
    localized table's), the row splits counted again over them, and ``pool_dynamic`` pools them
    per device, inserting only this rank's keys."""
    owned = {t: _owned_keys(plan, t, held) for t in tables}
    keys = {t: k for t, (k, _, _) in owned.items()}
    splits = {t: r for t, (_, r, _) in owned.items()}
    weights = None if held.weights is None else {t: w for t, (_, _, w) in owned.items()}
    return _pool_groups(plan, dynamic_groups([table.param for table in plan.tables], tables), keys, splits, weights)


def _pool_groups(
    plan: ExchangePlan,
    groups: list[list[int]],
    keys: dict[int, tf.Tensor],
    splits: dict[int, tf.Tensor],
    weights: dict[int, tf.Tensor] | None,
) -> tuple[dict[int, tf.Tensor], dict[int, Status]]:
    """``pool_dynamic`` of each group of dynamic tables (one device each) over the global batch,
    with the statuses of their lookups: the partial sums and the statuses by table."""
    partial: dict[int, tf.Tensor] = {}
    statuses: dict[int, Status] = {}
    for group in groups:
        pooled, group_statuses = pool_dynamic(
            [plan.tables[t].param for t in group],
            [keys[t] for t in group],
            [splits[t] for t in group],
            None if weights is None else [weights[t] for t in group],
            ["sum"] * len(group),
            group,
            report_status=True,
            checked=True,
        )
        partial.update(zip(group, pooled))
        statuses.update((t, status) for t, status in zip(group, group_statuses) if status is not None)
    return partial, statuses


def _owned_keys(plan: ExchangePlan, t: int, held: HeldIds) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor | None]:
    """The keys of table ``t`` this rank owns among those it received (int64 bits), their row
    splits over the global batch and their weights (or None)."""
    keys, splits = held.ids[t], held.row_splits[t]
    weights = None if held.weights is None else held.weights[t]
    if len(plan.tables[t].holders) == 1:
        return keys, splits, weights
    keep = tf.equal(device_ops.floormod(keys, plan.n), plan.rank)
    with device_ops.on_host():
        samples = device_ops.length(splits) - 1
    kept = tf.math.unsorted_segment_sum(tf.cast(keep, tf.int64), device_ops.sample_ids(splits, keys), samples)
    owned_splits = tf.concat([tf.zeros([1], tf.int64), tf.cumsum(kept)], 0)
    return (
        tf.boolean_mask(keys, keep),
        owned_splits,
        None if weights is None else tf.boolean_mask(weights, keep),
    )


def empty_reads(plan: ExchangePlan, held: Any) -> list[tf.Tensor]:
    """An empty read (``[0, dim]`` rows) of each table of the call not in ``held``: sent along by
    ``output_dist.return_sums``, so that every table has a gradient on this rank."""
    return [_empty_read(table) for t, table in enumerate(plan.tables) if t not in held]


def _by_table(values: list[tf.Tensor] | None) -> dict[int, tf.Tensor] | None:
    return None if values is None else dict(enumerate(values))


def _empty_read(table: TablePlan) -> tf.Tensor:
    """``[0, dim]`` float32 rows read from ``table``: no row, but a gradient path to it."""
    if table.kind == "dynamic":
        return try_sparse_read(table.param, tf.zeros([0], table.param.key_type), distinct=True)[0]
    return tf.cast(tf.gather(table.param, tf.zeros([0], tf.int64)), tf.float32)  # half-width rows too
