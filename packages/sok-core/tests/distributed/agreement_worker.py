"""Worker of ``tests/test_rank_agreement_multiprocess.py``: checks that no rank hangs when the ranks
disagree or one rank fails (issue 15), on each rank of a Horovod job.

Run it under Horovod::

    horovodrun -np 2 -H localhost:2 --gloo python agreement_worker.py [check names...]
    horovodrun -np 2 -H localhost:2 --gloo python agreement_worker.py stall-job

Each rank prints ``CHECK <name> rank=<r> PASS`` or ``CHECK <name> rank=<r> FAIL <what differed>``.
A watchdog ends a check that does not finish (a rank left waiting in a collective) with
``FAIL hang`` and exits the process. ``stall-job`` runs only the stall check, which ends Horovod (run
it with a short ``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS``).
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import sparse_operation_kit as sok  # noqa: E402
import tensorflow as tf  # noqa: E402
from harness import print_stacks_before_timeout  # noqa: E402
from sparse_operation_kit import communication  # noqa: E402

TIMEOUT_S = 90
#: Rank 1 of the stall check stays out of the collective this long: far longer than the shutdown time.
STALL_ABSENCE_S = 30

CHECKS: dict[str, Callable[[int, int], None]] = {}


def check(name: str) -> Callable:
    def register(fn: Callable[[int, int], None]) -> Callable[[int, int], None]:
        CHECKS[name] = fn
        return fn

    return register


def _one_line(text: Any) -> str:
    return " | ".join(line.strip() for line in str(text).splitlines() if line.strip())


def _outcome(fn: Callable[[], Any]) -> tuple[str, str, Exception | None]:
    try:
        fn()
        return "no error", "", None
    except Exception as caught:  # noqa: BLE001 - the outcome is what is checked
        return type(caught).__name__, _one_line(caught), caught


def _expect_error(fn: Callable[[], Any], error: type | tuple, *patterns: str) -> str:
    """fn raises ``error`` whose message matches every pattern on this rank; the ranks compare their
    outcomes (an allgather), so every rank must raise. Returns the message."""
    kind, message, caught = _outcome(fn)
    everyone = hvd.allgather_object((hvd.rank(), kind), name="expect_error")
    problems = []
    if caught is None or not isinstance(caught, error):
        problems.append(f"got {kind}: {message[:800]!r}, expected {error}")
    else:
        problems += [f"message {message[:800]!r} does not match {p!r}" for p in patterns if not re.search(p, message)]
    missing = [rank for rank, k in everyone if k == "no error"]
    if missing:
        problems.append(f"rank(s) {missing} raised nothing")
    if problems:
        raise AssertionError("; ".join(problems))
    return message


def _sum_lookup(params: list, ids: list, combiners: list | None = None, weights: list | None = None) -> list:
    return sok.lookup_sparse(params, ids, sp_weights=weights, combiners=combiners or ["sum"] * len(params))


def _still_in_step(dim: int = 3) -> None:
    """A valid lookup of a static table gives every rank the rows of the oracle (numpy)."""
    table = np.arange(10 * dim, dtype=np.float32).reshape(10, dim)
    v = sok.Variable(table, dtype=tf.float32)
    ids = [[1, 2], [hvd.rank() + 3]]
    out = _sum_lookup([v], [tf.ragged.constant(ids, dtype=tf.int64)])[0].numpy()
    want = np.stack([table[row].sum(axis=0) for row in ids])
    np.testing.assert_array_equal(out, want)


# -- 1. a lookup that fails on one rank --------------------------------------------------------

FULL_CAPACITY = 8  # rows of each shard of the small "hbm" table


def _small_table() -> sok.DynamicVariable:
    return sok.DynamicVariable(
        dimension=4, var_type="hbm", initializer="7", init_capacity=FULL_CAPACITY, max_capacity=FULL_CAPACITY
    )


def _overflowing_ids(rank: int, n: int) -> tf.RaggedTensor:
    """Rank 0's batch holds 3 * FULL_CAPACITY keys owned by rank n - 1 (key mod n), more than its shard
    holds; every other rank's keys are owned by rank 0, which has room for them."""
    if rank == 0:
        keys = [n * k + (n - 1) for k in range(3 * FULL_CAPACITY)]
        return tf.ragged.constant([keys[: len(keys) // 2], keys[len(keys) // 2 :]], dtype=tf.int64)
    return tf.ragged.constant([[0], [n]], dtype=tf.int64)


def _check_lookup_failure(rank: int, n: int, lookup: Callable[[Any, Any], Any]) -> None:
    v = _small_table()
    pattern = [
        rf"lookup of table {re.escape(v.name)} \(params\[0\], var_type hbm\) failed on rank\(s\) \[{n - 1}\]",
        r"later calls work again",
        # the failing rank's own backend message; the others say theirs worked
        r"det table is full" if rank == n - 1 else r"none \(its lookup worked\)",
    ]
    _expect_error(lambda: lookup(v, _overflowing_ids(rank, n)), tf.errors.InvalidArgumentError, *pattern)
    # A later call works on every rank: small batches fit, and the rows are the initializer's (7).
    ids = tf.ragged.constant([[rank, rank + 1], [2 * n + rank]], dtype=tf.int64)
    out = lookup(v, ids).numpy()
    np.testing.assert_array_equal(out, np.array([[14.0] * 4, [7.0] * 4], np.float32))


@check("lookup-fails-on-one-rank-eager")
def check_lookup_failure_eager(rank: int, n: int) -> None:
    _check_lookup_failure(rank, n, lambda v, ids: _sum_lookup([v], [ids])[0])


@check("lookup-fails-on-one-rank-tf-function")
def check_lookup_failure_function(rank: int, n: int) -> None:
    spec = tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1, row_splits_dtype=tf.int64)
    functions: dict[int, Any] = {}

    def lookup(v: Any, ids: Any) -> Any:
        if id(v) not in functions:
            functions[id(v)] = tf.function(lambda x: _sum_lookup([v], [x])[0], input_signature=[spec])
        return functions[id(v)](ids)

    _check_lookup_failure(rank, n, lookup)


@check("lookup-gradient-through-the-status-read")
def check_gradient(rank: int, n: int) -> None:
    """The gradient of the multi-rank dynamic lookup (SokTryLookup) is, per key this rank owns, the
    number of times the global batch looks it up (sum combiner, loss = sum of the outputs)."""
    v = sok.DynamicVariable(dimension=2, initializer="1")
    batches = [[[r, r + 1, r + 1], [5]] for r in range(n)]
    ids = tf.ragged.constant(batches[rank], dtype=tf.int64)

    @tf.function
    def step(x: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(_sum_lookup([v], [x])[0])
        return tape.gradient(loss, v)

    grad = step(ids)
    got: dict[int, np.ndarray] = {}
    for key, row in zip(grad.indices.numpy().tolist(), grad.values.numpy()):
        got[key] = got.get(key, 0) + row
    counts: dict[int, int] = {}
    for batch in batches:
        for sample in batch:
            for key in sample:
                if key % n == rank:
                    counts[key] = counts.get(key, 0) + 1
    assert sorted(got) == sorted(counts), f"gradient keys {sorted(got)} != owned keys looked up {sorted(counts)}"
    for key, count in counts.items():
        np.testing.assert_array_equal(got[key], np.full(2, count, np.float32), err_msg=f"key {key}")


# -- 2. different calls on different ranks -----------------------------------------------------

_DIFFERENT = r"the ranks called it with different arguments"


def _two_tables() -> tuple[Any, Any]:
    return (
        sok.Variable(np.arange(17 * 3, dtype=np.float32).reshape(17, 3), dtype=tf.float32),
        sok.Variable(np.arange(7 * 5, dtype=np.float32).reshape(7, 5), dtype=tf.float32),
    )


def _ids() -> tf.RaggedTensor:
    return tf.ragged.constant([[1, 2], [3]], dtype=tf.int64)


def _disagreement(rank: int, n: int, call: Callable[[], Any], differing: str, modes: tuple = ("eager",)) -> None:
    functions = {"eager": call, "tf.function": tf.function(call)}
    for mode, fn in ((m, functions[m]) for m in modes):
        try:
            _expect_error(
                fn, tf.errors.InvalidArgumentError, _DIFFERENT, rf"Rank {rank} called it with", re.escape(differing)
            )
        except AssertionError as error:
            raise AssertionError(f"{mode}: {error}") from None
    _still_in_step()


@check("table-lists-differ")
def check_table_lists(rank: int, n: int) -> None:
    v1, v2 = _two_tables()
    if rank == 0:
        call = lambda: _sum_lookup([v1, v2], [_ids(), _ids()])  # noqa: E731
    else:
        call = lambda: _sum_lookup([v1], [_ids()])  # noqa: E731
    # rank 0 sees every other rank differ; the others see rank 0 differ
    _disagreement(rank, n, call, str(list(range(1, n))) if rank == 0 else "[0]")


@check("combiners-differ")
def check_combiners(rank: int, n: int) -> None:
    v1, _ = _two_tables()
    combiner = "sum" if rank == 0 else "mean"
    _disagreement(
        rank,
        n,
        lambda: sok.lookup_sparse([v1], [_ids()], combiners=[combiner]),
        f"combiner {combiner}",
    )


@check("dims-differ")
def check_dims(rank: int, n: int) -> None:
    dim = 3 + rank  # dynamic tables: each rank creates its own shard
    v = sok.DynamicVariable(dimension=dim, initializer="1", name="same_name")
    _disagreement(rank, n, lambda: _sum_lookup([v], [_ids()]), f"dim {dim}")


# -- 3. sok.Variable created differently on different ranks ---------------------------------------


@check("variable-initial-values-differ")
def check_initial_values(rank: int, n: int) -> None:
    value = np.full((4, 3), float(rank), np.float32)
    _expect_error(
        lambda: sok.Variable(value, dtype=tf.float32, name="table_a"),
        ValueError,
        r"sok.Variable 'table_a' differs between the ranks",
        r"initial_value digest differs",
        r"broadcast",
    )
    _still_in_step()


@check("variable-rows-differ")
def check_rows(rank: int, n: int) -> None:
    _expect_error(
        lambda: sok.Variable(shape=[4 + rank, 3], initializer="zeros", dtype=tf.float32, name="table_b"),
        ValueError,
        r"'table_b' differs",
        r"rows differs \(rank 0: 4, rank 1: 5",
    )


@check("variable-modes-differ")
def check_modes(rank: int, n: int) -> None:
    mode = "localized:0" if rank == 0 else None
    _expect_error(
        lambda: sok.Variable(np.ones((4, 3), np.float32), dtype=tf.float32, mode=mode, name="table_c"),
        ValueError,
        r"'table_c' differs",
        r"mode differs \(rank 0: localized:0, rank 1: distributed",
    )


@check("variable-fails-on-one-rank")
def check_variable_failure(rank: int, n: int) -> None:
    value = np.ones((2, 2, 2), np.float32) if rank == n - 1 else np.ones((4, 2), np.float32)
    pattern = r"initial_value must have rank 2" if rank == n - 1 else rf"could not be created on rank\(s\) \[{n - 1}\]"
    _expect_error(lambda: sok.Variable(value, dtype=tf.float32, name="table_d"), ValueError, pattern)
    _still_in_step()


@check("variable-random-initializer-works")
def check_random_initializer(rank: int, n: int) -> None:
    """Each rank draws its own random table and keeps only its rows: not a disagreement."""
    v = sok.Variable(shape=[6, 3], initializer=tf.keras.initializers.RandomUniform(), dtype=tf.float32)
    assert v.shape.as_list() == [6 // n + (1 if rank < 6 % n else 0), 3], v.shape
    same = sok.Variable(np.arange(12, dtype=np.float32).reshape(4, 3), dtype=tf.float32)
    np.testing.assert_array_equal(same.numpy(), np.arange(12, dtype=np.float32).reshape(4, 3)[rank::n])


@check("weights-given-on-one-rank")
def check_weights(rank: int, n: int) -> None:
    v1, _ = _two_tables()
    weights = [tf.ragged.constant([[1.0, 1.0], [1.0]])] if rank == 0 else None
    _disagreement(
        rank,
        n,
        lambda: _sum_lookup([v1], [_ids()], weights=weights),
        f"sp_weights {'given' if rank == 0 else 'None'}",
    )


# Last: it may hang today (see the test's KNOWN_BUGS), and then the watchdog ends the job.
@check("different-calls-in-tf-function")
def check_disagreement_in_function(rank: int, n: int) -> None:
    v1, v2 = _two_tables()
    weights = [tf.ragged.constant([[1.0, 1.0], [1.0]])] if rank == 0 else None
    _disagreement(
        rank,
        n,
        lambda: _sum_lookup([v1], [_ids()], weights=weights),
        f"sp_weights {'given' if rank == 0 else 'None'}",
        modes=("tf.function",),
    )
    if rank == 0:
        call = lambda: _sum_lookup([v1, v2], [_ids(), _ids()])  # noqa: E731
    else:
        call = lambda: _sum_lookup([v1], [_ids()])  # noqa: E731
    _disagreement(rank, n, call, str(list(range(1, n))) if rank == 0 else "[0]", modes=("tf.function",))


# -- 5. a rank that never joins a SOK collective ---------------------------------------------------


def stall(rank: int, n: int) -> bool:
    """Rank 0 calls sok.lookup_sparse, which no other rank calls: within the stall shutdown time
    Horovod shuts down and rank 0 gets a CollectiveError naming the call; the others find Horovod
    shut down when they come back."""
    seconds = communication.stall_shutdown_seconds()
    start = time.perf_counter()
    if rank == 0:
        v = sok.DynamicVariable(dimension=3, initializer="1")  # creating it is no collective
        kind, message, caught = _outcome(lambda: _sum_lookup([v], [_ids()]))
        elapsed = time.perf_counter() - start
        problems = []
        if not isinstance(caught, communication.CollectiveError):
            problems.append(f"got {kind}: {message[:600]!r}, expected CollectiveError")
        for pattern in (r"sok\.lookup_sparse", rf"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS={seconds}", "Missing ranks"):
            if not re.search(pattern, message):
                problems.append(f"message {message[:600]!r} does not match {pattern!r}")
        if elapsed > STALL_ABSENCE_S - 5:
            problems.append(f"the error came after {elapsed:.1f} s, not within the shutdown time {seconds} s")
    else:
        # Stays out of the collective (the main thread sleeps; Horovod's thread runs), then comes back.
        time.sleep(STALL_ABSENCE_S)
        kind, message, caught = _outcome(lambda: communication.tool().broadcast(tf.constant([1]), 0, name="late"))
        problems = [] if isinstance(caught, communication.CollectiveError) else [f"got {kind}: {message[:600]!r}"]
    detail = "; ".join(problems)
    print(f"CHECK stall rank={rank} {'FAIL ' + detail if problems else 'PASS'} ({time.perf_counter() - start:.1f} s)")
    print(f"STALL rank={rank} {kind}: {message[:1500]}", flush=True)
    return not problems


def run_check(name: str, rank: int, n: int) -> bool:
    def hang() -> None:
        print(f"CHECK {name} rank={rank} FAIL hang: no result within {TIMEOUT_S} s", flush=True)
        os._exit(1)

    watchdog = threading.Timer(TIMEOUT_S, hang)
    watchdog.daemon = True
    watchdog.start()
    start = time.perf_counter()
    try:
        CHECKS[name](rank, n)
        status = "PASS"
    except Exception as error:  # noqa: BLE001 - every failure is reported, then the next check runs
        status = f"FAIL {type(error).__name__}: {_one_line(error)}"
        if not isinstance(error, AssertionError):
            status += " || " + _one_line("".join(traceback.format_exception(error)[-4:]))
    hvd.allgather_object(name, name="check_done")
    watchdog.cancel()
    print(f"CHECK {name} rank={rank} {status} ({time.perf_counter() - start:.1f} s)", flush=True)
    return status == "PASS"


def main(args: list[str]) -> int:
    print_stacks_before_timeout()
    hvd.init()
    sok.init()
    rank, n = hvd.rank(), hvd.size()
    if args == ["stall-job"]:
        watchdog = threading.Timer(STALL_ABSENCE_S + TIMEOUT_S, lambda: (print("CHECK stall FAIL hang"), os._exit(1)))
        watchdog.daemon = True
        watchdog.start()
        ok = stall(rank, n)
        sys.stdout.flush()
        os._exit(0 if ok else 1)  # Horovod is shut down: skip its exit handlers
    unknown = set(args) - set(CHECKS)
    if unknown:
        print(f"unknown checks {sorted(unknown)}; valid: {list(CHECKS)}", flush=True)
        return 2
    results = [run_check(name, rank, n) for name in CHECKS if not args or name in args]
    failed = results.count(False)
    print(f"WORKER rank={rank} DONE passed={len(results) - failed} failed={failed}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
