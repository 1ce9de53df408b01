"""Checks of one ``sok.lookup_sparse`` call that every rank passes or fails together.

Each rank counts its problems (ids outside a static table, int64 ids that do not fit an int32 key
type, weights whose rows differ from the ids', samples longer than ``hotness``); with several ranks
one allgather carries ``[fingerprint of the call, number of counts, batch size, sum of the counts, ids
per owner and table...]`` of every rank, so a rank that passes other tables, or a bad id on one rank,
fails the call on every rank before the exchange moves anything; the same allgather tells every rank
how many ids of each table it receives from each.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from sparse_operation_kit import communication, device_ops
from sparse_operation_kit.lookup.asserts import gate, raise_unless
from sparse_operation_kit.lookup.exchange import Exchange
from sparse_operation_kit.lookup.plan import on_gpu

__all__ = ["ShapeAgreement", "agreed_checks", "agreed_shapes"]

#: The values of a rank's record before its counts: fingerprint, number of counts, batch size.
#: (The record of the call's allgather then has the sum of the counts and the ids per owner and table.)
_HEAD = 3


def _identity(
    params: Sequence[Any],
    kinds: Sequence[str],
    combiners: Sequence[str],
    weights: Sequence[tf.RaggedTensor] | None,
    hotness: Sequence[int] | None,
) -> tuple[str, int]:
    """What every rank's call must agree on, described (for the disagreement's message), and its
    fingerprint (int64): the tables (names, kinds, shapes), the combiners, and whether sp_weights
    and hotness are given; they decide which collectives the call makes."""
    tables = []
    for i, (param, kind) in enumerate(zip(params, kinds)):
        if kind == "dynamic":
            shape = f"dim {param.dimension}, key_type {param.key_type.name}, mode {param.mode}"
        else:
            shape = f"shape {list(param.global_shape.as_list())}" + (
                f", localized:{param.target_gpu}" if kind == "localized" else ""
            )
        tables.append(f"params[{i}] = {param.name} ({kind}, {shape}, combiner {combiners[i]})")
    description = (
        f"{len(tables)} table(s): {'; '.join(tables)}; sp_weights {'None' if weights is None else 'given'}; "
        f"hotness {None if hotness is None else list(hotness)}"
    )
    return description, communication.fingerprint(description.encode())


def agreed_checks(
    params: Sequence[Any],
    kinds: Sequence[str],
    ragged: Sequence[tf.RaggedTensor],
    weights: Sequence[tf.RaggedTensor] | None,
    comm: communication.CommunicationTool,
    hotness: Sequence[int] | None,
    *,
    checked_by_op: Sequence[int],
    combiners: Sequence[str],
    exchange: Exchange | None,
    sends: tf.Tensor | None,
) -> tuple[list[tf.Operation | tf.Tensor], tf.Tensor | None, tf.Tensor | None]:
    """Checks that fail on every rank together, in one collective, and what the exchange needs to
    know of every rank from the same collective: returns ``(checks, batch_sizes, sends)``, the
    batch sizes int64 ``[n]`` and ``sends[r]`` the ``sends`` of rank ``r`` (int64 ``[n, len(sends)]``),
    both in host memory (None with one rank).

    Each rank sends ``[fingerprint of its call, number of counts, its batch size, the sum of its
    counts of problems, sends (this rank's ids per owner and table, int64, from ``exchange``'s
    caller: one length on every rank that makes the same call)]``,
    a record of one length whatever the call, in one allgather of ``exchange``; the host reads the
    gathered records once. Every rank checks that all records carry its own fingerprint (the same
    tables, combiners and options in the same order, so that the ranks make the same collectives)
    and that no rank counted a problem (so no rank enters the exchange alone). Only when that
    fails (on every rank: they read the same records) does a second allgather, of the
    communication tool, bring every count, and the asserts run that name the problem: the
    disagreement first, then each count. The id ranges of the tables in ``checked_by_op`` are left
    to ``pooled_lookup``'s op (one rank). At several ranks on the host's tables the batch sizes and
    sends come out of the check, and no check is returned (``_sizes_after_check``)."""
    problems = _problems(params, kinds, ragged, weights, hotness, checked_by_op)
    n = comm.num_ranks()
    if n == 1 and not problems:
        return [], None, None
    messages = [problem.message for problem in problems]

    counts = functools.partial(_counts, problems)
    total = _total_of(problems, ragged)
    if n == 1:
        return [gate(tf.equal(total, 0), lambda: _assert_none(counts(), messages))], None, None
    description, fingerprint = _identity(params, kinds, combiners, weights, hotness)
    head = _head(fingerprint, problems, ragged[0].nrows(out_type=tf.int64))
    if exchange is None or sends is None:
        raise ValueError(f"agreed_checks at {n} ranks takes the call's exchange and its ids per owner")
    record = tf.concat([head, tf.reshape(total, [1]), tf.cast(sends, tf.int64)], 0)
    gathered = exchange.allgather(
        record, name="sok.lookup_sparse: allgather of the call's fingerprint, batch sizes, checks and id counts"
    )
    with device_ops.on_host():  # the call's one copy to the host
        table = tf.reshape(tf.identity(gathered), [n, _HEAD + 1 + int(sends.shape[0])])
        ok = _same_call(table, fingerprint, problems) & tf.reduce_all(tf.equal(table[:, _HEAD], 0))

    report = _reporter(problems, head, counts, comm, fingerprint, description)
    checks, table = _sizes_after_check(ok, table, report, params)
    with device_ops.on_host():  # slices of a host tensor: on the host too (an int64 op would go to the GPU)
        batch_sizes, sends_of_all = table[:, 2], table[:, _HEAD + 1 :]
    return checks, batch_sizes, sends_of_all


@dataclass(frozen=True)
class ShapeAgreement:
    """What ``agreed_shapes`` learns before a call's exchange, with nothing read from a GPU:
    ``batch_sizes`` (int64 ``[n]``) and ``nnz`` (int64 ``[n, tables]``: each rank's ids per table)
    in host memory, and ``checks``, the check that every rank makes the same call, to gate the
    exchange on (empty where the sizes come out of that check: tables on the host); ``total`` is
    this rank's count of problems (int64 scalar, on the ids' device), to travel with the ids, and
    ``confirm(totals)`` the check of every rank's (int64 ``[n]``, in rank order), which raises the
    errors that name each problem on every rank together."""

    checks: list[tf.Operation | tf.Tensor]
    batch_sizes: tf.Tensor
    nnz: tf.Tensor
    total: tf.Tensor
    confirm: Callable[[tf.Tensor], tf.Tensor]


def agreed_shapes(
    params: Sequence[Any],
    kinds: Sequence[str],
    ragged: Sequence[tf.RaggedTensor],
    weights: Sequence[tf.RaggedTensor] | None,
    comm: communication.CommunicationTool,
    hotness: Sequence[int] | None,
    *,
    combiners: Sequence[str],
    record_tables: int,
) -> ShapeAgreement:
    """The agreement of a call at several ranks from what the host knows without the GPU: each rank
    sends ``[fingerprint of its call, number of counts, its batch size, its ids per table...]``
    (the sizes are the tensors' shapes; zeros after them up to ``record_tables`` tables, one length
    whatever the call) in one allgather of the communication tool on host tensors, which waits for
    the other ranks' hosts, never for a GPU. Every rank checks that all records carry its
    fingerprint before any collective of the exchange (``_sizes_after_check``); the counts of
    problems (ids outside a static table, ...), made on the device, travel with the ids and are
    checked after the exchange by ``confirm``. Either failure takes the path of
    :func:`agreed_checks`: a second allgather brings every count, and the asserts name the problem."""
    problems = _problems(params, kinds, ragged, weights, hotness, ())
    n = comm.num_ranks()

    counts = functools.partial(_counts, problems)
    total = _total_of(problems, ragged)
    description, fingerprint = _identity(params, kinds, combiners, weights, hotness)
    if len(ragged) > record_tables:
        raise ValueError(f"agreed_shapes: {len(ragged)} tables do not fit a record of {record_tables} tables")
    width = _HEAD + record_tables
    nnz = device_ops.lengths([ids.values for ids in ragged])
    batch = device_ops.length(ragged[0].row_splits)
    with device_ops.on_host():
        head = _head(fingerprint, problems, batch - 1)
        record = tf.concat([head, nnz, tf.zeros([width - _HEAD - len(ragged)], tf.int64)], 0)
        gathered = comm.allgather(record, name="sok.lookup_sparse: allgather of the call's fingerprint and sizes")
        table = tf.reshape(gathered, [n, width])
        ok = _same_call(table, fingerprint, problems)
    report = _reporter(problems, head, counts, comm, fingerprint, description)
    checks, table = _sizes_after_check(ok, table, report, params)
    with device_ops.on_host():
        batch_sizes, nnz_of_all = table[:, 2], table[:, _HEAD : _HEAD + len(ragged)]

    def confirm(totals: tf.Tensor) -> tf.Tensor:
        return gate(tf.equal(tf.reduce_sum(totals), 0), report)

    return ShapeAgreement(checks, batch_sizes, nnz_of_all, total, confirm)


def _head(fingerprint: int, problems: Sequence[_Problem], batch: tf.Tensor) -> tf.Tensor:
    """A rank's ``[fingerprint, number of counts, batch]`` (int64), where its record starts."""
    return tf.concat([tf.constant([fingerprint, len(problems)], tf.int64), tf.reshape(batch, [1])], 0)


def _same_call(records: tf.Tensor, fingerprint: int, problems: Sequence[_Problem]) -> tf.Tensor:
    """Whether every rank's record (``[n, ...]``, each starting with its ``_head``) carries this
    rank's fingerprint and number of counts."""
    return tf.reduce_all(tf.equal(records[:, 0], fingerprint)) & tf.reduce_all(tf.equal(records[:, 1], len(problems)))


def _sizes_after_check(
    ok: tf.Tensor, records: tf.Tensor, report: Callable[[], tf.Tensor], params: Sequence[Any]
) -> tuple[list[tf.Operation | tf.Tensor], tf.Tensor]:
    """The check of a call's agreement (``ok``, on the host; ``report`` raises its errors) and the
    gathered ``records`` every size of the exchange is read from: on the host's tables the records
    come out of the check (a tf.cond's output: data, not a control dependency, which TensorFlow may
    pass in a tf.function before a lowered cond's failing branch raised), so no collective starts
    on a call the ranks disagree on, and no check is returned; on GPU tables the check is returned,
    to gate the exchange on, and the records as they were (the failing branch reads the ids, so a
    cond the records came out of would take the ids as an input, copied to the host every step)."""
    if any(on_gpu(param) for param in params):
        return [gate(ok, report)], records

    def failed() -> tf.Tensor:
        with tf.control_dependencies([report()]):
            return tf.identity(records)

    return [], tf.cond(ok, lambda: tf.identity(records), failed)


def _reporter(
    problems: Sequence[_Problem],
    head: tf.Tensor,
    counts: Callable[[], tf.Tensor],
    comm: communication.CommunicationTool,
    fingerprint: int,
    description: str,
) -> Callable[[], tf.Tensor]:
    """The failure branch of a call's agreement: every rank gets there together (they read the same
    gathered values); the records with every count, whose lengths may differ, travel through the
    communication tool, then the asserts run that name the disagreement first (the counts mean
    nothing then), then each count. ``head``: this rank's ``[fingerprint, number of counts, batch]``."""
    n = comm.num_ranks()
    messages = [problem.message for problem in problems]

    def report() -> tf.Tensor:
        detailed = comm.allgather(
            tf.concat([head, counts()], 0), name="sok.lookup_sparse: allgather of the call's fingerprint and checks"
        )
        width = _HEAD + len(problems)
        records = _as_records(detailed, n, width)
        agree = tf.equal(tf.size(detailed, out_type=tf.int64), n * width) & _same_call(records, fingerprint, problems)
        agreement = _assert_same_call(detailed, agree, fingerprint, n, comm.rank(), description)
        with tf.control_dependencies([agreement]):
            return _assert_none(tf.reduce_sum(records[:, _HEAD:], axis=0), messages)

    return report


@dataclass(frozen=True)
class _Problem:
    """One check of a call: ``count()`` makes its count of offending ids or rows (int64 scalar),
    ``message`` names it. ``bounds`` ``(table, lowest, highest)``: the check is that every id of
    ``table`` lies in ``[lowest, highest]``, which ``_total_of`` counts for all tables at once."""

    count: Callable[[], tf.Tensor]
    message: str
    bounds: tuple[int, int, int] | None = None


def _problems(
    params: Sequence[Any],
    kinds: Sequence[str],
    ragged: Sequence[tf.RaggedTensor],
    weights: Sequence[tf.RaggedTensor] | None,
    hotness: Sequence[int] | None,
    checked_by_op: Sequence[int],
) -> list[_Problem]:
    """The checks of a call, in the order their errors are raised."""
    problems: list[_Problem] = []

    def outside(i: int, lowest: int, highest: int) -> Callable[[], tf.Tensor]:
        def count() -> tf.Tensor:
            values = tf.cast(ragged[i].values, tf.int64)
            return tf.reduce_sum(tf.cast((values < lowest) | (values > highest), tf.int64))

        return count

    for i, (param, kind, ids) in enumerate(zip(params, kinds, ragged)):
        if kind != "dynamic" and i not in checked_by_op:
            rows = int(param.global_shape[0])
            problems.append(
                _Problem(
                    outside(i, 0, rows - 1),
                    f"sp_ids[{i}] has ids outside [0, {rows}) for table {param.name} (count over all ranks "
                    f"follows); static tables take ids 0 .. rows-1",
                    (i, 0, rows - 1),
                )
            )
        elif kind == "dynamic" and param.key_type == tf.int32:
            # Counted (0 for int32 ids) whatever the ids' dtype, so the records of all ranks have one length.
            problems.append(
                _Problem(
                    outside(i, -(2**31), 2**31 - 1),
                    f"sp_ids[{i}] has int64 ids that do not fit the int32 keys of {param.name} (count over all "
                    f"ranks follows)",
                    (i, -(2**31), 2**31 - 1),
                )
            )
        if weights is not None:

            def mismatch(ids: tf.RaggedTensor = ids, w: tf.RaggedTensor = weights[i]) -> tf.Tensor:
                return tf.reduce_sum(tf.abs(tf.cast(ids.row_lengths(), tf.int64) - tf.cast(w.row_lengths(), tf.int64)))

            problems.append(
                _Problem(
                    mismatch,
                    f"sp_weights[{i}] does not have the row lengths of sp_ids[{i}] (differences over all ranks follow)",
                )
            )
        if hotness is not None:

            def longer(ids: tf.RaggedTensor = ids, limit: int = hotness[i]) -> tf.Tensor:
                return tf.reduce_sum(tf.cast(tf.cast(ids.row_lengths(), tf.int64) > limit, tf.int64))

            problems.append(
                _Problem(
                    longer,
                    f"sp_ids[{i}] has a sample with more ids than hotness[{i}] = {hotness[i]} (count over all "
                    f"ranks follows)",
                )
            )
    return problems


def _counts(problems: Sequence[_Problem]) -> tf.Tensor:
    """Each problem's count (int64 ``[problems]``), made only where a check failed (a tf.cond
    branch): the fast path adds all of them in a few ops (``_total_of``)."""
    return tf.stack([problem.count() for problem in problems]) if problems else tf.zeros([0], tf.int64)


def _total_of(problems: Sequence[_Problem], ragged: Sequence[tf.RaggedTensor]) -> tf.Tensor:
    """A count that is 0 exactly when every problem's is (int64 scalar): the id ranges of all tables
    in one comparison of their ids, one after the other, with each id's bounds (a few ops whatever
    the number of tables), plus the other counts."""
    ranged = [p.bounds for p in problems if p.bounds is not None]
    terms = [p.count() for p in problems if p.bounds is None]
    if ranged:
        tables = [t for t, _, _ in ranged]
        values = tf.concat([tf.cast(ragged[t].values, tf.int64) for t in tables], 0)
        which = device_ops.part_of_each([ragged[t].values for t in tables])
        lowest = tf.gather(tf.constant([low for _, low, _ in ranged], tf.int64), which)
        highest = tf.gather(tf.constant([high for _, _, high in ranged], tf.int64), which)
        terms.append(tf.reduce_sum(tf.cast((values < lowest) | (values > highest), tf.int64)))
    return tf.add_n(terms) if terms else tf.constant(0, tf.int64)


def _assert_none(counts: tf.Tensor, messages: Sequence[str]) -> tf.Tensor:
    """Asserts that every count is 0, each failure with its message; returns True after them."""
    asserts = [
        tf.debugging.assert_equal(counts[j], tf.constant(0, tf.int64), message=message)
        for j, message in enumerate(messages)
    ]
    true = tf.constant(True)
    with tf.control_dependencies([a for a in asserts if a is not None]):
        return tf.identity(true)


def _assert_same_call(
    gathered: tf.Tensor, agree: tf.Tensor, fingerprint: int, n: int, rank: int, description: str
) -> tf.Tensor:
    """Asserts ``agree``: that the ``n`` records of ``gathered`` (``[fingerprint, length, batch,
    length counts]`` each, rank after rank) all carry this rank's fingerprint; the message names the ranks
    that differ."""

    def fail() -> tf.Tensor:
        # Walk the records (their lengths may differ): rank r's starts after those of ranks < r.
        start = tf.constant(0, tf.int64)
        differs = []
        for _ in range(n):
            differs.append(tf.not_equal(gathered[start], fingerprint))
            start = start + _HEAD + gathered[start + 1]
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
        check = raise_unless(agree, message)
        with tf.control_dependencies([check]):
            return tf.identity(agree)

    return gate(agree, fail)


def _as_records(gathered: tf.Tensor, n: int, width: int) -> tf.Tensor:
    """``gathered`` as ``[n, width]`` records, cut or padded with zeros to ``n * width`` values first:
    a shape that never fails, whatever the ranks sent (TensorFlow may run a tf.cond branch ahead)."""
    values = tf.concat([gathered, tf.zeros([n * width], gathered.dtype)], 0)[: n * width]
    return tf.reshape(values, [n, width])
