"""``sok.lookup_sparse``: a fused, model-parallel ``tf.nn.embedding_lookup_sparse`` over many tables.

The exchange (one call, any mix of static distributed, static localized and dynamic tables):

1. every rank checks its arguments, and the ranks agree (one allgather of a fingerprint of the
   call and of each rank's count of bad ids) that they make the same call with valid ids before
   anything else moves, so a bad id, or a rank that passes other tables, fails on every rank;
2. the ids, row lengths and weights of all tables are allgathered (three collectives for the whole
   call): each rank sees the global batch's ids, a few bytes per id;
3. each rank looks up the ids it owns (row ``i`` of a distributed table on rank ``i % n``, the whole
   of a localized table on its rank, dynamic keys by ``key mod n``) and pools them per global sample
   into partial sums (weighted, no division yet); with ``use_low_frequency_filter=True`` the owner
   of a dynamic table first drops the occurrences of new keys it does not admit (§1.12 of SOK:
   each occurrence of a key missing from the table is kept with probability ``filter_ratio``);
4. one all-to-all sends each rank the partial sums of its own samples, for all tables at once;
   the rank adds them up and applies the combiner (``sum``, ``mean``, ``sqrtn``; the divisor of
   ``mean`` is the sample's sum of weights, which may be negative: only a sum of 0 gives zeros, as
   in ``tf.nn.embedding_lookup_sparse``). When dynamic
   tables take part, each rank also sends every other rank one row holding the status of its
   lookups of step 3 (a full ``"hbm"`` table, say): a rank whose lookup fails still joins the
   exchange, and every rank then raises an error that names the table and the failing ranks.

Pooled partial sums travel instead of rows, so the floats exchanged per step do not grow with the
number of ids per sample. Gradients come from TensorFlow's autodiff through the same ops (Horovod's
collectives have gradients): ``tf.IndexedSlices`` per table, local rows for static tables and raw
keys for dynamic ones, summed over the global batch.

The static tables of a call are pooled by one op for all of them (``pooled_lookup.py``: gather,
weights and combiner on TensorFlow's intra-op threads, or in one sequence of CUDA kernels when the
tables are on a GPU and sok-core's GPU kernels are loaded; ``_fused_tables`` picks the tables, all
on one device): with a single rank nothing is exchanged and the op pools the local batch (the same
sums as TensorFlow's ops to the bit); with several it does step 3 for them, partial sums of the
global batch from each table's shard. The other tables (dynamic ones, static ones on another device)
take the TensorFlow ops of step 3.

Example::

    v1 = sok.Variable(np.arange(17 * 3).reshape(17, 3), dtype=tf.float32)
    v2 = sok.Variable(np.arange(7 * 5).reshape(7, 5), dtype=tf.float32)
    ids1 = tf.ragged.constant([[1, 1], [3, 4, 5]], dtype=tf.int64)
    ids2 = tf.ragged.constant([[1], [2, 3]], dtype=tf.int64)
    emb1, emb2 = sok.lookup_sparse([v1, v2], [ids1, ids2], combiners=["sum", "sum"])
    # emb1 = [[6, 8, 10], [36, 39, 42]], emb2 = [[5, 6, 7, 8, 9], [25, 27, 29, 31, 33]]
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from sparse_operation_kit import communication, pooled_lookup, tf_ops
from sparse_operation_kit.distributed_variable import DistributedVariable, LocalizedVariable
from sparse_operation_kit.dynamic_variable import DynamicVariable, try_sparse_read

__all__ = ["lookup_sparse", "all2all_dense_embedding", "COMBINERS"]

#: Combiner names (case-insensitive; "average" is SOK's alias of "mean").
COMBINERS = ("sum", "mean", "sqrtn")
_ALIASES = {"average": "mean"}


def _combiner(name: Any, index: int) -> str:
    if not isinstance(name, str) or _ALIASES.get(name.lower(), name.lower()) not in COMBINERS:
        raise ValueError(f"combiners[{index}] = {name!r} is not valid; valid: {', '.join(COMBINERS)} (any case)")
    return _ALIASES.get(name.lower(), name.lower())


def _ragged(ids: Any, index: int, what: str) -> tf.RaggedTensor:
    if isinstance(ids, tf.SparseTensor):
        if ids.shape.rank not in (None, 2):
            raise ValueError(f"{what}[{index}] must be a 2-D SparseTensor, got rank {ids.shape.rank}")
        return tf.RaggedTensor.from_sparse(_checked_rows(ids, f"{what}[{index}]"))
    if isinstance(ids, tf.RaggedTensor):
        if ids.ragged_rank != 1 or ids.shape.rank != 2:
            raise ValueError(f"{what}[{index}] must be a 2-D RaggedTensor (ragged_rank 1), got shape {ids.shape}")
        return ids
    raise TypeError(f"{what}[{index}] must be a tf.SparseTensor or tf.RaggedTensor, got {type(ids).__name__}")


def _checked_rows(sparse: tf.SparseTensor, what: str) -> tf.SparseTensor:
    """``sparse`` after checking that its row indices (the samples) are in [0, dense_shape[0]):
    eagerly a ValueError; inside tf.function an assert that gates the values."""
    rows, nrows = sparse.indices[:, 0], sparse.dense_shape[0]
    fix = f"the row index of each id is its sample: 0 .. dense_shape[0] - 1; fix how {what} is built"
    if isinstance(rows, tf.Tensor) and hasattr(rows, "numpy") and tf.executing_eagerly():
        values, limit = rows.numpy(), int(nrows)
        bad = ((values < 0) | (values >= limit)).nonzero()[0]
        if bad.size:
            raise ValueError(
                f"{what} has row index {int(values[bad[0]])!r} at indices[{int(bad[0])}] ({bad.size} such), outside "
                f"[0, {limit}) (dense_shape[0] = {limit}); {fix}"
            )
        return sparse
    inside = tf.reduce_all((rows >= 0) & (rows < nrows))
    check = tf.debugging.Assert(
        inside,
        [
            f"{what} has row indices outside [0, dense_shape[0]); {fix}. dense_shape[0] and the smallest and largest "
            f"row index follow:",
            nrows,
            tf.reduce_min(rows),
            tf.reduce_max(rows),
        ],
    )
    with tf.control_dependencies([check]):
        return tf.SparseTensor(tf.identity(sparse.indices), sparse.values, sparse.dense_shape)


#: The id dtypes sok.lookup_sparse takes (and, for a dynamic table of uint64 keys, uint64).
ID_DTYPES = ("int32", "int64")


def _check_id_dtype(ids: tf.RaggedTensor, index: int, param: Any, kind: str) -> None:
    valid = ID_DTYPES + (("uint64",) if kind == "dynamic" and param.key_type == tf.uint64 else ())
    dtype = ids.dtype
    if dtype.name in valid:
        return
    if dtype.is_integer:
        fix = "cast them: tf.cast(ids, tf.int64)"
    elif dtype == tf.string:
        fix = (
            "ids are row numbers (or keys of a dynamic table), not strings: map the strings to int64 first "
            "(tf.keras.layers.StringLookup, or tf.strings.to_hash_bucket_fast for a sok.DynamicVariable)"
        )
    else:
        fix = (
            "ids are row numbers (or keys of a dynamic table), not floats or bools: make them int64 where they "
            "are built (tf.cast(ids, tf.int64) when they hold whole numbers)"
        )
    raise TypeError(
        f"sp_ids[{index}] (for params[{index}], {param.name}) has dtype {dtype.name}; ids must be "
        f"{' or '.join(valid)}; {fix}"
    )


def _table_kind(param: Any, index: int) -> str:
    if isinstance(param, DynamicVariable):
        return "dynamic"
    if isinstance(param, (DistributedVariable, LocalizedVariable)):
        if param.dtype != tf.float32:
            raise TypeError(
                f"params[{index}] ({param.name}) has dtype {param.dtype.name}; sok tables must be "
                f"float32: create it with dtype=tf.float32"
            )
        return "localized" if isinstance(param, LocalizedVariable) else "distributed"
    raise TypeError(
        f"params[{index}] must be a sok.Variable or sok.DynamicVariable, got {type(param).__name__}; "
        f"for a plain tf.Variable use tf.nn.embedding_lookup_sparse"
    )


def _as_list(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _owner(keys: tf.Tensor, kind: str, param: Any, n: int) -> tf.Tensor:
    if kind == "localized" or (kind == "dynamic" and param.target_gpu >= 0):
        return tf.fill(tf.shape(keys, out_type=tf.int64), tf.constant(param.target_gpu, tf.int64))
    bits = tf.bitcast(keys, tf.int64) if keys.dtype == tf.uint64 else tf.cast(keys, tf.int64)
    return tf.math.floormod(bits, n)  # negative (and uint64 >= 2**63) keys too, as sok.load places them


def _as_table_keys(keys: tf.Tensor, param: DynamicVariable) -> tf.Tensor:
    """Ids as the table's key dtype (int32/int64 ids for int64 tables, int64 bits for uint64 ones;
    int64 ids for int32 tables were range-checked by _agreed_checks)."""
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
    if ratio >= 1.0:
        return None
    unique, position = tf.unique(keys, out_idx=tf.int64)
    _, found = tf_ops.library().sok_find(*param.table_inputs, _as_table_keys(unique, param), col_begin=0, col_end=1)
    held = tf.gather(found, position)
    if ratio <= 0.0:
        return held
    return held | (tf.random.uniform(tf.shape(keys), dtype=tf.float32) < ratio)


def _pool_local(
    param: Any,
    kind: str,
    keys: tf.Tensor,
    samples: tf.Tensor,
    weights: tf.Tensor | None,
    num_samples: tf.Tensor,
    rank: int,
    n: int,
    low_frequency_filter: bool = False,
) -> tuple[tf.Tensor, tuple[tf.Tensor, tf.Tensor] | None]:
    """Partial sums [num_samples, dim] of the ids this rank owns (``samples`` is sorted), and with
    several ranks, for a dynamic table, the ``(code, message)`` of its lookup (else None): there a
    failed lookup does not raise (its rows are zeros), so that the rank still joins the exchange.

    Each distinct id is read once (a dynamic table inserts it once; the gradient has one row per
    distinct id), then a sorted segment sum pools the rows per sample. With
    ``low_frequency_filter``, the occurrences of a dynamic table's keys that ``_admitted`` drops
    are left out before the read: not inserted, not summed, no gradient.
    """
    status = None
    keep = []
    if n > 1:
        keep.append(lambda k: tf.equal(_owner(k, kind, param, n), rank))
    if kind == "dynamic" and low_frequency_filter:
        keep.append(lambda k: _admitted(param, k))
    for mask_of in keep:  # the filter sees only the keys this rank owns
        mask = mask_of(keys)
        if mask is None:
            continue
        keys, samples = tf.boolean_mask(keys, mask), tf.boolean_mask(samples, mask)
        if weights is not None:
            weights = tf.boolean_mask(weights, mask)
    unique, position = tf.unique(keys, out_idx=tf.int64)
    if kind == "dynamic" and n > 1:
        rows, code, message = try_sparse_read(param, _as_table_keys(unique, param), distinct=True)
        status = (code, message)
    elif kind == "dynamic":
        rows = param.sparse_read(_as_table_keys(unique, param))
    else:
        local = tf.cast(unique, tf.int64) // n if kind == "distributed" else tf.cast(unique, tf.int64)
        rows = tf.gather(param, local)
    if weights is None and not _on_gpu(param):
        return tf.sparse.segment_sum(rows, position, samples, num_segments=num_samples), status
    # TensorFlow's GPU kernel of sparse.segment_sum refuses some valid edge batches ("segment ids must
    # be >= 0"); the sum of gathered rows is the same sum.
    gathered = tf.gather(rows, position) if weights is None else tf.gather(rows, position) * weights[:, None]
    return tf.math.unsorted_segment_sum(gathered, samples, num_samples), status


def _call_description(
    params: Sequence[Any],
    kinds: Sequence[str],
    combiners: Sequence[str],
    weighted: bool,
    hotness: Sequence[int] | None,
) -> str:
    """What every rank's call must agree on: the tables (names, kinds, shapes), the combiners, and
    whether sp_weights and hotness are given; they decide which collectives the call makes."""
    tables = []
    for i, (param, kind) in enumerate(zip(params, kinds)):
        if kind == "dynamic":
            shape = f"dim {param.dimension}, key_type {param.key_type.name}, mode {param.mode}"
        else:
            shape = f"shape {list(param.global_shape.as_list())}" + (
                f", localized:{param.target_gpu}" if kind == "localized" else ""
            )
        tables.append(f"params[{i}] = {param.name} ({kind}, {shape}, combiner {combiners[i]})")
    return (
        f"{len(tables)} table(s): {'; '.join(tables)}; sp_weights {'given' if weighted else 'None'}; "
        f"hotness {None if hotness is None else list(hotness)}"
    )


def _agreed_checks(
    params: Sequence[Any],
    kinds: Sequence[str],
    ragged: Sequence[tf.RaggedTensor],
    weights: Sequence[tf.RaggedTensor] | None,
    comm: communication.CommunicationTool,
    hotness: Sequence[int] | None,
    *,
    checked_by_op: Sequence[int],
    combiners: Sequence[str],
) -> list[tf.Operation | tf.Tensor]:
    """Checks that fail on every rank together, in one collective: each rank sends
    ``[fingerprint of its call, number of counts, its count of each problem]`` (one allgather, which
    tolerates records of different lengths); every rank first asserts that all records carry its
    own fingerprint (the same tables, combiners and options in the same order, so that the ranks
    make the same collectives), then asserts on the counts summed over the ranks (so no rank enters
    the exchange alone). The id ranges of the tables in ``checked_by_op`` are left to
    ``pooled_lookup``'s op (one rank)."""
    problems: list[tuple[tf.Tensor, str]] = []
    for i, (param, kind, ids) in enumerate(zip(params, kinds, ragged)):
        values = tf.cast(ids.values, tf.int64)
        if kind != "dynamic" and i not in checked_by_op:
            rows = int(param.global_shape[0])
            problems.append(
                (
                    tf.reduce_sum(tf.cast((values < 0) | (values >= rows), tf.int64)),
                    f"sp_ids[{i}] has ids outside [0, {rows}) for table {param.name} (count over all ranks "
                    f"follows); static tables take ids 0 .. rows-1",
                )
            )
        elif kind == "dynamic" and param.key_type == tf.int32:
            # Counted (0 for int32 ids) whatever the ids' dtype, so the records of all ranks have one length.
            outside = (values < -(2**31)) | (values >= 2**31)
            problems.append(
                (
                    tf.reduce_sum(tf.cast(outside, tf.int64)),
                    f"sp_ids[{i}] has int64 ids that do not fit the int32 keys of {param.name} (count over all "
                    f"ranks follows)",
                )
            )
        if weights is not None:
            mismatch = tf.reduce_sum(
                tf.abs(tf.cast(ids.row_lengths(), tf.int64) - tf.cast(weights[i].row_lengths(), tf.int64))
            )
            problems.append(
                (
                    mismatch,
                    f"sp_weights[{i}] does not have the row lengths of sp_ids[{i}] (differences over all ranks follow)",
                )
            )
        if hotness is not None:
            longest = tf.cast(ids.row_lengths(), tf.int64)
            problems.append(
                (
                    tf.reduce_sum(tf.cast(longest > hotness[i], tf.int64)),
                    f"sp_ids[{i}] has a sample with more ids than hotness[{i}] = {hotness[i]} (count over all "
                    f"ranks follows)",
                )
            )
    n = comm.num_ranks()
    if n == 1:
        if not problems:
            return []
        counts = tf.stack([count for count, _ in problems])
    else:
        description = _call_description(params, kinds, combiners, weights is not None, hotness)
        fingerprint = communication.fingerprint(description.encode())
        record = tf.concat(
            [tf.constant([fingerprint, len(problems)], tf.int64)] + [tf.reshape(c, [1]) for c, _ in problems], 0
        )
        gathered = comm.allgather(record, name="sok.lookup_sparse: allgather of the call's fingerprint and checks")
        agreement = _assert_same_call(gathered, fingerprint, len(problems), n, comm.rank(), description)
        if not problems:
            return [agreement]
        # Every record has this rank's layout once the ranks agree: [fingerprint, count, counts...] per
        # rank. A data dependency on the agreement (a control dependency on a tf.cond's output does
        # not wait for the ops inside its branches once TensorFlow lowers it).
        gathered = gathered * tf.cast(agreement, tf.int64)
        counts = tf.reduce_sum(_as_records(gathered, n, 2 + len(problems))[:, 2:], axis=0)
    return ([agreement] if n > 1 else []) + [
        tf.debugging.assert_equal(counts[j], tf.constant(0, tf.int64), message=message)
        for j, (_, message) in enumerate(problems)
    ]


def _assert_same_call(
    gathered: tf.Tensor, fingerprint: int, length: int, n: int, rank: int, description: str
) -> tf.Tensor:
    """Asserts that the ``n`` records of ``gathered`` (``[fingerprint, length, length counts]`` each,
    rank after rank) all carry this rank's fingerprint; the message names the ranks that differ."""
    width = 2 + length
    same_size = tf.equal(tf.size(gathered, out_type=tf.int64), n * width)
    table = _as_records(gathered, n, width)
    agree = same_size & tf.reduce_all(tf.equal(table[:, 0], fingerprint)) & tf.reduce_all(tf.equal(table[:, 1], length))

    def fail() -> tf.Tensor:
        # Walk the records (their lengths may differ): rank r's starts after those of ranks < r.
        start = tf.constant(0, tf.int64)
        differs = []
        for _ in range(n):
            differs.append(tf.not_equal(gathered[start], fingerprint))
            start = start + 2 + gathered[start + 1]
        ranks = tf.strings.reduce_join(tf.strings.as_string(tf.where(tf.stack(differs))[:, 0]), separator=", ")
        message = tf.strings.join(
            [
                f"sok.lookup_sparse: the ranks called it with different arguments. Rank {rank} called it with "
                f"{description}. Every rank must pass the same tables (names, kinds, shapes), combiners, and "
                f"sp_weights / hotness (given or not) in the same order; only the ids, weights and batch size may "
                f"differ. The ranks whose call differs from rank {rank}'s (each rank's error shows its own call): [",
                ranks,
                "]",
            ]
        )
        check = _raise_unless(agree, message)
        with tf.control_dependencies([check]):
            return tf.identity(agree)

    return tf.cond(agree, lambda: tf.identity(agree), fail)


def _as_records(gathered: tf.Tensor, n: int, width: int) -> tf.Tensor:
    """``gathered`` as ``[n, width]`` records, cut or padded with zeros to ``n * width`` values first:
    a shape that never fails, whatever the ranks sent (TensorFlow may run a tf.cond branch ahead)."""
    values = tf.concat([gathered, tf.zeros([n * width], gathered.dtype)], 0)[: n * width]
    return tf.reshape(values, [n, width])


def _validate_placement(params: Sequence[Any], kinds: Sequence[str], n: int) -> None:
    for i, (param, kind) in enumerate(zip(params, kinds)):
        if kind in ("dynamic", "localized") and param.target_gpu >= n:
            raise ValueError(
                f"params[{i}] ({param.name}) is localized on rank {param.target_gpu}, but there are only "
                f"{n} rank(s); valid: localized:0 .. localized:{n - 1}"
            )


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
    low_frequency_filter = _flag(use_low_frequency_filter, "use_low_frequency_filter")
    params, ids_list = _as_list(params), _as_list(sp_ids)
    if not params:
        raise ValueError("params is empty; give at least one table")
    if len(params) != len(ids_list):
        raise ValueError(
            f"params has {len(params)} tables but sp_ids has {len(ids_list)}; give one id tensor per table"
        )
    weights_list = None if sp_weights is None else _as_list(sp_weights)
    if weights_list is not None and len(weights_list) != len(ids_list):
        raise ValueError(f"sp_weights has {len(weights_list)} entries but sp_ids has {len(ids_list)}")
    names = ["mean"] * len(params) if combiners is None else _as_list(combiners)
    if len(names) != len(params):
        raise ValueError(f"combiners has {len(names)} entries but params has {len(params)}")
    names = [_combiner(c, i) for i, c in enumerate(names)]
    kinds = [_table_kind(p, i) for i, p in enumerate(params)]
    ragged = [_ragged(ids, i, "sp_ids") for i, ids in enumerate(ids_list)]
    for i, ids in enumerate(ragged):
        _check_id_dtype(ids, i, params[i], kinds[i])
    weights = None
    if weights_list is not None:
        weights = [_ragged(w, i, "sp_weights") for i, w in enumerate(weights_list)]
        for i, w in enumerate(weights):
            if w.dtype != tf.float32:
                raise TypeError(f"sp_weights[{i}] has dtype {w.dtype.name}; weights must be float32")
    batch_sizes = {int(ids.shape[0]) for ids in ragged if ids.shape[0] is not None}
    if len(batch_sizes) > 1:
        raise ValueError(f"all sp_ids of one call must have the same batch size, got {sorted(batch_sizes)}")

    if hotness is not None:
        hotness = _as_list(hotness)
        if len(hotness) != len(ragged):
            raise ValueError(f"hotness has {len(hotness)} entries but sp_ids has {len(ragged)}")
        for i, limit in enumerate(hotness):
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise ValueError(f"hotness[{i}] = {limit!r} must be an integer >= 1")

    comm = communication.tool()
    n = comm.num_ranks()
    _validate_placement(params, kinds, n)
    fused = _fused_tables(params, kinds) if n == 1 else []
    checks = _agreed_checks(params, kinds, ragged, weights, comm, hotness, checked_by_op=fused, combiners=names)
    outputs: list[Any] = [None] * len(params)
    if fused:
        with tf.control_dependencies(checks):
            pooled = pooled_lookup.pooled_lookup(
                _subset(params, fused), _subset(ragged, fused), _subset(weights, fused), _subset(names, fused), fused
            )
        for i, embedding in zip(fused, pooled):
            outputs[i] = embedding
    rest = [i for i in range(len(params)) if i not in fused]
    if rest:
        pooled = _lookup_with_tf_ops(
            _subset(params, rest),
            _subset(kinds, rest),
            _subset(ragged, rest),
            _subset(weights, rest),
            _subset(names, rest),
            comm,
            checks,
            low_frequency_filter,
        )
        for i, embedding in zip(rest, pooled):
            outputs[i] = embedding
    return outputs[0] if single else outputs


def _flag(value: Any, name: str) -> bool:
    """``value`` as a bool: True, False (NumPy's too) or the ints 1 and 0."""
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, (int, np.integer)) and value in (0, 1)):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {value!r}")


def _subset(values: Sequence[Any] | None, indices: Sequence[int]) -> list[Any] | None:
    """The entries of ``values`` at ``indices`` (None stays None)."""
    return None if values is None else [values[i] for i in indices]


def _fused_tables(params: Sequence[Any], kinds: Sequence[str]) -> list[int]:
    """The tables ``pooled_lookup`` takes, all on one device: the static ones on the host when there
    are any; else, when ``SokPooledLookup`` has GPU kernels, the static ones on the GPU of the first."""
    static = [i for i, k in enumerate(kinds) if k != "dynamic"]
    host = [i for i in static if not _on_gpu(params[i])]
    if host or not static or not _pooled_lookup_has_gpu_kernels():
        return host
    gpu = _gpu_index(params[static[0]])
    return [i for i in static if _gpu_index(params[i]) == gpu]


def _on_gpu(param: Any) -> bool:
    """Whether a table (its variable's handle, and so its pooling) lives on a GPU."""
    return tf.DeviceSpec.from_string(param.device).device_type == "GPU"


def _gpu_index(param: Any) -> int | None:
    """The index of the GPU of ``param`` (of this process), however its device is spelled."""
    return tf.DeviceSpec.from_string(param.device).device_index


@functools.cache
def _pooled_lookup_has_gpu_kernels() -> bool:
    """Whether ``SokPooledLookup`` and its gradient have DEVICE_GPU kernels (sok-core's GPU kernels
    are loaded: a CUDA TensorFlow and a sok-core built with a CUDA toolkit)."""
    from tensorflow.python.framework import kernels  # TensorFlow's registry of op kernels

    tf_ops.library()  # loads the GPU kernels too, under a CUDA TensorFlow
    return all(
        any(kernel.device_type == "GPU" for kernel in kernels.get_registered_kernels_for_op(op).kernel)
        for op in ("SokPooledLookup", "SokPooledLookupGrad")
    )


def _shard(param: Any, kind: str, rank: int, n: int) -> tuple[int, int]:
    """``(stride, offset)`` of ``pooled_lookup``: which ids of a static table this rank holds."""
    if kind == "distributed":
        return n, rank
    return 1, 0 if param.target_gpu == rank else -1


def _lookup_with_tf_ops(
    params: list[Any],
    kinds: list[str],
    ragged: list[tf.RaggedTensor],
    weights: list[tf.RaggedTensor] | None,
    names: list[str],
    comm: communication.CommunicationTool,
    checks: list[tf.Operation],
    low_frequency_filter: bool = False,
) -> list[tf.Tensor]:
    """Pooled lookups through TensorFlow ops (and the exchange when there are several ranks), after
    ``checks``: steps 2-4 of the module docstring."""
    n, rank = comm.num_ranks(), comm.rank()
    with tf.control_dependencies(checks):
        # Everything below, collectives included, waits for the checks.
        keys = [tf.identity(ids.values) for ids in ragged]
        lengths = [tf.cast(tf.identity(ids.row_lengths()), tf.int64) for ids in ragged]
        if weights is not None:
            weights = [tf.RaggedTensor.from_row_lengths(tf.identity(w.values), w.row_lengths()) for w in weights]
    local_batch = tf.shape(lengths[0], out_type=tf.int64)[0]

    # Pooling denominators, from the local batch (before any exchange and any filter).
    denominators = []
    for i, name in enumerate(names):
        w = None if weights is None else weights[i]
        if name == "sum":
            denominators.append(None)
            continue
        if w is None:
            total = tf.cast(lengths[i], tf.float32) if name == "mean" else tf.sqrt(tf.cast(lengths[i], tf.float32))
        else:
            total = tf.reduce_sum(w, axis=1) if name == "mean" else tf.sqrt(tf.reduce_sum(tf.square(w), axis=1))
        denominators.append(total)

    dims = [int(p.shape[-1]) for p in params]
    if n == 1:
        samples = [ids.value_rowids() for ids in ragged]
        partial = [
            _pool_local(
                p,
                k,
                keys[i],
                samples[i],
                None if weights is None else weights[i].values,
                local_batch,
                0,
                1,
                low_frequency_filter,
            )[0]
            for i, (p, k) in enumerate(zip(params, kinds))
        ]
    else:
        partial = _exchange_and_pool(
            params, kinds, keys, lengths, weights, local_batch, comm, n, rank, dims, low_frequency_filter
        )

    outputs = []
    for i, pooled in enumerate(partial):
        if denominators[i] is not None:
            # tf.nn.embedding_lookup_sparse's division: zeros only where the divisor is 0 (a sum of
            # weights may be negative).
            pooled = tf.math.divide_no_nan(pooled, denominators[i][:, None])
        outputs.append(pooled)
    return outputs


def _exchange_and_pool(params, kinds, keys, lengths, weights, local_batch, comm, n, rank, dims, low_frequency_filter):
    """Steps 2-4 of the module docstring for several ranks: partial sums of the local samples."""
    num_tables = len(params)
    all_keys = tf.concat([tf.bitcast(k, tf.int64) if k.dtype == tf.uint64 else tf.cast(k, tf.int64) for k in keys], 0)
    all_lengths = tf.concat(lengths, 0)  # [tables * local_batch]
    g_keys = comm.allgather(all_keys, name="sok.lookup_sparse: allgather of the ids")
    g_lengths = comm.allgather(all_lengths, name="sok.lookup_sparse: allgather of the row lengths")
    g_batch = comm.allgather(tf.reshape(local_batch, [1]), name="sok.lookup_sparse: allgather of the batch sizes")
    g_weights = None
    if weights is not None:
        g_weights = comm.allgather(
            tf.concat([w.values for w in weights], 0),
            name="sok.lookup_sparse: allgather of the weights",
        )
    global_batch = tf.reduce_sum(g_batch)
    # Split the gathered lengths by rank ([tables * B_r] each), then by table.
    lengths_by_rank = [tf.reshape(part, [num_tables, -1]) for part in tf.split(g_lengths, g_batch * num_tables, num=n)]
    key_counts = tf.stack([tf.reduce_sum(part, axis=1) for part in lengths_by_rank])  # [n, tables]
    # Row splits of each table over the global batch (samples in rank order): [tables, global_batch + 1].
    splits = tf.pad(tf.cumsum(tf.concat(lengths_by_rank, axis=1), axis=1), [[0, 0], [1, 0]])
    key_chunks = tf.split(g_keys, tf.reshape(key_counts, [-1]), num=n * num_tables)
    weight_chunks = None if g_weights is None else tf.split(g_weights, tf.reshape(key_counts, [-1]), num=n * num_tables)

    def by_table(chunks: list[tf.Tensor], t: int) -> tf.Tensor:
        return tf.concat([chunks[r * num_tables + t] for r in range(n)], 0)

    table_keys = [by_table(key_chunks, t) for t in range(num_tables)]
    table_weights = None if weight_chunks is None else [by_table(weight_chunks, t) for t in range(num_tables)]
    table_splits = tf.unstack(splits, num=num_tables)
    partial = _pool_static_shards(params, kinds, table_keys, table_splits, table_weights, rank, n)
    statuses: list[tuple[tf.Tensor, tf.Tensor] | None] = [None] * num_tables
    for t in range(num_tables):
        if partial[t] is None:
            partial[t], statuses[t] = _pool_local(
                params[t],
                kinds[t],
                table_keys[t],
                tf.ragged.row_splits_to_segment_ids(table_splits[t]),
                None if table_weights is None else table_weights[t],
                global_batch,
                rank,
                n,
                low_frequency_filter,
            )
    # One all-to-all for all tables: rank r gets the rows of its samples from every rank.
    send = tf.concat(partial, axis=1)  # [global_batch, sum(dims)]
    if not any(status is not None for status in statuses):
        received = comm.alltoall(send, splits=tf.cast(g_batch, tf.int32), name=_ALLTOALL)  # [n * local_batch, D]
        summed = tf.reduce_sum(tf.reshape(received, [n, local_batch, sum(dims)]), axis=0)
        return tf.split(summed, dims, axis=1)
    # With dynamic tables, each destination's rows end with one row of this rank's lookup statuses.
    row = _status_row(statuses, dims)  # [1, sum(dims)]
    chunks = tf.split(send, g_batch, num=n)
    send = tf.concat([part for chunk in chunks for part in (chunk, row)], axis=0)  # [global_batch + n, D]
    received = comm.alltoall(send, splits=tf.cast(g_batch + 1, tf.int32), name=_ALLTOALL)
    received = tf.reshape(received, [n, local_batch + 1, sum(dims)])  # by source rank
    checks = [c for c in _assert_lookups_worked(params, dims, statuses, received[:, -1, :], rank) if c is not None]
    with tf.control_dependencies(checks):
        summed = tf.identity(tf.reduce_sum(received[:, :-1, :], axis=0))
    return tf.split(summed, dims, axis=1)


_ALLTOALL = "sok.lookup_sparse: all-to-all of the pooled rows"


def _status_row(statuses: list[tuple[tf.Tensor, tf.Tensor] | None], dims: list[int]) -> tf.Tensor:
    """``[1, sum(dims)]``: zeros, but the first column of each dynamic table's block holds the
    TensorFlow error code of this rank's lookup of it (0: it worked)."""
    blocks = []
    for status, dim in zip(statuses, dims):
        if status is None:
            blocks.append(tf.zeros([dim], tf.float32))
        else:
            code = tf.reshape(tf.cast(status[0], tf.float32), [1])
            blocks.append(tf.concat([code, tf.zeros([dim - 1], tf.float32)], 0))
    return tf.reshape(tf.concat(blocks, 0), [1, sum(dims)])


def _assert_lookups_worked(
    params: list[Any],
    dims: list[int],
    statuses: list[tuple[tf.Tensor, tf.Tensor] | None],
    status_rows: tf.Tensor,
    rank: int,
) -> list[tf.Operation]:
    """Asserts, on every rank, that every rank's lookup of each dynamic table worked: ``status_rows``
    ``[n, sum(dims)]`` holds the status row of each rank (``_status_row``). The error names the table
    and the failing ranks; on a failing rank it also gives the backend's message."""
    checks = []
    offset = 0
    for t, (status, dim) in enumerate(zip(statuses, dims)):
        if status is not None:
            codes = tf.cast(status_rows[:, offset], tf.int32)  # [n]
            failed = tf.strings.reduce_join(
                tf.strings.as_string(tf.where(tf.not_equal(codes, 0))[:, 0]), separator=", "
            )
            local = tf.where(tf.equal(status[0], 0), tf.constant("none (its lookup worked)"), status[1])
            message = tf.strings.join(
                [
                    f"sok.lookup_sparse: the lookup of table {params[t].name} (params[{t}], var_type "
                    f"{params[t].backend_type}) failed on rank(s) [",
                    failed,
                    f"], so the call fails on every rank; later calls work again. Fix the cause (e.g. a larger "
                    f"max_capacity, or a var_type with eviction). The error on rank {rank}: ",
                    local,
                ]
            )
            checks.append(_raise_unless(tf.reduce_all(tf.equal(codes, 0)), message))
        offset += dim
    return checks


def _raise_unless(condition: tf.Tensor, message: tf.Tensor) -> tf.Operation | None:
    """An InvalidArgumentError with the string tensor ``message`` unless ``condition``: raised now
    when eager, else the assert op to gate on."""
    if tf.executing_eagerly():
        if not bool(condition):
            raise tf.errors.InvalidArgumentError(None, None, message.numpy().decode(errors="replace"))
        return None
    return tf.debugging.Assert(condition, [message])


def _pool_static_shards(
    params: list[Any],
    kinds: list[str],
    keys: list[tf.Tensor],
    splits: list[tf.Tensor],
    weights: list[tf.Tensor] | None,
    rank: int,
    n: int,
) -> list[tf.Tensor | None]:
    """Step 3 for the static tables of ``_fused_tables``, in one ``pooled_lookup``: the partial sums
    ``[global_batch, dim]`` of the ids this rank holds, from the global batch's ``keys``, row
    ``splits`` and ``weights`` of each table; None for the other tables."""
    partial: list[tf.Tensor | None] = [None] * len(params)
    fused = _fused_tables(params, kinds)
    if not fused:
        return partial

    def ragged(values: list[tf.Tensor], t: int) -> tf.RaggedTensor:
        return tf.RaggedTensor.from_row_splits(values[t], splits[t], validate=False)

    pooled = pooled_lookup.pooled_lookup(
        _subset(params, fused),
        [ragged(keys, t) for t in fused],
        None if weights is None else [ragged(weights, t) for t in fused],
        ["sum"] * len(fused),
        fused,
        [_shard(params[t], kinds[t], rank, n) for t in fused],
    )
    for t, sums in zip(fused, pooled):
        partial[t] = sums
    return partial


def all2all_dense_embedding(param: Any, indices: Any) -> tf.Tensor:
    """Rows of a distributed table (or DynamicVariable) for 1-D ids, each rank its own ids:
    a model-parallel ``tf.nn.embedding_lookup``. Returns ``[len(indices), dim]``."""
    ids = tf.convert_to_tensor(indices)
    if ids.shape.rank != 1:
        raise ValueError(f"indices must be 1-D, got shape {ids.shape}")
    ragged = tf.RaggedTensor.from_tensor(tf.reshape(ids, [-1, 1]))
    return lookup_sparse([param], [ragged], combiners=["sum"])[0]
