"""Worker of test_nccl_exchange_multiprocess.py, run under ``horovodrun -np N --gloo`` with one GPU
per rank: SOK's own NCCL collectives (``lookup/exchange.py``) against what each rank must receive.

Rank ``r`` sends rank ``p`` ``(p + 1) * (r + 1)`` rows (none to itself when ``r == p == 0``), each
row ``[r, p, i]``; every received row is then known from its position alone. Prints ``CHECK
<name> rank=<r> PASS|FAIL <detail>`` per check.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import sparse_operation_kit as sok  # noqa: E402
import tensorflow as tf  # noqa: E402
from harness import print_stacks_before_timeout  # noqa: E402
from sparse_operation_kit import communication  # noqa: E402
from sparse_operation_kit.lookup import exchange as exchanges  # noqa: E402


def check(name: str, problem: str | None) -> None:
    print(f"CHECK {name} rank={hvd.rank()} {'FAIL ' + problem if problem else 'PASS'}", flush=True)


def count(source: int, destination: int) -> int:
    return 0 if source == destination == 0 else (destination + 1) * (source + 1)


def rows_for(source: int, destination: int) -> np.ndarray:
    return np.array([[source, destination, i] for i in range(count(source, destination))], np.float32).reshape(-1, 3)


def main() -> int:
    print_stacks_before_timeout()
    hvd.init()
    sok.init()
    rank, n = hvd.rank(), hvd.size()
    exchange = exchanges.of(communication.tool())
    check("exchange_is_nccl", None if exchange.name == "nccl" else f"the exchange is {exchange.name!r}")

    send = tf.constant(np.concatenate([rows_for(rank, p) for p in range(n)]))
    send_counts = tf.constant([count(rank, p) for p in range(n)], tf.int32)
    recv_counts = tf.constant([count(p, rank) for p in range(n)], tf.int32)
    expected = np.concatenate([rows_for(p, rank) for p in range(n)])
    with tf.device("/GPU:0"):
        got = exchange.alltoall(tf.identity(send), send_counts, recv_counts, name="test: all-to-all, eager")
    problem = None if np.array_equal(got.numpy(), expected) else f"received {got.numpy().tolist()}"
    check("alltoall_uneven_eager", problem or (None if "GPU" in got.device else f"output on {got.device}"))

    ids = tf.constant(np.concatenate([rows_for(rank, p) for p in range(n)]).astype(np.int64) * 1_000_000_007)
    got_ids = exchange.alltoall(ids, send_counts, recv_counts, name="test: all-to-all of int64")
    want_ids = expected.astype(np.int64) * 1_000_000_007
    check("alltoall_int64", None if np.array_equal(got_ids.numpy(), want_ids) else f"got {got_ids.numpy().tolist()}")

    @tf.function
    def step(x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        with tf.GradientTape() as tape:
            tape.watch(x)
            first = exchange.alltoall(x, send_counts, recv_counts, name="test: first all-to-all")
            # The second's gradient comes back before the first's: both chained, in one order on every rank.
            second = exchange.alltoall(x * 2.0, send_counts, recv_counts, name="test: second all-to-all")
            loss = tf.reduce_sum(first * (rank + 1.0)) + tf.reduce_sum(second)
        return first, second, tape.gradient(loss, x)

    with tf.device("/GPU:0"):
        first, second, grad = step(send)
    # d loss / d x for a row sent to p: (p + 1) from the first, 2 from the second.
    want_grad = np.concatenate([np.full((count(rank, p), 3), p + 1.0 + 2.0, np.float32) for p in range(n)])
    problems = []
    if not np.array_equal(first.numpy(), expected):
        problems.append(f"first {first.numpy().tolist()}")
    if not np.array_equal(second.numpy(), expected * 2):
        problems.append(f"second {second.numpy().tolist()}")
    if not np.array_equal(grad.numpy(), want_grad):
        problems.append(f"gradient {grad.numpy().tolist()}, expected {want_grad.tolist()}")
    check("alltoall_in_function_with_gradient", "; ".join(problems) or None)

    nothing = exchange.alltoall(
        tf.zeros([0, 4]), tf.zeros([n], tf.int32), tf.zeros([n], tf.int32), name="test: empty all-to-all"
    )
    check("alltoall_empty", None if nothing.shape == (0, 4) else f"shape {nothing.shape}")

    with tf.device("/GPU:0"):
        gathered = exchange.allgather(tf.constant([rank, rank * 10, -rank], tf.int64), name="test: allgather")
    want = np.array([[p, p * 10, -p] for p in range(n)], np.int64).reshape(-1)
    check("allgather", None if np.array_equal(gathered.numpy(), want) else f"got {gathered.numpy().tolist()}")

    @tf.function
    def reduce(x: tf.Tensor, flag: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return exchange.allreduce_sum(x, name="test: allreduce"), exchange.allreduce_sum(flag, name="test: flags")

    with tf.device("/GPU:0"):
        total, flags = reduce(tf.fill([3, 5], float(rank + 1)), tf.constant(rank, tf.int32))
    want_total, want_flags = n * (n + 1) / 2, n * (n - 1) // 2
    problems = [] if np.all(total.numpy() == want_total) else [f"sum {total.numpy().tolist()}, want {want_total}"]
    if flags.dtype != tf.int32 or int(flags) != want_flags:
        problems.append(f"int32 sum {flags!r}, want {want_flags}")
    check("allreduce_sum", "; ".join(problems) or None)

    with tf.device("/GPU:0"):  # rank r gives r + 1 rows of [r, i]
        mine = tf.constant([[rank, i] for i in range(rank + 1)], tf.float32)
        rows = exchange.allgather_rows(mine, name="test: allgather of rows")
    want_rows = np.array([[p, i] for p in range(n) for i in range(p + 1)], np.float32)
    check("allgather_rows", None if np.array_equal(rows.numpy(), want_rows) else f"got {rows.numpy().tolist()}")

    try:
        exchange.alltoall(send, tf.constant([1], tf.int32), recv_counts, name="test: bad counts")
        check("bad_counts_refused", "no error for send_counts of one rank")
    except tf.errors.InvalidArgumentError as error:
        ok = "send_counts has shape [1]" in str(error) and f"[{n}]" in str(error)
        check("bad_counts_refused", None if ok else f"message: {error.message}")

    hvd.allreduce(tf.constant(0.0), name="every_rank_has_run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
