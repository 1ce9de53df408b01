#!/usr/bin/env python
"""SOK's training step on 1, 2, 4 GPUs (one Horovod rank per GPU), for comparison with TorchRec.

Run it under ``horovodrun -np N`` (or as one process). Per configuration (table kind x dim x
hotness x ids placement): 26 tables of Criteo Kaggle's cardinalities capped at ``--cap`` rows
(``--tables uniform``: 26 tables of ``--cap`` rows, the issue's setting), batch ``--batch`` per
rank, power-law ids (each rank its own seed), one ``sok.lookup_sparse`` (combiner sum) over all
tables, loss = sum of squares of the concatenated pooled rows over the batch, gradients and
``sok.OptimizerWrapper(tf.keras.optimizers.Adagrad(0.01))``, one ``tf.function`` per step:

* kinds: ``static`` (``sok.Variable``, distributed: row i on rank i % N), ``localized``
  (``sok.Variable(mode="localized:t % N")``: table t whole on one rank, like TorchRec's table-wise),
  ``dynamic`` (``sok.DynamicVariable(var_type="hbm")``);
* hotness: ``1`` (one id per sample), ``2`` (two, the issue's), ``multi`` (table t: 1 .. 1 + 7t mod 20
  ids per sample, as ``train_gpu.py``);
* ids: ``gpu`` (a pool of 8 batches made beforehand in GPU memory, each step given its batch as
  arguments: per table the ids and the row splits), ``pool`` (the same pool read inside the step,
  whose one argument is the batch's number: TensorFlow's per-argument work on the host at each
  call, about as much as the step's GPU time at one rank, is left out, as where the input pipeline
  runs inside the step's graph; the ids are sliced from the pool without a copy) or ``host``
  (the pool in host memory, fed through ``tf.data`` with ``prefetch_to_device``: the copy of the
  next batch overlaps the step).

Each figure is the best of ``--repeat`` rounds of ``--steps`` steps after ``--warmup``; a round
ends when its last loss is on the host, its time is the slowest rank's, and the ranks meet before
each round. Printed per configuration: ms per step, total samples/s (N x batch / step), and the
bytes each rank puts into SOK's collectives per step, measured: during two extra steps the
methods of ``sparse_operation_kit.communication.tool()`` (``allgather``, ``alltoall``,
``allreduce_sum``), and those of the lookup's exchange where it bypasses the tool (SOK's NCCL
``allgather`` and ``alltoall``), are wrapped so that each adds ``tf.size(input) x itemsize`` to
counters in the graph (the second step's increase is the figure).
``sent`` is what leaves the rank by each collective's meaning: an allgather's input to N - 1
ranks, an all-to-all's input less its own split, a ring allreduce 2 (N - 1) / N of its input.

With several ranks, SOK's own exchange is also timed alone: its all-to-all (``lookup.exchange.of``,
the collectives the lookup uses: SOK's NCCL ops on GPU ranks) of float32 rows at the bytes per rank
of ``--a2a-bytes`` and of each configuration's all-to-all input, bus bandwidth = bytes x (N - 1) /
N / time as nccl-tests prints it (the best of ``--repeat`` rounds of 20 calls in one tf.function).

TorchRec's step and Torch's NCCL ``all_to_all_single`` bandwidth at the same bytes are measured by
``scaling_torchrec.py`` in the same device call; ``--summarize`` reads the JSONs of both and prints
the table with E(n) = total(n) / (n x total(1)) and the bandwidth of SOK's exchange beside
Torch's at the nearest size; rows of a run without horovodrun (``launcher`` "process") are set
against np 1 under horovodrun below the table.

Usage::

    horovodrun -np 2 -H localhost:2 --gloo python benchmarks/scaling_gpu.py --json sok_np2.json
    python benchmarks/scaling_gpu.py --kinds static --dims 32 --ids gpu,host --json sok_np1.json
    python benchmarks/scaling_gpu.py --quick --json q.json        # tiny sizes: a smoke test (CPU too)
    python benchmarks/scaling_gpu.py --summarize sok_np*.json torchrec_np*.json
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gc
import json
import os
import platform
import sys
import time
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
from train_gpu import CRITEO, POOL, power_law  # noqa: E402

KINDS = ("static", "localized", "dynamic")
HOTNESS = ("1", "2", "multi")
IDS = ("gpu", "pool", "host")
COLLECTIVES = ("allgather", "alltoall", "allreduce_sum")


def csv(kind: type, choices: tuple[str, ...] | None = None) -> Any:
    """An argparse type: a comma-separated list of ``kind`` (each one of ``choices`` when given)."""

    def parse(text: str) -> list[Any]:
        values = [kind(part) for part in text.split(",") if part]
        bad = [v for v in values if choices is not None and v not in choices]
        if bad or not values:
            valid = ", ".join(choices or ["integers"])
            raise argparse.ArgumentTypeError(f"{text!r}: give a comma-separated list of {valid}")
        return values

    return parse


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kinds", type=csv(str, KINDS), default=["static", "dynamic"], help="static,localized,dynamic")
    p.add_argument("--dims", type=csv(int), default=[32, 128], help="comma-separated, default 32,128")
    p.add_argument("--hotness", type=csv(str, HOTNESS), default=["2"], help="1,2,multi (default 2)")
    p.add_argument("--ids", type=csv(str, IDS), default=["gpu"], help="gpu,pool,host (default gpu)")
    p.add_argument("--host-ids", action="store_true", help="the same as --ids host")
    p.add_argument("--tables", choices=["criteo", "uniform"], default="criteo",
                   help="criteo: Criteo Kaggle's 26 sizes capped at --cap; uniform: 26 x --cap rows")  # fmt: skip
    p.add_argument("--cap", type=int, default=2**20)
    p.add_argument("--batch", type=int, default=65536, help="samples per rank and step")
    p.add_argument("--zipf", type=float, default=1.1, help="power-law exponent of the ids (bounded Pareto)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--seed", type=int, default=37)
    p.add_argument("--a2a-bytes", type=csv(int), default=[2**20, 16 * 2**20, 128 * 2**20],
                   help="bytes per rank at which SOK's exchange all-to-all is timed alone (several ranks)")  # fmt: skip
    p.add_argument("--quick", action="store_true", help="tiny sizes: batch 512, cap 4 Ki, dim 8, 3 steps (CPU too)")
    p.add_argument("--json", help="write the figures to this file too")
    p.add_argument("--summarize", nargs="+", metavar="JSON", help="print the table of these results files and exit")
    args = p.parse_args(argv)
    if args.host_ids:
        args.ids = ["host"]
    if args.quick:
        args.batch, args.cap, args.dims, args.steps, args.warmup, args.repeat = 512, 2**12, [8], 3, 1, 1
        args.a2a_bytes = [2**16]
    return args


def table_rows(tables: str, cap: int) -> list[int]:
    """Rows of each of the 26 tables."""
    return [cap] * len(CRITEO) if tables == "uniform" else [min(c, cap) for c in CRITEO]


def sample_lengths(rng: np.random.Generator, hotness: str, table: int, batch: int) -> np.ndarray:
    """Ids per sample of table ``table``: fixed 1 or 2, or the multi-hot mix 1 .. 1 + 7t mod 20."""
    if hotness == "multi":
        return rng.integers(1, 1 + (7 * table) % 20 + 1, batch).astype(np.int64)
    return np.full(batch, int(hotness), np.int64)


def make_pool(args: argparse.Namespace, rows: list[int], hotness: str, rank: int) -> list[list[tuple]]:
    """POOL batches, each a (values, row_lengths) pair of NumPy arrays per table; seeded per rank."""
    rng = np.random.default_rng([args.seed, rank, HOTNESS.index(hotness)])
    pool = []
    for _ in range(POOL):
        batch = []
        for t, r in enumerate(rows):
            lengths = sample_lengths(rng, hotness, t, args.batch)
            batch.append((power_law(rng, int(lengths.sum()), r, args.zipf), lengths))
        pool.append(batch)
    return pool


def device() -> str:
    import tensorflow as tf

    return "/GPU:0" if tf.config.list_logical_devices("GPU") else "/CPU:0"


def device_name() -> str:
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        return str(tf.config.experimental.get_device_details(gpus[0]).get("device_name", gpus[0].name))
    return f"no GPU: CPU ({platform.processor() or platform.machine()})"


class Ranks:
    """The ranks of the job through SOK's communication tool (eager collectives on host tensors)."""

    def __init__(self) -> None:
        from sparse_operation_kit import communication

        self.comm = communication.tool()
        self.rank, self.size = self.comm.rank(), self.comm.num_ranks()

    def gather(self, values: list[float]) -> np.ndarray:
        """``values`` of every rank, ``[size, len(values)]`` (also a barrier)."""
        import tensorflow as tf

        with tf.device("/CPU:0"):
            return self.comm.allgather(tf.constant([values], tf.float64)).numpy()

    def barrier(self) -> None:
        self.gather([0.0])


class ExchangeCounter:
    """Counts, in the graph, the bytes that go into the communication tool's collectives."""

    def __init__(self, comm: Any) -> None:
        import tensorflow as tf

        self.comm = comm
        with tf.device("/CPU:0"):
            self.bytes_in = {c: tf.Variable(0, dtype=tf.int64, trainable=False) for c in COLLECTIVES}
            self.calls = {c: tf.Variable(0, dtype=tf.int64, trainable=False) for c in COLLECTIVES}
            self.sent = tf.Variable(0, dtype=tf.int64, trainable=False)

    def read(self) -> dict[str, int]:
        figures = {f"{c}_bytes": int(v.numpy()) for c, v in self.bytes_in.items()}
        figures.update({f"{c}_calls": int(v.numpy()) for c, v in self.calls.items()})
        figures["sent_bytes"] = int(self.sent.numpy())
        return figures

    def _sent(self, collective: str, tensor: Any, nbytes: Any, splits: Any) -> Any:
        import tensorflow as tf

        n, rank = self.comm.num_ranks(), self.comm.rank()
        if collective == "allgather":
            return nbytes * (n - 1)
        if collective == "allreduce_sum":
            return nbytes * 2 * (n - 1) // n
        rows = tf.maximum(tf.cast(tf.shape(tensor, out_type=tf.int64)[0], tf.int64), 1)
        own = tf.cast(tf.reshape(splits, [-1])[rank], tf.int64)
        return nbytes - nbytes // rows * own

    def _wrap(self, collective: str, original: Any) -> Any:
        import tensorflow as tf

        def counted(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            t = tf.convert_to_tensor(tensor)
            splits = kwargs.get("splits", args[0] if args else None)
            with tf.device("/CPU:0"):
                nbytes = tf.size(t, out_type=tf.int64) * t.dtype.size
                sent = self._sent(collective, t, nbytes, splits)
                self.bytes_in[collective].assign_add(nbytes)
                self.calls[collective].assign_add(1)
                self.sent.assign_add(sent)
            return original(tensor, *args, **kwargs)

        return counted

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        """While inside, the tool's collectives count (as instance attributes over its methods), and
        those of the lookup's exchange where it does not go through the tool (SOK's NCCL ops)."""
        from sparse_operation_kit.lookup import exchange as exchanges

        owners = [self.comm]
        if self.comm.num_ranks() > 1:
            own = exchanges.of(self.comm)
            if not isinstance(own, exchanges.HorovodExchange):
                owners.append(own)
        for owner in owners:
            for c in COLLECTIVES:
                if hasattr(owner, c):
                    setattr(owner, c, self._wrap(c, getattr(owner, c)))
        try:
            yield
        finally:
            for owner in owners:
                for c in COLLECTIVES:
                    vars(owner).pop(c, None)


def make_tables(kind: str, rows: list[int], dim: int, n: int) -> list[Any]:
    import sparse_operation_kit as sok
    import tensorflow as tf

    init = tf.keras.initializers.RandomUniform(-0.05, 0.05)
    tables = []
    with tf.device(device()):
        for t, r in enumerate(rows):
            if kind == "dynamic":
                capacity = 1 << max(14, (r - 1).bit_length())
                tables.append(sok.DynamicVariable(dimension=dim, var_type="hbm", initializer="uniform",
                                                  init_capacity=capacity, max_capacity=capacity))  # fmt: skip
            else:
                mode = f"localized:{t % n}" if kind == "localized" else None
                tables.append(sok.Variable(shape=[r, dim], initializer=init, mode=mode))
    return tables


def pooled_loss(tables: list[Any], ids: list[Any], batch: int) -> Any:
    """The benchmark's loss: one ``sok.lookup_sparse`` (sum) over all tables, the mean over the batch
    of the sum of squares of the concatenated pooled rows."""
    import sparse_operation_kit as sok
    import tensorflow as tf

    pooled = sok.lookup_sparse(tables, ids, combiners=["sum"] * len(tables))
    return tf.reduce_sum(tf.square(tf.concat(pooled, axis=1))) / batch


def make_step(tables: list[Any], batch: int) -> Any:
    """The training step's body, ``body(ragged_ids) -> loss`` (not yet a tf.function)."""
    import sparse_operation_kit as sok
    import tensorflow as tf

    optimizer = sok.OptimizerWrapper(tf.keras.optimizers.Adagrad(0.01))

    def body(ids: list[Any]) -> Any:
        with tf.GradientTape() as tape:
            loss = pooled_loss(tables, ids, batch)
        grads = tape.gradient(loss, tables)
        optimizer.apply_gradients(zip(grads, tables))
        return loss

    return body


def flat_pool(pool: list[list[tuple]]) -> list[list[np.ndarray]]:
    """Each batch of the pool as the step's flat arguments: per table its ids and row splits."""
    return [[a for v, n in b for a in (v, np.concatenate([[0], np.cumsum(n)]))] for b in pool]


def flat_signature(tables: int, batch: int) -> list[Any]:
    """The input signature of a step that takes :func:`flat_pool`'s arguments."""
    import tensorflow as tf

    return [tf.TensorSpec([None], tf.int64), tf.TensorSpec([batch + 1], tf.int64)] * tables


def ragged_ids(flat: Any) -> list[Any]:
    """The RaggedTensors of :func:`flat_pool`'s arguments (inside the step)."""
    import tensorflow as tf

    return [tf.RaggedTensor.from_row_splits(v, s, validate=False) for v, s in zip(flat[0::2], flat[1::2])]


def step_caller(body: Any, pool: list[list[tuple]], ids: str, batch: int) -> Any:
    """``call(i)``: one step on the pool's batch ``i % POOL``, ``ids`` in GPU memory or fed from the host.

    The step's tf.function takes each table's ids as two flat tensors (values and row splits) and
    makes the RaggedTensors inside: TensorFlow's handling of composite arguments runs on the host on
    every call (``profile_step.py``'s "forward, RaggedTensor arguments" measures it).
    Each call makes a new tf.function over ``body`` (the counted step needs a trace of its own); its
    input signature leaves the number of ids open, so the batches of a multi-hot pool share one trace."""
    import tensorflow as tf

    flat = flat_pool(pool)
    signature = flat_signature(len(pool[0]), batch)
    step = tf.function(lambda *args: body(ragged_ids(args)), input_signature=signature, autograph=False)
    if ids == "gpu":
        with tf.device(device()):
            batches = [[tf.identity(tf.constant(a)) for a in b] for b in flat]
        return lambda i: step(*batches[i % POOL])
    if ids == "pool":
        return pool_step(body, flat)
    with tf.device("/CPU:0"):
        dataset = None
        for b in flat:
            one = tf.data.Dataset.from_tensors(tuple(b))
            dataset = one if dataset is None else dataset.concatenate(one)
        dataset = dataset.repeat().apply(tf.data.experimental.prefetch_to_device(device(), buffer_size=2))
    iterator = iter(dataset)
    return lambda i: step(*next(iterator))


def pool_step(body: Any, flat: list[list[np.ndarray]]) -> Any:
    """``call(i)``: a tf.function of one argument, the batch's number, that slices its ids out of the
    pool in GPU memory: per table all batches' ids one after the other and all batches' row splits,
    each batch's at a multiple of 8 elements so that TensorFlow's slice aliases the pool (no copy)."""
    import tensorflow as tf

    def packed(parts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        lengths = [len(a) for a in parts]
        starts = np.concatenate([[0], np.cumsum([-(-n // 8) * 8 for n in lengths])])
        out = np.zeros(starts[-1], np.int64)
        for a, at in zip(parts, starts):
            out[at : at + len(a)] = a
        return out, np.stack([starts[:-1], lengths], axis=1)

    tables = len(flat[0]) // 2
    with tf.device(device()):
        kept = [packed([b[k] for b in flat]) for k in range(2 * tables)]
        arrays = [tf.identity(tf.constant(a)) for a, _ in kept]
    with tf.device("/CPU:0"):
        where = tf.constant(np.stack([w for _, w in kept]))  # (2 tables, POOL, [start, length])

    def ids_of(i: tf.Tensor) -> list[Any]:
        with tf.device("/CPU:0"):  # the slices' bounds stay on the host
            at = tf.gather(where, i, axis=1)
            bounds = [(at[k, :1], at[k, 1:]) for k in range(len(arrays))]
        with tf.device(device()):
            return ragged_ids([tf.slice(a, *b) for a, b in zip(arrays, bounds)])

    step = tf.function(lambda i: body(ids_of(i)), input_signature=[tf.TensorSpec([], tf.int32)], autograph=False)
    numbers = [tf.constant(i, tf.int32) for i in range(POOL)]
    return lambda i: step(numbers[i % POOL])


def best_round(call: Any, ranks: Ranks, steps: int, warmup: int, repeat: int) -> tuple[float, list[float]]:
    """The best round's seconds per step (each round's time the slowest rank's) and every round's."""
    for i in range(warmup):
        call(i).numpy()
    rounds = []
    for _ in range(repeat):
        ranks.barrier()
        start = time.perf_counter()
        loss = None
        for i in range(steps):
            loss = call(i)
        loss.numpy()
        rounds.append(float(ranks.gather([(time.perf_counter() - start) / steps]).max()))
    return min(rounds), rounds


def measure(args: argparse.Namespace, ranks: Ranks, kind: str, dim: int, hotness: str, ids: str,
            pool: list[list[tuple]], rows: list[int]) -> dict[str, Any]:  # fmt: skip
    """One configuration: its time and its bytes per rank and step."""
    tables = make_tables(kind, rows, dim, ranks.size)
    body = make_step(tables, args.batch)
    counter = ExchangeCounter(ranks.comm)
    with counter.counting():
        counted = step_caller(body, pool, ids, args.batch)
        counted(0).numpy()  # traces (collectives made only while tracing count here too)
        before = counter.read()
        counted(1).numpy()
    after = counter.read()
    exchange = {k: after[k] - before[k] for k in after}
    per_rank = ranks.gather([exchange["sent_bytes"], exchange["alltoall_bytes"]])
    seconds, rounds = best_round(step_caller(body, pool, ids, args.batch), ranks, args.steps, args.warmup, args.repeat)
    row = {
        "tool": "sok", "kind": kind, "dim": dim, "hotness": hotness, "ids": ids, "np": ranks.size,
        "batch": args.batch, "cap": args.cap, "tables": args.tables, "ms": seconds * 1e3,
        "rounds_ms": [r * 1e3 for r in rounds], "samples_per_s": ranks.size * args.batch / seconds,
        "exchange_rank0": exchange, "sent_bytes_max": int(per_rank[:, 0].max()),
        "alltoall_bytes_max": int(per_rank[:, 1].max()), "launcher": launcher(),
    }  # fmt: skip
    del tables, body, counted
    gc.collect()
    return row


def exchange_bandwidth(ranks: Ranks, sizes: list[int], repeat: int, calls: int = 20) -> list[dict[str, Any]]:
    """SOK's exchange all-to-all alone (the lookup's collectives) at each size in bytes per rank:
    float32 rows of 64 columns, an equal share to each rank; the time per call of the best of
    ``repeat`` rounds of ``calls`` calls (each round's time the slowest rank's) and the bus bandwidth."""
    import tensorflow as tf
    from sparse_operation_kit.lookup import exchange as exchanges

    exchange, n, width, points = exchanges.of(ranks.comm), ranks.size, 64, []
    for rows in sorted({max(n, size // (4 * width) // n * n) for size in sizes}):
        with tf.device("/CPU:0"):
            counts = tf.fill([n], tf.constant(rows // n, tf.int32))
        with tf.device(device()):
            values = tf.identity(tf.random.uniform([rows, width]))

        @tf.function(autograph=False)
        def chain(x: tf.Tensor, counts: tf.Tensor) -> tf.Tensor:
            for i in range(calls):
                x = exchange.alltoall(x, counts, counts, name=f"scaling_gpu.py: all-to-all {i}")
            return x[0, 0]  # one number to the host: the copy of the whole result would be timed too

        chain(values, counts).numpy()  # traces, sets up
        best = float("inf")
        for _ in range(repeat):
            ranks.barrier()
            start = time.perf_counter()
            chain(values, counts).numpy()
            best = min(best, float(ranks.gather([(time.perf_counter() - start) / calls]).max()))
        nbytes = rows * width * 4
        points.append({"bytes": nbytes, "ms": best * 1e3, "busbw_GBps": nbytes * (n - 1) / n / best / 1e9,
                       "exchange": exchange.name})  # fmt: skip
    return points


def launcher() -> str:
    """``"horovodrun"`` for a rank that horovodrun started (it sets HOROVOD_RANK), else ``"process"``."""
    return "horovodrun" if "HOROVOD_RANK" in os.environ else "process"


def config_key(row: dict[str, Any]) -> tuple:
    """What SOK's and TorchRec's rows share: the tables, the dim, the hotness, the batch."""
    return (row["tables"], row["cap"], row["dim"], str(row["hotness"]), row["batch"])


def summarize(paths: list[str]) -> str:
    """The markdown table of the results files of scaling_gpu.py and scaling_torchrec.py."""
    sok_rows, rec_rows, a2a, own, alone = [], [], {}, {}, []
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        for row in data["rows"]:
            if row["tool"] != "sok":
                rec_rows.append(row)
            else:
                (alone if row.get("launcher") == "process" else sok_rows).append(row)
        for point in data.get("a2a", []):
            a2a.setdefault(data["np"], []).append(point)
        for point in data.get("exchange_a2a", []):
            own.setdefault(data["np"], []).append(point)

    def run_of(r: dict) -> tuple:
        return (*config_key(r), r["kind"], r["ids"])

    launched_runs = {run_of(r) for r in sok_rows if r["np"] == 1}
    sok_rows += [r for r in alone if run_of(r) not in launched_runs]  # the only np 1 of their run
    alone = [r for r in alone if run_of(r) in launched_runs]
    if not sok_rows:
        raise SystemExit(f"--summarize: no SOK rows in {paths} (give the JSONs of scaling_gpu.py runs)")

    def one_process(rows: list[dict], row: dict) -> float | None:
        base = [r for r in rows if r["np"] == 1 and run_of(r) == run_of(row)]
        return base[0]["samples_per_s"] if base else None

    def efficiency(rows: list[dict], row: dict) -> str:
        base = one_process(rows, row)
        return f"{row['samples_per_s'] / (row['np'] * base):.2f}" if base else "-"

    def nearest(points: list[dict], nbytes: int) -> dict | None:
        return min(points, key=lambda p: abs(p["bytes"] - nbytes)) if points and nbytes > 0 else None

    def bandwidth(n: int, nbytes: int) -> str:
        near = nearest(a2a.get(n, []), nbytes)
        return "-" if n == 1 or near is None else f"{near['busbw_GBps']:.0f} (at {near['bytes'] / 2**20:.1f} MiB)"

    def own_bandwidth(n: int, nbytes: int) -> str:
        """SOK's exchange at the nearest size, and its ratio to Torch's at that size."""
        mine = nearest(own.get(n, []), nbytes)
        if n == 1 or mine is None:
            return "-"
        theirs = nearest(a2a.get(n, []), mine["bytes"])
        ratio = f", {mine['busbw_GBps'] / theirs['busbw_GBps']:.2f}x" if theirs else ""
        return f"{mine['busbw_GBps']:.0f} (at {mine['bytes'] / 2**20:.1f} MiB{ratio})"

    lines = [
        "| config | np | SOK ms | TorchRec ms | SOK/TorchRec samples/s | E(n) SOK | E(n) TorchRec | bytes/rank | "
        "NCCL a2a GB/s | SOK exchange GB/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in sorted(sok_rows, key=lambda r: (config_key(r), r["kind"], r["ids"], r["np"])):
        rivals = [r for r in rec_rows if r["np"] == row["np"] and config_key(r) == config_key(row)]
        rival = min(rivals, key=lambda r: r["ms"]) if rivals else None
        config = f"{row['kind']} dim {row['dim']} hot {row['hotness']} ids {row['ids']}"
        rec_ms = f"{rival['ms']:.2f} ({rival['kind']})" if rival else "-"
        ratio = f"{row['samples_per_s'] / rival['samples_per_s']:.2f}x" if rival else "-"
        rec_e = efficiency(rec_rows, rival) if rival else "-"
        sent = row["sent_bytes_max"]
        lines.append(
            f"| {config} | {row['np']} | {row['ms']:.2f} | {rec_ms} | {ratio} | {efficiency(sok_rows, row)} | "
            f"{rec_e} | {sent / 2**20:.1f} MiB | {bandwidth(row['np'], row['alltoall_bytes_max'])} | "
            f"{own_bandwidth(row['np'], row['alltoall_bytes_max'])} |"
        )
    # One process (no launcher) against np 1 under horovodrun, per configuration run both ways.
    for single in sorted(alone, key=run_of):
        launched = [r for r in sok_rows if r["np"] == 1 and run_of(r) == run_of(single)]
        if launched:
            lines.append(f"\n{single['kind']} dim {single['dim']} hot {single['hotness']} ids {single['ids']}: np 1 "
                         f"under horovodrun {launched[0]['ms']:.2f} ms, one process {single['ms']:.2f} ms "
                         f"({launched[0]['ms'] / single['ms']:.2f}x)")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.summarize:
        print(summarize(args.summarize))
        return 0
    import sparse_operation_kit as sok
    import tensorflow as tf

    sok.init()
    ranks = Ranks()
    rows = table_rows(args.tables, args.cap)
    date = dt.datetime.now().isoformat(timespec="minutes")
    name = device_name()
    if ranks.rank == 0:
        print(f"# scaling_gpu.py on {name} x {ranks.size} rank(s), {date}; TensorFlow {tf.__version__}, "
              f"SOK {sok.__version__}, {args.tables} tables (cap {args.cap:,}, {sum(rows):,} rows), batch "
              f"{args.batch:,} per rank, zipf {args.zipf}, best of {args.repeat} x {args.steps} steps "
              f"after {args.warmup}", flush=True)  # fmt: skip
        print(f"{'kind':10} {'dim':>4} {'hot':>5} {'ids':>4} {'np':>3} {'ms/step':>9} {'samples/s':>14} "
              f"{'sent MiB/rank':>13} {'a2a in MiB':>10}  calls (gather/a2a/reduce)", flush=True)  # fmt: skip
    results = []
    for hotness in args.hotness:
        pool = make_pool(args, rows, hotness, ranks.rank)
        for kind in args.kinds:
            for dim in args.dims:
                for ids in args.ids:
                    row = measure(args, ranks, kind, dim, hotness, ids, pool, rows)
                    results.append(row)
                    x = row["exchange_rank0"]
                    calls = "/".join(str(x[f"{c}_calls"]) for c in COLLECTIVES)
                    if ranks.rank == 0:
                        print(f"{kind:10} {dim:4} {hotness:>5} {ids:>4} {ranks.size:3} {row['ms']:9.2f} "
                              f"{row['samples_per_s']:14,.0f} {row['sent_bytes_max'] / 2**20:13.2f} "
                              f"{row['alltoall_bytes_max'] / 2**20:10.2f}  {calls}", flush=True)  # fmt: skip
    a2a = []
    if ranks.size > 1:
        sizes = list(args.a2a_bytes) + [r["alltoall_bytes_max"] for r in results if r["alltoall_bytes_max"] > 0]
        a2a = exchange_bandwidth(ranks, sizes, args.repeat)
        for point in a2a if ranks.rank == 0 else []:
            print(f"SOK exchange ({point['exchange']}) all-to-all {point['bytes'] / 2**20:10.2f} MiB/rank "
                  f"{point['ms']:9.3f} ms bus {point['busbw_GBps']:7.1f} GB/s", flush=True)  # fmt: skip
    if args.json and ranks.rank == 0:
        with open(args.json, "w") as f:
            json.dump({"tool": "sok", "np": ranks.size, "device": name, "date": date, "argv": sys.argv[1:],
                       "rows": results, "exchange_a2a": a2a}, f, indent=1)  # fmt: skip
    ranks.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
