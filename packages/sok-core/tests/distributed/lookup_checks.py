"""Checks of the distributed lookup (``sok.lookup_sparse``, ``sok.all2all_dense_embedding``), shared
by the single-process tests (``tests/test_lookup_sparse.py`` runs each check in-process) and the
worker that runs them all under ``horovodrun -np 2`` (``lookup_worker.py``).

Every check is a function of a :class:`Comm` (this rank, the number of ranks, and the test's own
collectives). Checks are written for any number of ranks:

* the oracle is TensorFlow: every rank builds the same full tables from fixed seeds, looks up its
  own local batch (a different one per rank: different sizes, empty samples), and compares
  ``sok.lookup_sparse`` with ``tf.nn.embedding_lookup_sparse`` on the full table; gradients are
  compared with the per-rank TensorFlow gradients of the same loss summed over ranks
  (``hvd.allreduce(op=Sum)``), mapped to global rows (reference §2.3);
* mismatches are collected and raised at the end of a check, after every collective of the check
  ran, so a failing check never leaves the ranks out of step;
* errors must be the same on every rank (type and message), compared with an allgather.

Reference numbers: /work/shared/reference/sok.md §1.2, §1.5, §2.8.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import sparse_operation_kit as sok
import tensorflow as tf
from sparse_operation_kit import communication
from sparse_operation_kit import experiment as sok_experiment
from sparse_operation_kit.lookup.input_dist import RECORD_TABLES

RTOL = 1e-5
ATOL = 1e-5
#: Rows a dynamic table creates for keys it does not hold: a lookup that reads a key on the wrong
#: rank returns this instead of the table's row.
MISSING_ROW = -99.0
HYBRID_OPTIONS = {"init_capacity": 1024, "max_capacity": 1 << 16}
MODES = ("eager", "function")
FORMATS = ("ragged", "sparse")
COMBINERS = ("sum", "mean", "sqrtn")


# -- communication of the test itself -------------------------------------------------------------


class Comm:
    """This rank, the number of ranks, and the collectives the checks use for comparisons."""

    def __init__(self, rank: int = 0, n: int = 1, hvd: Any = None) -> None:
        self.rank, self.n, self._hvd = rank, n, hvd

    @classmethod
    def horovod(cls) -> Comm:
        import horovod.tensorflow as hvd

        return cls(hvd.rank(), hvd.size(), hvd)

    def allreduce_sum(self, array: np.ndarray) -> np.ndarray:
        array = np.asarray(array)
        if self.n == 1:
            return array
        return self._hvd.allreduce(tf.constant(array), op=self._hvd.Sum).numpy()

    def allgather_object(self, obj: Any, name: str = "check") -> list:
        if self.n == 1:
            return [obj]
        return self._hvd.allgather_object(obj, name=name)


class Mismatches:
    """Differences found by a check, raised together at its end."""

    def __init__(self) -> None:
        self.found: list[str] = []

    def close(self, label: str, actual: Any, expected: Any, rtol: float = RTOL, atol: float = ATOL) -> None:
        actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
        if actual.shape != expected.shape:
            self.found.append(f"{label}: shape {actual.shape} != expected {expected.shape}")
            return
        bad = ~np.isclose(actual, expected, rtol=rtol, atol=atol)
        if bad.any():
            where = np.argwhere(bad)[:3].tolist()
            pairs = [(w, float(actual[tuple(w)]), float(expected[tuple(w)])) for w in where]
            self.found.append(f"{label}: {int(bad.sum())} of {bad.size} values differ, e.g. (index, got, want) {pairs}")

    def equal(self, label: str, actual: Any, expected: Any) -> None:
        if actual != expected:
            self.found.append(f"{label}: got {actual!r}, expected {expected!r}")

    def true(self, label: str, condition: bool) -> None:
        if not condition:
            self.found.append(label)

    def raise_if_any(self) -> None:
        if self.found:
            raise AssertionError("; ".join(self.found))


# -- tables ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Table:
    """One entry of ``params``: a table, or a second lookup of an earlier one (``same_as``)."""

    kind: str = "distributed"  # "distributed" | "localized" | "dynamic" | "same"
    rows: int = 0
    dim: int = 0
    target: int | None = None  # localized tables (static or dynamic): rank, negative from the end
    var_type: str = "hbm"
    id_dtype: tf.DType = tf.int64  # dtype of the ids given to sok.lookup_sparse
    key_type: tf.DType = tf.int64  # dynamic tables
    same_as: int = -1
    filter_ratio: float = 1.0  # dynamic tables: the low-frequency filter's admission rate


#: One call with every kind of table: widths 1, 3, 16, 128; shards of uneven size (37 and 3 rows at
#: np 2) and an empty shard (1 row); int32 and int64 ids; negative and huge dynamic keys; the same
#: static and the same dynamic table twice.
MIXED = (
    Table("distributed", 37, 16),
    Table("localized", 11, 3, target=0, id_dtype=tf.int32),
    Table("localized", 9, 1, target=-1),
    Table("dynamic", 23, 128, var_type="hbm"),
    Table("dynamic", 13, 3, var_type="hybrid"),
    Table("same", same_as=0),
    Table("distributed", 3, 128, id_dtype=tf.int32),
    Table("distributed", 1, 1),
    Table("dynamic", 7, 16, var_type="hbm", target=-1),
    Table("same", same_as=3),
)


@dataclass
class Built:
    spec: Table
    full: np.ndarray  # [rows, dim], the same on every rank
    var: Any
    owner: np.ndarray  # [rows]: the rank that owns each row
    keys: np.ndarray | None = None  # dynamic: the key of each row

    @property
    def dynamic(self) -> bool:
        return self.spec.kind == "dynamic"


def _target(spec: Table, n: int) -> int:
    return spec.target % n


def _dynamic_keys(rng: np.random.Generator, rows: int, key_type: tf.DType, id_dtype: tf.DType) -> np.ndarray:
    """Distinct keys: 0, negative ones, huge ones (within what ``key_type`` and the ids can hold)."""
    if tf.int32 in (key_type, id_dtype):
        keys, low, high = {0, -5, 2**31 - 2, -(2**31) + 3, 6}, -(2**31), 2**31 - 1
    elif key_type == tf.uint64:
        # As int64 bits: -(2**62) - 11 is the key 2**64 - 2**62 - 11 (>= 2**63).
        keys, low, high = {0, 2**40 + 3, 2**62 + 9, -(2**62) - 11, 6}, 0, 2**62
    else:
        keys, low, high = {0, -5, 2**40 + 3, -(2**50) - 7, 6}, -(2**60), 2**60
    while len(keys) < rows:
        keys.add(int(rng.integers(low, high)))
    return np.array(sorted(keys)[:rows], dtype=np.int64)


def _np(dtype: tf.DType) -> Any:
    return dtype.as_numpy_dtype


def build_tables(specs: tuple[Table, ...], comm: Comm, seed: int) -> list[Built]:
    """SOK tables (and their full values) for ``specs``; ``same`` entries share the earlier table."""
    built: list[Built] = []
    for t, spec in enumerate(specs):
        if spec.kind == "same":
            built.append(built[spec.same_as])
            continue
        rng = np.random.default_rng([seed, t])
        full = rng.normal(size=(spec.rows, spec.dim)).astype(np.float32)
        if spec.kind == "distributed":
            var = sok.Variable(full, dtype=tf.float32)
            owner = np.arange(spec.rows) % comm.n
            built.append(Built(spec, full, var, owner))
        elif spec.kind == "localized":
            var = sok.Variable(full, dtype=tf.float32, mode=f"localized:{_target(spec, comm.n)}")
            built.append(Built(spec, full, var, np.full(spec.rows, _target(spec, comm.n))))
        else:
            keys = _dynamic_keys(rng, spec.rows, spec.key_type, spec.id_dtype)
            mode = None if spec.target is None else f"localized:{_target(spec, comm.n)}"
            if mode is None and spec.var_type == "hybrid":
                mode = "distributed"
            options = dict(HYBRID_OPTIONS) if spec.var_type == "hybrid" else {}
            if spec.filter_ratio != 1.0:
                options["filter_ratio"] = spec.filter_ratio
            var = sok.DynamicVariable(
                dimension=spec.dim,
                var_type=spec.var_type,
                initializer=MISSING_ROW,
                mode=mode,
                key_type=spec.key_type,
                **options,
            )
            owner = np.mod(keys, comm.n) if spec.target is None else np.full(spec.rows, _target(spec, comm.n))
            mine = owner == comm.rank
            if mine.any():  # each rank holds only the keys it owns
                sok.assign(var, tf.constant(keys[mine].astype(_np(spec.key_type))), tf.constant(full[mine]))
            built.append(Built(spec, full, var, owner, keys))
    return built


def unique_tables(built: list[Built]) -> list[Built]:
    seen: dict[int, Built] = {}
    for b in built:
        seen.setdefault(id(b.var), b)
    return list(seen.values())


# -- batches ---------------------------------------------------------------------------------------


@dataclass
class Lookup:
    """One table's local batch on this rank: row indices of the full table, per-sample lengths."""

    rows: np.ndarray  # int64 [ids]
    lengths: np.ndarray  # int64 [batch]
    weights: np.ndarray  # float32 [ids]
    combiner: str
    fmt: str = "ragged"


def default_lengths(rng: np.random.Generator, rank: int, n: int, t: int) -> np.ndarray:
    """Batch 4 + 2 * rank (different per rank), up to 4 ids per sample, sample 1 always empty."""
    lengths = rng.integers(0, 5, 4 + 2 * rank)
    lengths[1] = 0
    return lengths


def make_lookups(
    built: list[Built],
    comm: Comm,
    seed: int,
    shift: int = 0,
    fmt: str = "ragged",
    lengths_fn: Callable[[np.random.Generator, int, int, int], np.ndarray] = default_lengths,
) -> list[Lookup]:
    """Per-rank ids (different on every rank), weights in [0.5, 2), combiner of lookup t:
    ``COMBINERS[(t + shift) % 3]``; fmt "mixed" alternates ragged and sparse."""
    lookups = []
    for t, b in enumerate(built):
        rng = np.random.default_rng([seed, 1000 + comm.rank, t])
        lengths = np.asarray(lengths_fn(rng, comm.rank, comm.n, t), np.int64)
        rows = rng.integers(0, b.spec.rows, int(lengths.sum())).astype(np.int64)
        weights = rng.uniform(0.5, 2.0, rows.size).astype(np.float32)
        this_fmt = FORMATS[t % 2] if fmt == "mixed" else fmt
        lookups.append(Lookup(rows, lengths, weights, COMBINERS[(t + shift) % 3], this_fmt))
    return lookups


def _layout(values: tf.Tensor, lengths: np.ndarray, fmt: str) -> Any:
    ragged = tf.RaggedTensor.from_row_lengths(values, tf.constant(lengths, tf.int64))
    return ragged.to_sparse() if fmt == "sparse" else ragged


def sok_inputs(built: list[Built], lookups: list[Lookup], weighted: bool) -> tuple[list, list | None]:
    ids, weights = [], []
    for b, lk in zip(built, lookups):
        values = (b.keys[lk.rows] if b.dynamic else lk.rows).astype(_np(b.spec.id_dtype))
        ids.append(_layout(tf.constant(values, b.spec.id_dtype), lk.lengths, lk.fmt))
        weights.append(_layout(tf.constant(lk.weights), lk.lengths, lk.fmt))
    return ids, (weights if weighted else None)


def cotangents(built: list[Built], lookups: list[Lookup], comm: Comm, seed: int) -> list[tf.Tensor]:
    """Per-rank random d(loss)/d(embedding): the loss is sum(embedding * cotangent) over lookups."""
    rng = np.random.default_rng([seed, 2000 + comm.rank])
    return [
        tf.constant(rng.normal(size=(lk.lengths.size, b.spec.dim)).astype(np.float32)) for b, lk in zip(built, lookups)
    ]


# -- the TensorFlow oracle -------------------------------------------------------------------------


def tf_forward_and_grads(
    built: list[Built], lookups: list[Lookup], weighted: bool, cots: list[tf.Tensor], comm: Comm
) -> tuple[list[np.ndarray], dict[int, np.ndarray]]:
    """``tf.nn.embedding_lookup_sparse`` on the full tables, and the gradient of the same loss per
    unique table, dense ``[rows, dim]``, summed over ranks."""
    full_vars: dict[int, tf.Variable] = {}
    for b in built:
        full_vars.setdefault(id(b.var), tf.Variable(b.full))
    with tf.GradientTape() as tape:
        outputs = []
        for b, lk in zip(built, lookups):
            ids = tf.RaggedTensor.from_row_lengths(tf.constant(lk.rows), tf.constant(lk.lengths))
            w = tf.RaggedTensor.from_row_lengths(tf.constant(lk.weights), tf.constant(lk.lengths)) if weighted else None
            out = tf.nn.embedding_lookup_sparse(full_vars[id(b.var)], ids, w, combiner=lk.combiner)
            # TensorFlow leaves out trailing empty samples: they are zeros.
            out = tf.pad(out, [[0, lk.lengths.size - tf.shape(out)[0]], [0, 0]])
            outputs.append(out)
        loss = tf.add_n([tf.reduce_sum(o * c) for o, c in zip(outputs, cots)])
    keys = list(full_vars)
    grads = tape.gradient(loss, [full_vars[k] for k in keys])
    dense = {}
    for k, g in zip(keys, grads):
        rows, dim = full_vars[k].shape
        local = np.zeros((rows, dim), np.float32)
        if g is not None:
            np.add.at(local, np.asarray(g.indices), np.asarray(g.values).reshape(-1, dim))
        dense[k] = comm.allreduce_sum(local)
    return [o.numpy() for o in outputs], dense


def sok_grad_to_global(b: Built, grad: Any, comm: Comm, m: Mismatches, label: str) -> np.ndarray:
    """This rank's SOK gradient of one table as dense global rows, checking its index space:
    local rows (global // n) of distributed tables, full rows on a localized target and nothing
    elsewhere, raw owned keys for dynamic tables."""
    dense = np.zeros_like(b.full)
    if grad is None:
        m.true(f"{label}: gradient is None on rank {comm.rank}", not (b.owner == comm.rank).any())
        return dense
    m.true(f"{label}: gradient is {type(grad).__name__}, not IndexedSlices", isinstance(grad, tf.IndexedSlices))
    indices = np.asarray(tf.convert_to_tensor(grad.indices)).reshape(-1)
    values = np.asarray(tf.convert_to_tensor(grad.values)).reshape(-1, b.spec.dim)
    kind = b.spec.kind
    if kind == "distributed":
        local_rows = int(b.var.shape[0])
        ok = (indices >= 0) & (indices < local_rows)
        m.true(f"{label}: local row indices {indices[~ok][:5].tolist()} outside [0, {local_rows})", bool(ok.all()))
        rows = indices[ok] * comm.n + comm.rank
        values = values[ok]
    elif kind == "localized":
        if comm.rank != _target(b.spec, comm.n):
            m.true(f"{label}: non-target rank got {indices.size} gradient rows", indices.size == 0)
        ok = (indices >= 0) & (indices < b.spec.rows)
        m.true(f"{label}: row indices {indices[~ok][:5].tolist()} outside the table", bool(ok.all()))
        rows, values = indices[ok], values[ok]
    else:
        if indices.dtype == np.uint64:
            indices = indices.view(np.int64)  # b.keys holds a uint64 table's keys as their int64 bits
        row_of = {int(k): i for i, k in enumerate(b.keys)}
        known = np.array([int(k) in row_of for k in indices], bool)
        m.true(f"{label}: gradient keys {indices[~known][:5].tolist()} were never looked up", bool(known.all()))
        rows = np.array([row_of[int(k)] for k in indices[known]], np.int64)
        values = values[known]
        foreign = b.owner[rows] != comm.rank
        m.true(
            f"{label}: gradient for keys owned by other ranks: {b.keys[rows[foreign]][:5].tolist()}", not foreign.any()
        )
    np.add.at(dense, rows, values)
    return dense


class SokStep:
    """SOK forward and gradients (per unique table) of ``sum(embedding * cotangent)``, eager or as
    one ``tf.function``; with ``lr``, also one training step: plain Keras SGD on the static shards,
    ``sok.OptimizerWrapper(SGD)`` on the dynamic tables.

    In graph mode the function has an input signature of any batch size, so one trace serves every
    call with the same tables, formats and weights (tracing a many-table call takes seconds).
    """

    def __init__(
        self, built: list[Built], lookups: list[Lookup], weighted: bool, mode: str, lr: float | None = None
    ) -> None:
        self.built, self.lr = built, lr
        self.tables = unique_tables(built)
        params = [b.var for b in built]
        variables = [b.var for b in self.tables]
        combiners = [lk.combiner for lk in lookups]
        train = None
        if lr is not None:
            keras_sgd = tf.keras.optimizers.SGD(learning_rate=lr)
            keras_sgd.build([b.var for b in self.tables if not b.dynamic])
            train = (keras_sgd, sok.OptimizerWrapper(tf.keras.optimizers.SGD(learning_rate=lr)))

        def step(ids, weights, cots):
            with tf.GradientTape() as tape:
                embs = sok.lookup_sparse(params, ids, weights, combiners)
                loss = tf.add_n([tf.reduce_sum(e * c) for e, c in zip(embs, cots)])
            grads = tape.gradient(loss, variables)
            if train is not None:
                static = [(g, v) for g, v in zip(grads, variables) if not isinstance(v, sok.DynamicVariable)]
                dynamic = [(g, v) for g, v in zip(grads, variables) if isinstance(v, sok.DynamicVariable)]
                train[0].apply_gradients(static)
                train[1].apply_gradients(dynamic)
            return embs, grads

        if mode == "function":
            step = tf.function(step, input_signature=self._signature(lookups, weighted))
        self._step = step

    def _signature(self, lookups: list[Lookup], weighted: bool) -> list:
        def layout(dtype: tf.DType, fmt: str) -> Any:
            if fmt == "sparse":
                return tf.SparseTensorSpec([None, None], dtype)
            return tf.RaggedTensorSpec([None, None], dtype, ragged_rank=1, row_splits_dtype=tf.int64)

        id_types = [b.spec.id_dtype for b in self.built]
        ids = [layout(dtype, lk.fmt) for dtype, lk in zip(id_types, lookups)]
        weights = [layout(tf.float32, lk.fmt) for lk in lookups] if weighted else None
        cots = [tf.TensorSpec([None, b.spec.dim], tf.float32) for b in self.built]
        return [ids, weights, cots]

    def __call__(self, ids: list, weights: list | None, cots: list[tf.Tensor]) -> tuple[list, list]:
        embs, grads = self._step(ids, weights, cots)
        return [e.numpy() for e in embs], grads

    def op_types(self) -> list[str]:
        """The types of the ops of the traced step (mode ``"function"``)."""
        return [op.type for op in self._step.get_concrete_function().graph.get_operations()]


def compare_with_tf(
    comm: Comm,
    built: list[Built],
    lookups: list[Lookup],
    weighted: bool,
    mode: str,
    seed: int,
    m: Mismatches,
    label: str,
    lr: float | None = None,
    step: SokStep | None = None,
) -> None:
    """Forward and gradients of one ``sok.lookup_sparse`` call against the TensorFlow oracle; with
    ``lr`` (or a training ``step``), one training step too: the new rows must be
    full - lr * (TF gradient summed over ranks), and become the tables' full values."""
    step = step or SokStep(built, lookups, weighted, mode, lr)
    lr = step.lr
    cots = cotangents(built, lookups, comm, seed)
    ids, weights = sok_inputs(built, lookups, weighted)
    tables = step.tables
    sizes_before = {id(b.var): int(b.var.size[0]) for b in tables if b.dynamic}
    embs, grads = step(ids, weights, cots)
    want, want_grads = tf_forward_and_grads(built, lookups, weighted, cots, comm)
    for t, (b, lk) in enumerate(zip(built, lookups)):
        what = f"{label} lookup {t} ({b.spec.kind} {b.spec.rows}x{b.spec.dim}, {lk.combiner}, {lk.fmt})"
        m.close(f"{what} forward", embs[t], want[t])
    for b, g in zip(tables, grads):
        what = f"{label} {b.spec.kind} {b.spec.rows}x{b.spec.dim}"
        got = sok_grad_to_global(b, g, comm, m, f"{what} gradient")
        mine = b.owner == comm.rank
        m.close(f"{what} gradient (rows owned by rank {comm.rank})", got[mine], want_grads[id(b.var)][mine])
        if b.dynamic:  # lookups must not insert keys on ranks that do not own them
            m.equal(f"{what}: rows in the local shard after the lookup", int(b.var.size[0]), sizes_before[id(b.var)])
        if lr is None:
            continue
        new = b.full - lr * want_grads[id(b.var)]
        if b.spec.kind == "distributed":
            m.close(f"{what} after one SGD step", b.var.numpy(), new[comm.rank :: comm.n])
        elif b.spec.kind == "localized":
            m.close(f"{what} after one SGD step", b.var.numpy(), new if mine.all() else np.zeros((0, b.spec.dim)))
        elif mine.any():
            rows = tf.nn.embedding_lookup(b.var, tf.constant(b.keys[mine])).numpy()
            m.close(f"{what} after one OptimizerWrapper(SGD) step", rows, new[mine])
        b.full = new.astype(np.float32)


# -- checks ----------------------------------------------------------------------------------------

#: name -> check; run in this order by the worker. PRE_INIT checks run before sok.init().
CHECKS: dict[str, Callable[[Comm], None]] = {}
PRE_INIT: set[str] = set()


def check(name: str, pre_init: bool = False) -> Callable:
    def register(fn: Callable[[Comm], None]) -> Callable[[Comm], None]:
        CHECKS[name] = fn
        if pre_init:
            PRE_INIT.add(name)
        return fn

    return register


@check("init_warns_about_unknown_comm_tool", pre_init=True)
def check_init_unknown(comm: Comm) -> None:
    """As NVIDIA SOK, an unknown tool is no error: a warning, then Horovod where it is initialised
    (under horovodrun), else a single process."""
    expected = "horovod" if communication._horovod_initialized() else "single"
    try:
        sok.init("nope")
        assert communication._tool is not None and communication._tool.name == expected, communication._tool
        assert sok.num_ranks() == comm.n, (sok.num_ranks(), comm.n)
    finally:
        communication._tool = None  # the checks after this one call sok.init() themselves


@check("lookup_without_init", pre_init=True)
def check_without_init(comm: Comm) -> None:
    """Several Horovod ranks and no sok.init(): a clear error on every rank, not a silent local
    lookup; one process works without sok.init()."""

    def lookup():
        v = sok.Variable(np.arange(12).reshape(4, 3), dtype=tf.float32)
        return sok.lookup_sparse([v], [tf.ragged.constant([[1]], dtype=tf.int64)], combiners=["sum"])

    if comm.n > 1:
        _expect_error(comm, lookup, RuntimeError, r"sok\.init\(\) was not called")
    else:
        np.testing.assert_array_equal(lookup()[0].numpy(), [[3, 4, 5]])


@check("init_twice_raises")
def check_init_twice(comm: Comm) -> None:
    tool = communication._tool
    _expect_error(comm, lambda: sok.init(), RuntimeError, r"already called")
    _expect_error(comm, lambda: sok.init("nope"), RuntimeError, r"already called")
    assert communication._tool is tool, "a second sok.init() replaced the tool"
    assert (sok.rank(), sok.num_ranks()) == (comm.rank, comm.n)


SEED_TABLE1 = np.arange(17 * 3).reshape(17, 3)
SEED_TABLE2 = np.arange(7 * 5).reshape(7, 5)
SEED_IDS1 = [[1, 1], [3, 4, 5]]
SEED_IDS2 = [[1], [2, 3]]
SEED_SUM = ([[6, 8, 10], [36, 39, 42]], [[5, 6, 7, 8, 9], [25, 27, 29, 31, 33]])
SEED_MEAN = ([[3, 4, 5], [12, 13, 14]], [[5, 6, 7, 8, 9], [12.5, 13.5, 14.5, 15.5, 16.5]])


def _seed_inputs(fmt: str) -> list:
    ragged = [tf.ragged.constant(SEED_IDS1, dtype=tf.int64), tf.ragged.constant(SEED_IDS2, dtype=tf.int64)]
    return [r.to_sparse() for r in ragged] if fmt == "sparse" else ragged


@check("seed_example")
def check_seed_example(comm: Comm) -> None:
    """The docstring example (reference §1.5), the same batch on every rank: sum and mean, ragged and
    sparse, eager and tf.function, sok and sok.experiment (hotness [3, 2]); combiners=None is mean;
    combiner names are case-insensitive and "average" is mean."""
    m = Mismatches()
    v1 = sok.Variable(SEED_TABLE1, dtype=tf.float32)
    v2 = sok.Variable(SEED_TABLE2, dtype=tf.float32)
    calls = {
        "sum": lambda ids: sok.lookup_sparse([v1, v2], ids, combiners=["sum", "sum"]),
        "SUM/Sum": lambda ids: sok.lookup_sparse([v1, v2], ids, combiners=["SUM", "Sum"]),
        "mean": lambda ids: sok.lookup_sparse([v1, v2], ids, combiners=["mean", "mean"]),
        "None (mean)": lambda ids: sok.lookup_sparse([v1, v2], ids),
        "average/Mean": lambda ids: sok.lookup_sparse([v1, v2], ids, combiners=["average", "Mean"]),
        "experiment sum": lambda ids: sok_experiment.lookup_sparse(
            [v1, v2], ids, hotness=[3, 2], combiners=["sum"] * 2
        ),
        "tuple sum": lambda ids: sok.lookup_sparse((v1, v2), tuple(ids), combiners=("sum", "sum")),
    }
    # Every call eagerly in both formats; one in a tf.function too (tracing takes seconds).
    in_function = {("experiment sum", "sparse")}
    for name, call in calls.items():
        expected = SEED_SUM if "sum" in name.lower() else SEED_MEAN
        for fmt in FORMATS:
            for mode in MODES:
                if mode == "function" and (name, fmt) not in in_function:
                    continue
                fn = tf.function(call) if mode == "function" else call
                out = fn(_seed_inputs(fmt))
                m.true(f"{name} {fmt} {mode}: returned {type(out).__name__}, not a list", isinstance(out, list))
                for i in range(2):
                    m.close(f"{name} {fmt} {mode} emb{i + 1}", out[i], expected[i], rtol=0, atol=1e-6)
    single = sok.lookup_sparse(v1, _seed_inputs("ragged")[0], combiners="sum")
    m.true(f"one table without lists: returned {type(single).__name__}", isinstance(single, tf.Tensor))
    m.close("one table without lists", single, SEED_SUM[0], rtol=0, atol=1e-6)
    m.raise_if_any()


@check("seed_example_gradient_and_sgd")
def check_seed_gradient(comm: Comm) -> None:
    """Reference §2.8: the seed batch on every rank, loss = sum(emb1); gradients summed over the
    global batch (key 1: 2n, keys 3, 4, 5: n; mean: key 1: n, keys 3..5: n/3), as local rows on
    the owner; SGD lr=1 moves global row 1 to [3, 4, 5] - 2n."""
    m = Mismatches()
    n = comm.n
    for combiner, per_key in (("sum", {1: 2.0 * n, 3: n, 4: n, 5: n}), ("mean", {1: n, 3: n / 3, 4: n / 3, 5: n / 3})):
        v1 = sok.Variable(SEED_TABLE1, dtype=tf.float32)
        with tf.GradientTape() as tape:
            emb1 = sok.lookup_sparse([v1], [_seed_inputs("ragged")[0]], combiners=[combiner])[0]
            loss = tf.reduce_sum(emb1)
        (grad,) = tape.gradient(loss, [v1])
        indices = np.asarray(grad.indices)
        summed: dict[int, np.ndarray] = {}
        for i, row in zip(indices, np.asarray(grad.values)):
            summed[int(i)] = summed.get(int(i), 0) + row
        want = {k // n: np.full(3, g) for k, g in per_key.items() if k % n == comm.rank}
        m.equal(f"{combiner}: local rows with a gradient", sorted(summed), sorted(want))
        for row in set(summed) & set(want):
            m.close(f"{combiner}: gradient of local row {row}", summed[row], want[row])
        if combiner == "sum":
            tf.keras.optimizers.SGD(learning_rate=1.0).apply_gradients([(grad, v1)])
            new = SEED_TABLE1.astype(np.float32).copy()
            for k, g in per_key.items():
                new[k] -= g
            m.close("SGD lr=1 shard", v1.numpy(), new[comm.rank :: n])
            if comm.rank == 1 % n:
                m.close("SGD lr=1: global row 1", v1.numpy()[1 // n], [3 - 2 * n, 4 - 2 * n, 5 - 2 * n])
    m.raise_if_any()


@check("variable_sharding")
def check_variable_sharding(comm: Comm) -> None:
    """Reference §1.2: row i on rank i % n at local row i // n (4x3 arange at np 2: rank 0
    [[0,1,2],[6,7,8]], rank 1 [[3,4,5],[9,10,11]]); localized:N is [5, 3] on N and [0, 3] elsewhere."""
    m = Mismatches()
    table = np.arange(12).reshape(4, 3)
    v = sok.Variable(table, dtype=tf.float32)
    m.close("4x3 shard", v.numpy(), table[comm.rank :: comm.n])
    if comm.n == 2:
        m.close("4x3 shard at np 2", v.numpy(), [[[0, 1, 2], [6, 7, 8]], [[3, 4, 5], [9, 10, 11]]][comm.rank])
    m.equal("global_shape", tuple(v.global_shape.as_list()), (4, 3))
    m.equal("target_gpu", v.target_gpu, -1)
    m.equal("num_gpus", v.num_gpus, comm.n)
    m.equal("global_gpu_id", v.global_gpu_id, comm.rank)
    m.equal("dtype", v.dtype, tf.float32)
    odd = sok.Variable(np.arange(10).reshape(5, 2), dtype=tf.float32, mode="distributed")
    m.close("5x2 shard (uneven)", odd.numpy(), np.arange(10).reshape(5, 2)[comm.rank :: comm.n])
    for target in range(comm.n):
        loc = sok.Variable(np.arange(15).reshape(5, 3), dtype=tf.float32, mode=f"localized:{target}")
        shape = (5, 3) if comm.rank == target else (0, 3)
        m.equal(f"localized:{target} shard shape", tuple(loc.shape.as_list()), shape)
        if comm.rank == target:
            m.close(f"localized:{target} shard", loc.numpy(), np.arange(15).reshape(5, 3))
        m.equal(f"localized:{target} target_gpu", loc.target_gpu, target)
        m.equal(f"localized:{target} global_shape", tuple(loc.global_shape.as_list()), (5, 3))
    m.raise_if_any()


def _oracle_check(mode: str, fmt: str, weighted: bool, shift: int, lr: float | None = None) -> Callable:
    def run(comm: Comm) -> None:
        """Every kind of table in one call (MIXED) against tf.nn.embedding_lookup_sparse; lookup t
        uses COMBINERS[(t + shift) % 3]; with ``lr``, one training step too."""
        m = Mismatches()
        seed = 100 * shift + 7 * len(fmt) + weighted + (lr is not None)
        built = build_tables(MIXED, comm, seed)
        lookups = make_lookups(built, comm, seed, shift=shift, fmt=fmt)
        compare_with_tf(comm, built, lookups, weighted, mode, seed, m, f"{mode} {fmt}", lr=lr)
        m.raise_if_any()

    return run


# Eager: each format with and without weights; over the four calls every lookup sees every combiner.
for _i, (_fmt, _weighted) in enumerate((("ragged", False), ("ragged", True), ("sparse", False), ("sparse", True))):
    CHECKS[f"oracle-eager-{_fmt}-{'weighted' if _weighted else 'unweighted'}"] = _oracle_check(
        "eager", _fmt, _weighted, shift=_i % 3
    )
CHECKS["oracle-train_step-eager"] = _oracle_check("eager", "ragged", True, shift=1, lr=0.5)


def _key_type_check(key_type: tf.DType, id_dtype: tf.DType) -> Callable[[Comm], None]:
    def run(comm: Comm) -> None:
        """Dynamic tables (hbm and hybrid) of one key_type looked up with ids of one dtype: the
        same rows and gradients as TensorFlow (reference §1.5: keys are cast to the key_type)."""
        m = Mismatches()
        specs = (
            Table("dynamic", 11, 4, var_type="hbm", key_type=key_type, id_dtype=id_dtype),
            Table("dynamic", 9, 2, var_type="hybrid", key_type=key_type, id_dtype=id_dtype),
        )
        built = build_tables(specs, comm, seed=800)
        lookups = make_lookups(built, comm, 800, shift=0)
        compare_with_tf(comm, built, lookups, True, "eager", 800, m, f"key_type {key_type.name}, ids {id_dtype.name}")
        m.raise_if_any()

    return run


CHECKS["dynamic-key_type-int64-int32-ids"] = _key_type_check(tf.int64, tf.int32)
CHECKS["dynamic-key_type-int32"] = _key_type_check(tf.int32, tf.int32)
CHECKS["dynamic-key_type-int32-int64-ids"] = _key_type_check(tf.int32, tf.int64)
CHECKS["dynamic-key_type-uint64"] = _key_type_check(tf.uint64, tf.uint64)

#: A smaller call for the batch edge cases: one table of each kind and a repeated table.
SMALL = (
    Table("distributed", 37, 16),
    Table("localized", 9, 1, target=-1),
    Table("dynamic", 13, 3, var_type="hybrid"),
    Table("same", same_as=0),
    Table("dynamic", 7, 16, var_type="hbm", target=0),
)


def _edge_lengths(case: str) -> Callable[[np.random.Generator, int, int, int], np.ndarray]:
    def lengths(rng: np.random.Generator, rank: int, n: int, t: int) -> np.ndarray:
        if case == "empty-last-rank":  # the last rank has no samples at all
            return np.zeros(0, np.int64) if rank == n - 1 else rng.integers(0, 4, 3 + rank)
        if case == "no-ids":  # samples, but no ids in even lookups; only rank 0 has ids in odd ones
            return np.zeros(2 + rank, np.int64) if t % 2 == 0 or rank > 0 else rng.integers(1, 4, 2)
        # "hot": a sample of 40 ids next to empty ones; the batch size depends on the rank only
        return np.roll(np.array([40, 0, 1], np.int64)[: 1 + rank % 3], t)

    return lengths


EDGE_CASES = ("empty-last-rank", "no-ids", "hot")


@check("oracle-edge-batches")
def check_edge_batches(comm: Comm) -> None:
    """Batches that stress the exchange, eagerly: a rank with no samples, lookups without ids,
    long samples; ragged and sparse in one call, unweighted and weighted."""
    m = Mismatches()
    for c, case in enumerate(EDGE_CASES):
        seed = 500 + c
        built = build_tables(SMALL, comm, seed)
        lookups = make_lookups(built, comm, seed, shift=c, fmt="mixed", lengths_fn=_edge_lengths(case))
        compare_with_tf(comm, built, lookups, c % 2 == 1, "eager", seed, m, f"{case} eager")
    m.raise_if_any()


@check("oracle-train_steps-function")
def check_function_steps(comm: Comm) -> None:
    """One tf.function (input signature of any batch size: one trace) trains SMALL for four steps
    on different batches (the default ones, then each edge case); forward, gradients and new rows
    match TensorFlow at every step, weighted, ragged and sparse in one call; the optimizer reuses
    the lookup's distinct keys."""
    m = Mismatches()
    seed = 600
    built = build_tables(SMALL, comm, seed)
    lookups = make_lookups(built, comm, seed, shift=2, fmt="mixed")
    step = SokStep(built, lookups, weighted=True, mode="function", lr=0.5)
    for i, case in enumerate(("default", *EDGE_CASES)):
        lengths = default_lengths if case == "default" else _edge_lengths(case)
        lookups = make_lookups(built, comm, seed + i, shift=2, fmt="mixed", lengths_fn=lengths)
        compare_with_tf(comm, built, lookups, True, "function", seed + i, m, f"step {i} ({case})", step=step)
    # The lookup indexes the keys of all dynamic tables in one SokUniqueIndexList (the tables are on
    # one device), and the optimizer's SokSparseApply of each indexes no keys again: the distinct
    # keys are their own index, handed over by the gradient.
    ops = step.op_types()
    dynamic = [b for b in step.tables if b.dynamic]
    m.equal("SokSparseApply ops of the step (one per dynamic table)", ops.count("SokSparseApply"), len(dynamic))
    m.equal("SokUniqueIndexList ops of the step", ops.count("SokUniqueIndexList"), 1 if dynamic else 0)
    m.equal("SokUniqueIndex ops of the step", ops.count("SokUniqueIndex"), 0)
    m.raise_if_any()


#: More tables in one call than its record counts per table (RECORD_TABLES): the received ids are
#: split by the device's counts (every other check has fewer, split by counts from the records).
MANY_TABLES = tuple(
    Table("localized", 6, 2, target=t % 2) if t % 3 == 0 else Table("distributed", 5 + t % 4, 2)
    for t in range(RECORD_TABLES + 2)
)


@check("many_tables")
def check_many_tables(comm: Comm) -> None:
    """A weighted call of RECORD_TABLES + 2 tables against TensorFlow, eagerly."""
    m = Mismatches()
    built = build_tables(MANY_TABLES, comm, 950)
    lookups = make_lookups(built, comm, 950, shift=1, fmt="ragged")
    compare_with_tf(comm, built, lookups, True, "eager", 950, m, f"{len(MANY_TABLES)} tables")
    m.raise_if_any()


@check("half-rows-and-their-row-wise-step")
def check_half_rows(comm: Comm) -> None:
    """float16 and bfloat16 tables (distributed and localized) in one call with a float32 table, on
    every rank: lookups and gradients equal to the bit those of float32 tables of the same values,
    and a sok.RowWiseAdagrad step in a tf.function leaves each half table equal to the float32
    table's step rounded to its dtype (the step is float32 either way)."""
    m = Mismatches()
    rng = np.random.default_rng(970)
    shapes, dtypes = [(23, 4), (17, 8), (9, 4)], ["bfloat16", "float16", "float32"]
    modes = ["distributed", "localized:1" if comm.n > 1 else None, "distributed"]
    values = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    half = [sok.Variable(v, dtype=d, mode=mode) for v, d, mode in zip(values, dtypes, modes)]
    full = [sok.Variable(tf.cast(tf.cast(v, d), tf.float32), mode=mode) for v, d, mode in zip(values, dtypes, modes)]
    lengths = rng.integers(0, 5, (3, 6 + comm.rank))
    ids = [tf.RaggedTensor.from_row_lengths(rng.integers(0, rows, n.sum()), n) for (rows, _), n in zip(shapes, lengths)]

    def train(tables: list) -> tuple[list, list]:
        """One step of a tf.function of its own (each makes its optimizer's variables)."""
        optimizer = sok.OptimizerWrapper(sok.RowWiseAdagrad(learning_rate=0.1))

        @tf.function
        def step() -> tuple[list, list]:
            with tf.GradientTape() as tape:
                out = sok.lookup_sparse(tables, ids, combiners=["sum", "mean", "sqrtn"])
                loss = tf.add_n([tf.reduce_sum(o * o) for o in out])
            grads = tape.gradient(loss, tables)
            optimizer.apply_gradients(zip(grads, tables))
            return out, [tf.convert_to_tensor(g) for g in grads]

        return step()

    (out_half, grads_half), (out_full, grads_full) = train(half), train(full)
    for t, d in enumerate(dtypes):
        m.close(f"{d} table: pooled", out_half[t].numpy(), out_full[t].numpy(), rtol=0, atol=0)
        m.close(f"{d} table: gradient", grads_half[t].numpy(), grads_full[t].numpy(), rtol=0, atol=0)
        rounded = tf.cast(tf.cast(full[t], d), tf.float32).numpy()
        m.close(f"{d} table: after the step", tf.cast(half[t], tf.float32).numpy(), rounded, rtol=0, atol=0)
    m.raise_if_any()


@check("all2all_dense_embedding")
def check_all2all(comm: Comm) -> None:
    """Rows of a distributed table and of a dynamic table for per-rank different 1-D ids (different
    lengths, duplicates, no ids on the last rank), and their gradients, eager (all) and in a
    tf.function (one per table kind)."""
    m = Mismatches()
    for mode in MODES:
        for t, spec in enumerate((Table("distributed", 29, 8), Table("dynamic", 17, 4, var_type="hybrid"))):
            for empty_last in (False, True) if mode == "eager" else (t == 1,):
                seed = 700 + 10 * t + 2 * MODES.index(mode) + empty_last
                (b,) = build_tables((spec,), comm, seed)
                rng = np.random.default_rng([seed, comm.rank])
                count = 0 if empty_last and comm.rank == comm.n - 1 else 5 + 3 * comm.rank
                rows = rng.integers(0, spec.rows, count).astype(np.int64)
                rows[:2] = rows[0] if count >= 2 else rows[:2]  # a duplicate
                ids = tf.constant(b.keys[rows] if b.dynamic else rows, tf.int64)
                cot = tf.constant(rng.normal(size=(count, spec.dim)).astype(np.float32))

                def step(ids, cot, var=b.var):
                    with tf.GradientTape() as tape:
                        out = sok.all2all_dense_embedding(var, ids)
                        loss = tf.reduce_sum(out * cot)
                    return out, tape.gradient(loss, [var])[0]

                out, grad = (tf.function(step) if mode == "function" else step)(ids, cot)
                label = f"{mode} {spec.kind}{' (no ids on the last rank)' if empty_last else ''}"
                m.close(f"{label} rows", out.numpy(), b.full[rows])
                want = np.zeros_like(b.full)
                np.add.at(want, rows, cot.numpy())
                want = comm.allreduce_sum(want)
                got = sok_grad_to_global(b, grad, comm, m, f"{label} gradient")
                mine = b.owner == comm.rank
                m.close(f"{label} gradient (owned rows)", got[mine], want[mine])
    m.raise_if_any()


# -- weights whose sum is not positive; the low-frequency filter ---------------------------------


def signed_weights(lookups: list[Lookup], seed: int, comm: Comm) -> None:
    """Replaces the weights of ``lookups`` by multiples of 1/4 (sums exact in any order) whose
    per-sample sum is, by sample: negative (all weights negative), 0, negative (mixed signs), and
    positive (mixed signs when it can)."""
    for t, lk in enumerate(lookups):
        rng = np.random.default_rng([seed, 3000 + comm.rank, t])
        weights = []
        for s, length in enumerate(lk.lengths):
            w = rng.integers(1, 8, int(length)).astype(np.float32) * 0.25
            if length and s % 4 == 0:
                w = -w
            elif length and s % 4 == 1:
                w[-1] = -w[:-1].sum() if length > 1 else 0.0
            elif length and s % 4 == 2:
                w[0] = -(w[1:].sum() + 0.25 * (1 + s))
            elif length > 1:
                w[0] = -w[0]
                w[-1] = abs(w).sum()
            weights.append(w)
        lk.weights = np.concatenate(weights + [np.zeros(0, np.float32)]).astype(np.float32)


@check("oracle-weights-summing-to-0-or-less")
def check_signed_weights(comm: Comm) -> None:
    """Every kind of table (MIXED), weighted, each sample's weights summing to a negative number, 0
    or a positive one: the same rows and gradients as tf.nn.embedding_lookup_sparse (``mean``
    divides by a negative sum; only a sum of 0 gives zeros), eagerly with the static and dynamic
    tables' ``mean`` on one set of tables and in a tf.function on the other."""
    m = Mismatches()
    for mode, shift in (("eager", 0), ("function", 1)):
        seed = 850 + shift
        built = build_tables(MIXED, comm, seed)
        lookups = make_lookups(built, comm, seed, shift=shift, fmt="mixed")
        signed_weights(lookups, seed, comm)
        compare_with_tf(comm, built, lookups, True, mode, seed, m, f"signed weights {mode}")
    m.raise_if_any()


#: Dynamic tables of every var_type and placement that admit no new key, and a static table (the
#: filter leaves it alone).
FILTERED = (
    Table("dynamic", 11, 4, var_type="hbm", filter_ratio=0.0),
    Table("dynamic", 9, 3, var_type="hybrid", filter_ratio=0.0),
    Table("dynamic", 7, 2, var_type="hbm", target=-1, filter_ratio=0.0),
    Table("distributed", 13, 4),
)


@check("low_frequency_filter-ratio-0")
def check_low_frequency_filter(comm: Comm) -> None:
    """``use_low_frequency_filter=True`` with ``filter_ratio=0``: each rank's batch mixes keys the
    tables hold with new keys (a third of the ids); the new ones are not inserted on any rank, add
    nothing and get no gradient, yet count in the divisor of ``mean``: the oracle is
    tf.nn.embedding_lookup_sparse on the full tables with zero rows for the new keys. Eager and
    in a tf.function, weighted."""
    m = Mismatches()
    for mode in MODES:
        seed = 870 + MODES.index(mode)
        built = build_tables(FILTERED, comm, seed)
        extended = []  # each table with its new keys as zero rows (dynamic tables)
        for b in built:
            if not b.dynamic:
                extended.append(b)
                continue
            new = b.keys.max() + 1 + 3 * np.arange(b.spec.rows // 2 + 1, dtype=np.int64)
            full = np.concatenate([b.full, np.zeros((new.size, b.spec.dim), np.float32)])
            owner = np.concatenate(
                [b.owner, np.mod(new, comm.n) if b.spec.target is None else b.owner[:1].repeat(new.size)]
            )
            spec = Table("dynamic", full.shape[0], b.spec.dim, target=b.spec.target, var_type=b.spec.var_type)
            extended.append(Built(spec, full, b.var, owner, np.concatenate([b.keys, new])))
        lookups = make_lookups(extended, comm, seed, shift=1)
        signed_weights(lookups, seed, comm)
        ids, weights = sok_inputs(extended, lookups, True)
        cots = cotangents(extended, lookups, comm, seed)
        params = [b.var for b in extended]
        combiners = [lk.combiner for lk in lookups]
        sizes_before = [int(b.var.size[0]) if b.dynamic else 0 for b in built]

        def step(ids, weights, cots, params=params, combiners=combiners):
            with tf.GradientTape() as tape:
                embs = sok.lookup_sparse(params, ids, weights, combiners, use_low_frequency_filter=True)
                loss = tf.add_n([tf.reduce_sum(e * c) for e, c in zip(embs, cots)])
            return embs, tape.gradient(loss, params)

        embs, grads = (tf.function(step) if mode == "function" else step)(ids, weights, cots)
        want, want_grads = tf_forward_and_grads(extended, lookups, True, cots, comm)
        for t, (b, old, lk) in enumerate(zip(extended, built, lookups)):
            what = f"{mode} lookup {t} ({b.spec.kind}, {b.spec.var_type}, {lk.combiner})"
            m.close(f"{what} forward", embs[t].numpy(), want[t])
            got = sok_grad_to_global(b, grads[t], comm, m, f"{what} gradient")
            known = np.arange(b.full.shape[0]) < old.full.shape[0]
            mine = (b.owner == comm.rank) & known
            m.close(f"{what} gradient (known rows of rank {comm.rank})", got[mine], want_grads[id(b.var)][mine])
            if b.dynamic:
                indices = np.asarray(tf.convert_to_tensor(grads[t].indices)).reshape(-1)
                dropped = np.intersect1d(indices, b.keys[~known])
                m.true(f"{what}: dropped keys got a gradient: {dropped[:5].tolist()}", dropped.size == 0)
                m.equal(f"{what}: rows in the local shard after the lookup", int(b.var.size[0]), sizes_before[t])
    m.raise_if_any()


# -- errors: the same on every rank, and the ranks stay in step -----------------------------------


#: What this rank last got from a call that should raise (the worker prints it if a check hangs).
NOTES: list[str] = []


def _clean(message: str) -> str:
    """The message on one line, without what differs between eager and graph errors (function
    names, the traceback of the op that raised): for assertions, the assertion's own text."""
    found = re.search(r"assertion failed: ([^\n]*)", message)
    if found:
        message = found.group(1)
    message = re.sub(r"\{\{[^}]*\}\}", "", message)
    return " ".join(message.split())


def _names(error: type | tuple) -> str:
    return " or ".join(e.__name__ for e in (error if isinstance(error, tuple) else (error,)))


def _expect_error(comm: Comm, fn: Callable[[], Any], error: type, pattern: str) -> None:
    """fn raises ``error`` (a class or a tuple of them) with a message matching ``pattern`` on this
    rank, and the same error on every rank (raises AssertionError otherwise, after the comparison)."""
    NOTES.append(f"rank {comm.rank} is in the call")
    try:
        fn()
        outcome = ("no error", "")
    except Exception as caught:  # noqa: BLE001 - the outcome is what is compared
        outcome = (type(caught).__name__, _clean(str(caught)), isinstance(caught, error))
    NOTES[-1] = f"rank {comm.rank} got {outcome[0]}: {outcome[1][:200]!r}"
    everyone = comm.allgather_object(outcome, name="expect_error")
    problems = []
    if outcome[0] == "no error":
        problems.append(f"rank {comm.rank}: no error, expected {_names(error)} matching {pattern!r}")
    elif not outcome[2] or not re.search(pattern, outcome[1]):
        problems.append(
            f"rank {comm.rank}: {outcome[0]}: {outcome[1][:600]!r}, expected {_names(error)} matching {pattern!r}"
        )
    if any(o[:2] != everyone[0][:2] for o in everyone):
        problems.append(f"the ranks disagree: {[(o[0], o[1][:300]) for o in everyone]}")
    if problems:
        raise AssertionError("; ".join(problems))


def _still_in_step(comm: Comm, m: Mismatches, label: str) -> None:
    """A valid lookup after an error returns the right rows on every rank."""
    v = sok.Variable(SEED_TABLE1, dtype=tf.float32)
    out = sok.lookup_sparse([v], [_seed_inputs("ragged")[0]], combiners=["sum"])[0]
    m.close(f"valid lookup after {label}", out, SEED_SUM[0], rtol=0, atol=1e-6)


def _bad_ids(rows: int, comm: Comm, bad: int, bad_rank: int) -> tf.RaggedTensor:
    good = [[0, rows - 1], [1 % rows]]
    if comm.rank == bad_rank % comm.n:
        good = [[0, bad], [1 % rows]]
    return tf.ragged.constant(good, dtype=tf.int64)


@check("error-static-ids-out-of-range")
def check_bad_ids(comm: Comm) -> None:
    """An id >= rows or < 0 on ONE rank fails on every rank with the same message (the library
    allreduces a count of bad ids first), eager and tf.function, distributed and localized; the
    message names the bad lookup (sp_ids[2] behind a dynamic table); the ranks stay in step."""
    m = Mismatches()
    cases = [
        ("eager", "distributed", (17, 0)),
        ("eager", "distributed", (-1, -1)),
        ("eager", "localized:0", (1000, -1)),
        ("eager", "localized:0", (-2, 0)),
        ("function", "distributed", (-1, -1)),
    ]
    for mode, kind, (bad, bad_rank) in cases:
        label = f"{mode} {kind} id {bad} on rank {bad_rank % comm.n}"
        dyn = sok.DynamicVariable(dimension=3, initializer=0.0)
        ok = sok.Variable(SEED_TABLE1, dtype=tf.float32)
        v = sok.Variable(SEED_TABLE1, dtype=tf.float32, mode=None if kind == "distributed" else kind)
        ids = [
            tf.ragged.constant([[2**40], [-3]], dtype=tf.int64),
            tf.ragged.constant([[1], []], dtype=tf.int64),
            _bad_ids(17, comm, bad, bad_rank),
        ]

        def call(ids=ids, params=(dyn, ok, v)):
            return sok.lookup_sparse(list(params), ids, combiners=["sum"] * 3)

        fn = tf.function(call) if mode == "function" else call
        try:
            _expect_error(comm, fn, tf.errors.InvalidArgumentError, r"sp_ids\[2\] has ids outside \[0, 17\)")
        except AssertionError as failed:
            m.found.append(f"{label}: {failed}")
        _still_in_step(comm, m, label)
    m.raise_if_any()


@check("error-arguments")
def check_argument_errors(comm: Comm) -> None:
    """Argument errors raise before any collective, the same on every rank: mismatched list lengths,
    unknown combiners, float ids, a plain tf.Variable, float64 weights, batch sizes that differ
    between the lookups of one call, localized:N with N >= world size, a bad mode."""
    m = Mismatches()
    v = sok.Variable(SEED_TABLE1, dtype=tf.float32)
    w = sok.Variable(SEED_TABLE2, dtype=tf.float32)
    ids1, ids2 = _seed_inputs("ragged")
    weights1 = tf.ragged.constant([[1.0, 1.0], [1.0, 1.0, 1.0]], dtype=tf.float32)
    float_ids = tf.ragged.constant([[1.0], [2.0]], dtype=tf.float32)
    cases = [
        ("more params than ids", lambda: sok.lookup_sparse([v, w], [ids1]), ValueError, r"2 tables but sp_ids has 1"),
        (
            "more ids than params",
            lambda: sok.lookup_sparse([v], [ids1, ids2]),
            ValueError,
            r"1 tables but sp_ids has 2",
        ),
        (
            "weights list too short",
            lambda: sok.lookup_sparse([v, w], [ids1, ids2], [weights1]),
            ValueError,
            r"sp_weights has 1 entries",
        ),
        (
            "combiners list too short",
            lambda: sok.lookup_sparse([v, w], [ids1, ids2], combiners=["sum"]),
            ValueError,
            r"combiners has 1 entries",
        ),
        (
            "unknown combiner",
            lambda: sok.lookup_sparse([v, w], [ids1, ids2], combiners=["sum", "max"]),
            ValueError,
            r"combiners\[1\] = 'max' is not valid",
        ),
        ("float ids", lambda: sok.lookup_sparse([v], [float_ids]), TypeError, r"ids must be int32 or int64"),
        (
            "plain tf.Variable",
            lambda: sok.lookup_sparse([tf.Variable(SEED_TABLE1.astype(np.float32))], [ids1]),
            TypeError,
            r"must be a sok\.Variable or sok\.DynamicVariable",
        ),
        (
            "float64 weights",
            lambda: sok.lookup_sparse([v], [ids1], [tf.cast(weights1, tf.float64)]),
            TypeError,
            r"weights must be float32",
        ),
        (
            "weights with other row lengths than the ids",
            lambda: sok.lookup_sparse([v], [ids1], [tf.ragged.constant([[1.0], [1.0, 1.0, 1.0]])], combiners=["sum"]),
            (ValueError, tf.errors.InvalidArgumentError),
            r".",
        ),
        (
            "dense ids",
            lambda: sok.lookup_sparse([v], [tf.constant([[1, 2]], tf.int64)]),
            TypeError,
            r"SparseTensor or tf\.RaggedTensor",
        ),
        (
            "different batch sizes in one call",
            lambda: sok.lookup_sparse([v, w], [ids1, tf.ragged.constant([[1]], dtype=tf.int64)]),
            ValueError,
            r"same batch size",
        ),
        (
            f"localized:{comm.n} (= world size)",
            lambda: sok.Variable(SEED_TABLE1, dtype=tf.float32, mode=f"localized:{comm.n}"),
            ValueError,
            rf"names rank {comm.n}, but there are only {comm.n} rank",
        ),
        (
            "bare 'localized' mode",
            lambda: sok.Variable(SEED_TABLE1, dtype=tf.float32, mode="localized"),
            ValueError,
            "not valid",
        ),
        (
            "experiment hotness list too short",
            lambda: sok_experiment.lookup_sparse([v, w], [ids1, ids2], hotness=[3], combiners=["sum"] * 2),
            ValueError,
            r"hotness has 1 entries",
        ),
    ]
    for label, fn, error, pattern in cases:
        try:
            _expect_error(comm, fn, error, pattern)
        except AssertionError as failed:
            m.found.append(f"{label}: {failed}")
    _still_in_step(comm, m, "argument errors")
    m.raise_if_any()


@check("error-dynamic-localized-rank-out-of-range")
def check_dynamic_localized_out_of_range(comm: Comm) -> None:
    """A DynamicVariable with mode localized:N, N >= world size, is refused (at creation or at the
    lookup) on every rank, as sok.Variable is, instead of pooling to zeros."""

    def create_and_look_up():
        v = sok.DynamicVariable(dimension=2, initializer=1.0, mode=f"localized:{comm.n}")
        return sok.lookup_sparse([v], [tf.ragged.constant([[1, 2], [3]], dtype=tf.int64)], combiners=["sum"])

    _expect_error(comm, create_and_look_up, (ValueError, tf.errors.InvalidArgumentError), rf"localized:{comm.n}|rank")


@check("error-hotness-exceeded-on-every-rank")
def check_hotness_everywhere(comm: Comm) -> None:
    """sok.experiment.lookup_sparse: a sample longer than hotness on every rank fails everywhere, with
    the lookup's index (eager: the second of two tables; tf.function: one table)."""
    m = Mismatches()
    v1 = sok.Variable(SEED_TABLE1, dtype=tf.float32)
    v2 = sok.Variable(SEED_TABLE2, dtype=tf.float32)

    def eager():
        return sok_experiment.lookup_sparse([v1, v2], _seed_inputs("ragged"), hotness=[3, 1], combiners=["sum"] * 2)

    @tf.function
    def graph(ids):
        return sok_experiment.lookup_sparse([v1], ids, hotness=[2], combiners=["sum"])

    for label, fn, pattern in (
        ("eager", eager, r"sp_ids\[1\] has a sample with more ids than hotness\[1\] = 1"),
        (
            "function",
            lambda: graph(_seed_inputs("sparse")[:1]),
            r"sp_ids\[0\] has a sample with more ids than hotness\[0\] = 2",
        ),
    ):
        try:
            _expect_error(comm, fn, tf.errors.InvalidArgumentError, pattern)
        except AssertionError as failed:
            m.found.append(f"{label}: {failed}")
        _still_in_step(comm, m, f"{label} hotness error")
    m.raise_if_any()


@check("error-hotness-exceeded-on-one-rank")
def check_hotness_one_rank(comm: Comm) -> None:
    """A sample longer than hotness on rank 0 only must fail the same way on every rank (as bad ids
    do) and must not leave the ranks out of step. Runs last: if the ranks disagree, the next
    collective no longer matches."""
    v1 = sok.Variable(SEED_TABLE1, dtype=tf.float32)
    ids = [[1, 1, 1], [3]] if comm.rank == 0 else [[1], [3, 4]]
    _expect_error(
        comm,
        lambda: sok_experiment.lookup_sparse(
            [v1], [tf.ragged.constant(ids, dtype=tf.int64)], hotness=[2], combiners=["sum"]
        ),
        tf.errors.InvalidArgumentError,
        r"hotness\[0\] = 2",
    )
    m = Mismatches()
    _still_in_step(comm, m, "hotness error on one rank")
    m.raise_if_any()


@check("weighted-function-ranks-build-different-graphs")
def check_weighted_function_different_graphs(comm: Comm) -> None:
    """A dynamic table localized on the last rank and a static table, weighted, in one tf.function
    that takes the gradient of a variable scaling the weights: the ranks build different graphs
    (only the last one reads the dynamic table), yet the backward collectives match on every rank
    (before: Horovod named the weights' backward all-to-all after each rank's own graph, and the
    ranks waited for each other forever). Outputs and the variable's gradient equal NumPy's."""
    m = Mismatches()
    full = np.arange(40 * 4, dtype=np.float32).reshape(40, 4)
    dynamic = sok.DynamicVariable(dimension=4, var_type="hbm", initializer=1.0, mode=f"localized:{comm.n - 1}")
    static = sok.Variable(full, dtype=tf.float32)
    scale = tf.Variable(1.5)
    spec = tf.TensorSpec([None], tf.int64)

    @tf.function(input_signature=[spec, spec])
    def step(values: tf.Tensor, lengths: tf.Tensor) -> tuple:
        ids = tf.RaggedTensor.from_row_lengths(values, lengths)
        with tf.GradientTape() as tape:
            weights = tf.RaggedTensor.from_row_lengths(tf.cast(values % 3 + 1, tf.float32) * scale, lengths)
            out = sok.lookup_sparse([dynamic, static], [ids, ids], [weights, weights], combiners=["sum", "sum"])
            loss = tf.add_n([tf.reduce_sum(o) for o in out])
        return out, tape.gradient(loss, scale)

    lengths = np.array([1, 2, 0] + [1] * comm.rank, np.int64)
    values = (np.arange(lengths.sum(), dtype=np.int64) * 7 + comm.rank) % 40
    (got_dynamic, got_static), got_grad = step(tf.constant(values), tf.constant(lengths))
    weights = (values % 3 + 1).astype(np.float64)
    samples = np.repeat(np.arange(len(lengths)), lengths)
    want_dynamic, want_static = np.zeros([len(lengths), 4]), np.zeros([len(lengths), 4])
    np.add.at(want_dynamic, samples, 1.5 * weights[:, None])
    np.add.at(want_static, samples, 1.5 * weights[:, None] * full[values])
    m.close("dynamic table's sums", got_dynamic.numpy(), want_dynamic)
    m.close("static table's sums", got_static.numpy(), want_static)
    m.close("gradient of the weights' scale", float(got_grad), float(np.sum(weights * (4 + full[values].sum(1)))))
    m.raise_if_any()


#: Checks that may leave the ranks out of step when they fail: run last, with a short watchdog.
LAST = ("error-hotness-exceeded-on-one-rank",)
for _name in LAST:
    CHECKS[_name] = CHECKS.pop(_name)
