"""``sok.lookup_sparse``: a fused, model-parallel ``tf.nn.embedding_lookup_sparse`` over many tables.

One call takes any mix of static distributed, static localized and dynamic tables. With one rank
nothing is exchanged: the static tables are pooled by one op for all of them (``pooled_lookup.py``:
on TensorFlow's intra-op threads, or in one sequence of CUDA kernels when the tables are on a GPU),
the others by TensorFlow ops. With several ranks (each step is a module of this package):

1. ``checks``: every rank checks its ids, and the ranks agree (one allgather of a fingerprint of
   the call, of each rank's batch size, of its count of bad ids and of its ids per owner and table) that they
   make the same call with valid ids before anything else moves, so a bad id, or a rank that passes
   other tables, fails everywhere; the host reads the gathered records once, and knows every size
   of the exchange from them;
2. ``input_dist``: each id goes to the rank that holds it (``plan``: row ``i`` of a distributed
   table on rank ``i % n``, a localized table on its rank, dynamic keys by ``key mod n``), in one
   all-to-all for all tables;
3. ``local_lookup``: each rank reads the rows of the ids it received, once per distinct id, and
   sums them per sample of the global batch (weighted, no division); with
   ``use_low_frequency_filter=True`` the owner of a dynamic table first drops the occurrences of new
   keys it does not admit (§1.12 of SOK);
4. ``output_dist``: one all-to-all returns each rank the sums of its own samples, only the columns
   of the tables the sender holds; the rank adds the partial sums of distributed tables and applies
   the combiner (``sum``, ``mean``, ``sqrtn``; the divisor of ``mean`` is the sample's sum of
   weights, which may be negative: only a sum of 0 gives zeros, as in
   ``tf.nn.embedding_lookup_sparse``). A failed lookup of a dynamic table (a full ``"hbm"`` table,
   say) travels as a status row, so every rank raises an error naming the table and the ranks.

A call may instead send each table's ids whole to every rank that holds rows of it
(``holder_dist``: every size is then a shape, and the checks' counts travel with the ids; a
dynamic table's holder keeps the keys it owns), the default with Horovod's collectives
(``exchange.IDS_SETTING``).

What a rank sends grows with its own batch, not with the number of ranks, except the partial sums
of distributed tables (``[batch, dim]`` to each rank, as a reduce-scatter of them would); localized
tables travel whole from their rank alone. Gradients come from TensorFlow's autodiff through the
same ops (the all-to-alls of floats have gradients): ``tf.IndexedSlices`` per table, local rows for
static tables and raw keys for dynamic ones, summed over the global batch. The collectives are
SOK's own NCCL ops on GPU ranks, Horovod's elsewhere (``exchange``).

Example::

    v1 = sok.Variable(np.arange(17 * 3).reshape(17, 3), dtype=tf.float32)
    v2 = sok.Variable(np.arange(7 * 5).reshape(7, 5), dtype=tf.float32)
    ids1 = tf.ragged.constant([[1, 1], [3, 4, 5]], dtype=tf.int64)
    ids2 = tf.ragged.constant([[1], [2, 3]], dtype=tf.int64)
    emb1, emb2 = sok.lookup_sparse([v1, v2], [ids1, ids2], combiners=["sum", "sum"])
    # emb1 = [[6, 8, 10], [36, 39, 42]], emb2 = [[5, 6, 7, 8, 9], [25, 27, 29, 31, 33]]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from sparse_operation_kit import communication, device_ops, pooled_lookup, validate
from sparse_operation_kit.lookup import arguments
from sparse_operation_kit.lookup import exchange as exchanges
from sparse_operation_kit.lookup.checks import agreed_checks, agreed_shapes
from sparse_operation_kit.lookup.exchange import Exchange
from sparse_operation_kit.lookup.holder_dist import send_ids_to_holders
from sparse_operation_kit.lookup.input_dist import RECORD_TABLES, Routes, record_counts, route, send_ids_to_owners
from sparse_operation_kit.lookup.local_lookup import (
    empty_reads,
    pool_dynamic,
    pool_fused,
    pool_held,
    pool_received_dynamic,
    pool_rows,
)
from sparse_operation_kit.lookup.output_dist import return_sums
from sparse_operation_kit.lookup.plan import ExchangePlan, dynamic_groups, fused_tables, on_gpu

__all__ = ["lookup_sparse", "all2all_dense_embedding"]


def lookup_sparse(
    params: Any,
    sp_ids: Any,
    sp_weights: Any = None,
    combiners: Any = None,
    use_low_frequency_filter: bool = False,
    *,
    hotness: Sequence[int] | None = None,
) -> Any:
    """Pooled lookups of several tables in one collective call.

    Args:
        params: a table or a list of tables: ``sok.Variable`` (distributed or localized) and
            ``sok.DynamicVariable``, in any mix; the same table may appear twice.
        sp_ids: one 2-D ``tf.SparseTensor`` or ``tf.RaggedTensor`` of int32/int64 ids per table,
            ``[local_batch, None]``. Empty rows give zeros.
        sp_weights: None, or one float32 tensor of the same layout per table.
        combiners: None (all ``"mean"``) or one of ``"sum"``, ``"mean"``, ``"sqrtn"`` per table.
            ``"mean"`` divides by the sample's number of ids (weighted: by its sum of weights, which
            may be negative), ``"sqrtn"`` by the square root of the number (of the sum of squared
            weights); a divisor of 0 (an empty sample, weights summing to 0) gives zeros, as in
            ``tf.nn.embedding_lookup_sparse``.
        use_low_frequency_filter: SOK's low-frequency filter, for the ``sok.DynamicVariable``
            tables of the call (any var_type; static tables are not filtered): each occurrence of a
            key the table does not hold yet is looked up with probability ``filter_ratio`` (an
            option of the variable, 1.0 by default: no effect), else dropped: not inserted, adding
            nothing to its sample, no gradient. ``"mean"`` and ``"sqrtn"`` still divide by the
            whole sample (all its ids or weights). Random under ``tf.random.set_seed``'s seed.

    Returns:
        A list of ``[local_batch, dim_i]`` float32 tensors (a single tensor when ``sp_ids`` is not
        a list or tuple), equal to ``tf.nn.embedding_lookup_sparse`` on the full tables.

    Every rank must call it with the same tables and combiners in the same order; batch sizes may
    differ between ranks. ``hotness`` (one int per table, the most ids a sample may have) is the
    ``sparse_operation_kit.experiment`` argument, checked on every rank together.
    """
    single = not isinstance(sp_ids, (list, tuple))
    low_frequency_filter = arguments.flag(use_low_frequency_filter, "use_low_frequency_filter")
    params, ids_list = arguments.as_list(params), arguments.as_list(sp_ids)
    if not params:
        raise ValueError("params is empty; give at least one table")
    if len(params) != len(ids_list):
        raise ValueError(
            f"params has {len(params)} tables but sp_ids has {len(ids_list)}; give one id tensor per table"
        )
    weights_list = None if sp_weights is None else arguments.as_list(sp_weights)
    if weights_list is not None and len(weights_list) != len(ids_list):
        raise ValueError(f"sp_weights has {len(weights_list)} entries but sp_ids has {len(ids_list)}")
    names = ["mean"] * len(params) if combiners is None else arguments.as_list(combiners)
    if len(names) != len(params):
        raise ValueError(f"combiners has {len(names)} entries but params has {len(params)}")
    names = [arguments.combiner(c, i) for i, c in enumerate(names)]
    kinds = [arguments.table_kind(p, i) for i, p in enumerate(params)]
    ragged = [arguments.ragged(ids, i, "sp_ids") for i, ids in enumerate(ids_list)]
    for i, ids in enumerate(ragged):
        arguments.check_id_dtype(ids, i, params[i], kinds[i])
    weights = None
    if weights_list is not None:
        weights = [arguments.ragged(w, i, "sp_weights") for i, w in enumerate(weights_list)]
        for i, w in enumerate(weights):
            if w.dtype != tf.float32:
                raise TypeError(f"sp_weights[{i}] has dtype {w.dtype.name}; weights must be float32")
    batch_sizes = {int(ids.shape[0]) for ids in ragged if ids.shape[0] is not None}
    if len(batch_sizes) > 1:
        raise ValueError(f"all sp_ids of one call must have the same batch size, got {sorted(batch_sizes)}")

    if hotness is not None:
        hotness = arguments.as_list(hotness)
        if len(hotness) != len(ragged):
            raise ValueError(f"hotness has {len(hotness)} entries but sp_ids has {len(ragged)}")
        for i, limit in enumerate(hotness):
            if not validate.is_positive_int(limit, numpy=False):
                raise ValueError(f"hotness[{i}] = {limit!r} must be an integer >= 1")

    comm = communication.tool()
    n = comm.num_ranks()
    arguments.validate_placement(params, kinds, n)
    fused = fused_tables(params, kinds) if n == 1 else []
    exchange: Exchange | None = None
    plan = routes = None
    if n > 1:
        exchange = exchanges.of(comm)
        plan = ExchangePlan.of(params, kinds, comm.rank(), n)
        if len(params) <= RECORD_TABLES and exchanges.ids_to_holders(
            _pooled_by_ops(params, kinds, low_frequency_filter), exchange
        ):
            pooled = _lookup_through_holders(params, kinds, ragged, weights, names, hotness, comm, exchange, plan)
            return pooled[0] if single else pooled
        routes = route(plan, [device_ops.int64_bits(ids.values) for ids in ragged])
    checks, batch_sizes, sends = agreed_checks(
        params,
        kinds,
        ragged,
        weights,
        comm,
        hotness,
        checked_by_op=fused,
        combiners=names,
        exchange=exchange,
        sends=None if routes is None else record_counts(plan, routes),
    )
    outputs: list[Any] = [None] * len(params)
    if fused:
        with tf.control_dependencies(checks):
            pooled = pooled_lookup.pooled_lookup(
                arguments.subset(params, fused),
                arguments.subset(ragged, fused),
                arguments.subset(weights, fused),
                arguments.subset(names, fused),
                fused,
            )
        for i, embedding in zip(fused, pooled):
            outputs[i] = embedding
    rest = [i for i in range(len(params)) if i not in fused]
    if rest:
        pooled = _lookup_with_tf_ops(
            arguments.subset(params, rest),
            arguments.subset(kinds, rest),
            arguments.subset(ragged, rest),
            arguments.subset(weights, rest),
            arguments.subset(names, rest),
            rest,
            checks,
            low_frequency_filter,
            None if exchange is None else _Exchanged(exchange, plan, routes, batch_sizes, sends),
        )
        for i, embedding in zip(rest, pooled):
            outputs[i] = embedding
    return outputs[0] if single else outputs


def _pooled_by_ops(params: list[Any], kinds: list[str], low_frequency_filter: bool) -> bool:
    """Whether ops pool every table of a call at a rank that holds them all: the static tables by
    one ``pooled_lookup``, the dynamic ones by ``pool_dynamic`` per device (``holder_dist``'s
    condition; the low-frequency filter reads a dynamic table before the pooling: routed)."""
    dynamic = [i for i, kind in enumerate(kinds) if kind == "dynamic"]
    if dynamic and low_frequency_filter:
        return False
    static = len(kinds) - len(dynamic)
    return len(fused_tables(params, kinds)) == static and sum(map(len, dynamic_groups(params, dynamic))) == len(dynamic)


def _lookup_through_holders(
    params: list[Any],
    kinds: list[str],
    ragged: list[tf.RaggedTensor],
    weights: list[tf.RaggedTensor] | None,
    names: list[str],
    hotness: list[int] | None,
    comm: communication.CommunicationTool,
    exchange: Exchange,
    plan: ExchangePlan,
) -> list[tf.Tensor]:
    """A call at several ranks whose tables ops pool (``_pooled_by_ops``), with nothing read from a
    GPU before its collectives (``holder_dist``): the ranks agree on the call and its sizes on the
    host, every holder of a table receives its ids whole, and the counts of problems that traveled
    with them are checked before the lookups are returned; before the pooling where it could write
    or raise on one rank alone (a dynamic table inserts the keys it looks up; the host's pooled op
    raises on bad ids itself)."""
    agreement = agreed_shapes(
        params, kinds, ragged, weights, comm, hotness, combiners=names, record_tables=RECORD_TABLES
    )
    with tf.control_dependencies(agreement.checks):
        held = send_ids_to_holders(plan, ragged, weights, agreement, exchange)
    # The check is a tf.cond with side effects on its failing branch, and TensorFlow runs such ops
    # of a function in the order they were made: made after the last collective of the call, it
    # holds back none of them.
    first = "dynamic" in kinds or not all(on_gpu(p) for p in params)
    confirmed = agreement.confirm(held.totals) if first else None
    mine = plan.held(plan.rank)
    with tf.control_dependencies([confirmed] if first else []):
        static = [t for t in mine if kinds[t] != "dynamic"]
        partial = pool_fused(plan, static, held.ids, held.row_splits, held.weights) if static else {}
        pooled, statuses = pool_received_dynamic(plan, [t for t in mine if kinds[t] == "dynamic"], held)
        partial.update(pooled)
    lengths = [tf.cast(ids.row_lengths(), tf.int64) for ids in ragged]
    local_batch = device_ops.length(lengths[0])
    sums = return_sums(
        plan, partial, statuses, empty_reads(plan, partial), agreement.batch_sizes, local_batch, exchange
    )
    if confirmed is None:
        confirmed = agreement.confirm(held.totals)
    with tf.control_dependencies([confirmed]):
        sums = [tf.identity(x) for x in sums]
    return [
        _combine(pooled, name, lengths[i], None if weights is None else weights[i])
        for i, (pooled, name) in enumerate(zip(sums, names))
    ]


@dataclass(frozen=True)
class _Exchanged:
    """What the exchange of a call at several ranks knows before it starts: its collectives, plan
    and routes, and from the checks' allgather every rank's batch size and ids per owner and table (host)."""

    exchange: Exchange
    plan: ExchangePlan
    routes: Routes
    batch_sizes: tf.Tensor
    sends: tf.Tensor


def _lookup_with_tf_ops(
    params: list[Any],
    kinds: list[str],
    ragged: list[tf.RaggedTensor],
    weights: list[tf.RaggedTensor] | None,
    names: list[str],
    positions: list[int],
    checks: list[tf.Operation],
    low_frequency_filter: bool,
    exchanged: _Exchanged | None,
) -> list[tf.Tensor]:
    """Pooled lookups of the tables not pooled by one op for the call (``positions``: their indices
    in ``sp_ids``), after ``checks``: with one rank (``exchanged`` None) dynamic tables by
    ``pool_dynamic`` per device and the rest by TensorFlow ops; with several, steps 2-4 of the
    module docstring."""
    with tf.control_dependencies(checks):
        # Everything below, collectives included, waits for the checks.
        keys = [tf.identity(ids.values) for ids in ragged]
        lengths = [tf.cast(tf.identity(ids.row_lengths()), tf.int64) for ids in ragged]
        if weights is not None:
            # validate=False: the row lengths of a valid RaggedTensor (validating would read them
            # back from the device)
            weights = [
                tf.RaggedTensor.from_row_lengths(tf.identity(w.values), w.row_lengths(), validate=False)
                for w in weights
            ]
    if exchanged is None:
        return _pool_at_one_rank(params, kinds, ragged, keys, lengths, weights, names, positions, low_frequency_filter)
    local_batch = device_ops.length(lengths[0])
    values = None if weights is None else [w.values for w in weights]
    plan = exchanged.plan
    owned = send_ids_to_owners(
        plan,
        [device_ops.int64_bits(k) for k in keys],
        device_ops.sample_ids_of([ids.row_splits for ids in ragged], keys),
        values,
        exchanged.routes,
        exchanged.batch_sizes,
        exchanged.sends,
        exchanged.exchange,
    )
    held, statuses, empty = pool_held(plan, owned, low_frequency_filter)
    partial = return_sums(plan, held, statuses, empty, owned.batch_sizes, local_batch, exchanged.exchange)
    return [
        _combine(pooled, name, lengths[i], None if weights is None else weights[i])
        for i, (pooled, name) in enumerate(zip(partial, names))
    ]


def _pool_at_one_rank(
    params: list[Any],
    kinds: list[str],
    ragged: list[tf.RaggedTensor],
    keys: list[tf.Tensor],
    lengths: list[tf.Tensor],
    weights: list[tf.RaggedTensor] | None,
    names: list[str],
    positions: list[int],
    low_frequency_filter: bool,
) -> list[tf.Tensor]:
    """With one rank, the combined rows of each table: the dynamic ones by ``pool_dynamic``, one
    call per device (no filter), the others by TensorFlow ops (``pool_rows``, then ``_combine``)."""
    values = None if weights is None else [w.values for w in weights]
    out: dict[int, tf.Tensor] = {}
    dynamic = [] if low_frequency_filter else [i for i, k in enumerate(kinds) if k == "dynamic"]
    for group in dynamic_groups(params, dynamic):
        pooled, _ = pool_dynamic(
            arguments.subset(params, group),
            arguments.subset(keys, group),
            [tf.cast(ragged[i].row_splits, tf.int64) for i in group],
            None if values is None else arguments.subset(values, group),
            arguments.subset(names, group),
            arguments.subset(positions, group),
        )
        out.update(zip(group, pooled))
    local_batch = device_ops.length(lengths[0])
    for i, (param, kind) in enumerate(zip(params, kinds)):
        if i in out:
            continue
        samples = device_ops.sample_ids(ragged[i].row_splits, ragged[i].values)
        sums = pool_rows(
            param, kind, keys[i], samples, None if values is None else values[i], local_batch, 1, low_frequency_filter
        )[0]
        out[i] = _combine(sums, names[i], lengths[i], None if weights is None else weights[i])
    return [out[i] for i in range(len(params))]


def _combine(pooled: tf.Tensor, name: str, lengths: tf.Tensor, weights: tf.RaggedTensor | None) -> tf.Tensor:
    """The combiner ``name`` applied to a table's sums ``[local_batch, dim]``, from the local batch's
    lengths and weights (before any exchange and filter): ``tf.nn.embedding_lookup_sparse``'s
    division, zeros only where the divisor is 0 (a sum of weights may be negative)."""
    if name == "sum":
        return pooled
    if weights is None:
        total = tf.cast(lengths, tf.float32) if name == "mean" else tf.sqrt(tf.cast(lengths, tf.float32))
    else:
        total = tf.reduce_sum(weights, axis=1) if name == "mean" else tf.sqrt(tf.reduce_sum(tf.square(weights), axis=1))
    return tf.math.divide_no_nan(pooled, total[:, None])


def all2all_dense_embedding(param: Any, indices: Any) -> tf.Tensor:
    """Rows of a distributed table (or DynamicVariable) for 1-D ids, each rank its own ids:
    a model-parallel ``tf.nn.embedding_lookup``. Returns ``[len(indices), dim]``."""
    ids = tf.convert_to_tensor(indices)
    if ids.shape.rank != 1:
        raise ValueError(f"indices must be 1-D, got shape {ids.shape}")
    ragged = tf.RaggedTensor.from_tensor(tf.reshape(ids, [-1, 1]))
    return lookup_sparse([param], [ragged], combiners=["sum"])[0]
