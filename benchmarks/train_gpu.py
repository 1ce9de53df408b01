#!/usr/bin/env python
"""SOK's TensorFlow path on a GPU against its baselines, measured in the same process and run.

Three measurements, each printed with the device and the date, as a time per step and a ratio:

1. ``train``: a training step of one embedding table (batch ``--batch`` x hotness 10, power-law
   ids over a ``--vocab`` vocabulary, the 10 rows of a sample summed, a Dense(1) head, logistic
   loss, Adagrad lr 0.01), per dim of ``--dims``:

   * ``sok hbm``: a ``sok.DynamicVariable`` (var_type ``hbm``: det, rows in HBM) read by
     ``tf.nn.embedding_lookup`` and updated by ``sok.OptimizerWrapper(Adagrad)``;
   * ``sok hybrid``: the same with var_type ``hybrid`` (hkv) holding half of the vocabulary's rows in
     HBM (``max_hbm_for_vectors``) and the rest in host memory;
   * ``tf dense``: a ``tf.Variable`` of ``vocab`` rows read by ``tf.gather``, Keras Adagrad;
   * ``torch``: ``torch.nn.EmbeddingBag(mode="sum", sparse=True)`` + ``torch.optim.Adagrad`` (the
     head: ``torch.optim.Adagrad`` too), when Torch with CUDA is importable.

   Goals: hbm >= 1.0x torch (so >= 5x tf dense); hybrid >= 0.5x torch.
2. ``lookup_sparse``: forward + backward (gradients w.r.t. the tables, no optimizer) of 26 static
   tables with Criteo Kaggle's cardinalities capped at ``--cap`` rows, batch ``--batch``, table
   ``t`` with 1 .. ``1 + 7t mod 20`` ids per sample (power-law): one ``sok.lookup_sparse`` over
   ``sok.Variable`` tables against 26 ``tf.nn.embedding_lookup_sparse`` on ``tf.Variable`` tables
   (combiner sum; its ids as the SparseTensors it takes, made beforehand). Goal >= 8x.
3. ``pooled``: a pooled forward (sum of hotness 10 rows per sample, ``--vocab`` capped at ``--cap``
   rows) against ``torch.nn.functional.embedding_bag`` on the same keys and rows: a static
   ``sok.Variable`` (goal >= 1.0x) and a ``sok.DynamicVariable`` holding those rows (goal >= 0.6x).

Each figure is the best of ``--repeat`` rounds of ``--steps`` steps after ``--warmup`` steps, every
step on a fresh batch from a pool of 8 made beforehand on the GPU. TensorFlow runs a ``tf.function``
per step; the time of a round ends when its last step's result is on the host.

Usage::

    python benchmarks/train_gpu.py                       # everything, the issue's sizes
    python benchmarks/train_gpu.py --only train --dims 32
    python benchmarks/train_gpu.py --quick               # small sizes: a smoke test (CPU too)
    python benchmarks/train_gpu.py --json results.json   # also write the figures as JSON
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import platform
import re
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

#: Criteo Kaggle's 26 categorical cardinalities.
CRITEO = [1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27, 14992, 5461306,
          10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572]  # fmt: skip
POOL = 8


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", choices=["train", "lookup_sparse", "pooled"], action="append")
    p.add_argument("--dims", type=int, nargs="+", default=[32, 128])
    p.add_argument("--batch", type=int, default=65536)
    p.add_argument("--vocab", type=int, default=16 * 2**20)
    p.add_argument("--cap", type=int, default=2 * 2**20)
    p.add_argument("--zipf", type=float, default=1.1, help="power-law exponent of the ids (bounded Pareto)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="small sizes (batch 1024, vocab 64 Ki, cap 16 Ki, 3 steps)")
    p.add_argument("--json", help="write every figure to this file too")
    p.add_argument("--check", action="store_true", help="exit status 1 when a goal is missed")
    args = p.parse_args(argv)
    if args.quick:
        args.batch, args.vocab, args.cap, args.steps, args.warmup, args.repeat = 1024, 2**16, 2**14, 3, 1, 1
    return args


def power_law(rng: np.random.Generator, n: int, rows: int, zipf: float) -> np.ndarray:
    """``n`` ids in [0, rows), bounded Pareto with exponent ``zipf`` (id 0 the hottest), shuffled
    through a fixed permutation so hot ids are spread over the table."""
    u = rng.random(n)
    ids = np.floor((1.0 - u * (1.0 - (rows + 1.0) ** (1.0 - zipf))) ** (1.0 / (1.0 - zipf))) - 1.0
    ids = np.clip(ids, 0, rows - 1).astype(np.int64)
    return (ids * 2654435761 + 12345) % rows


def best_time(step: Callable[[int], Any], sync: Callable[[Any], None], steps: int, warmup: int, repeat: int) -> float:
    """Best seconds per step: ``step(i)`` returns a result, ``sync(result)`` waits for it."""
    for i in range(warmup):
        sync(step(i))
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        out = None
        for i in range(steps):
            out = step(i)
        sync(out)
        best = min(best, (time.perf_counter() - start) / steps)
    return best


class Report:
    """Figures in rows; printed as they come and written as JSON at the end."""

    def __init__(self, device: str) -> None:
        self.device, self.date, self.rows = device, dt.date.today().isoformat(), []

    def add(self, part: str, case: str, kind: str, seconds: float, batch: int, base: float | None, goal: str) -> None:
        """One figure: ``seconds`` per step of ``batch`` samples; ``base``: the baseline's seconds."""
        ratio = f"{base / seconds:6.2f}x" if base else "      -"
        row = {"part": part, "case": case, "kind": kind, "ms": seconds * 1e3, "samples_per_s": batch / seconds}
        if base:
            row["ratio"] = base / seconds
        row["goal"] = goal
        threshold = re.match(r">= ([0-9.]+)x", goal)
        if base and threshold:
            row["met"] = row["ratio"] >= float(threshold.group(1))
            goal += " (met)" if row["met"] else " (missed)"
        self.rows.append(row)
        print(
            f"{part:13} {case:22} {kind:12} {seconds * 1e3:9.2f} ms {batch / seconds:14,.0f} samples/s {ratio}  {goal}",
            flush=True,
        )


def on_gpu(array: np.ndarray) -> Any:
    """``array`` as a tensor in GPU memory (where there is a GPU): the steps read their inputs there,
    as Torch's do (an eager ``tf.constant`` stays in host memory and is copied at every use)."""
    import tensorflow as tf

    with tf.device("/GPU:0" if tf.config.list_logical_devices("GPU") else "/CPU:0"):
        return tf.identity(tf.constant(array))


def tf_sync(result: Any) -> None:
    import tensorflow as tf

    tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, tf.nest.flatten(result)[:1])


def bench_train(args: argparse.Namespace, report: Report, torch: Any) -> None:

    rng = np.random.default_rng(7)
    hot = 10
    ids_np = [power_law(rng, args.batch * hot, args.vocab, args.zipf).reshape(args.batch, hot) for _ in range(POOL)]
    labels_np = [rng.integers(0, 2, (args.batch, 1)).astype(np.float32) for _ in range(POOL)]
    batches = [(on_gpu(x), on_gpu(y)) for x, y in zip(ids_np, labels_np)]
    for dim in args.dims:
        times: dict[str, float] = {}
        if torch is not None:
            times["torch"] = _torch_train(args, torch, dim, ids_np, labels_np)
            torch.cuda.empty_cache()
        row_bytes = dim * 4 * 2  # embedding + Adagrad accumulator
        hybrid = {"max_hbm_for_vectors": args.vocab * row_bytes / 2 / 2**30}  # GiB: half of the rows
        for var_type, options in (("hbm", {}), ("hybrid", hybrid)):
            times[f"sok {var_type}"] = _sok_train(args, dim, batches, var_type, options)
            gc.collect()
        # Last: TensorFlow keeps the GPU memory its allocator took (the dense table and its state).
        times["tf dense"] = _tf_dense_train(args, dim, batches)
        base, case = times.get("torch"), f"dim {dim}"
        for kind, seconds in times.items():
            goal = {"sok hbm": ">= 1.0x torch", "sok hybrid": ">= 0.5x torch"}.get(kind, "")
            report.add("train", case, kind, seconds, args.batch, base if kind.startswith("sok") else None, goal)
        report.add("train", case, "hbm/tf", times["sok hbm"], args.batch, times["tf dense"], ">= 5x tf dense")


def _torch_train(args: argparse.Namespace, torch: Any, dim: int, ids_np: list, labels_np: list) -> float:
    bag = torch.nn.EmbeddingBag(args.vocab, dim, mode="sum", sparse=True).to("cuda")
    head = torch.nn.Linear(dim, 1).to("cuda")
    optimizers = [torch.optim.Adagrad(bag.parameters(), lr=0.01), torch.optim.Adagrad(head.parameters(), lr=0.01)]
    ids = [torch.as_tensor(x, device="cuda") for x in ids_np]
    labels = [torch.as_tensor(x, device="cuda") for x in labels_np]

    def step(i: int) -> Any:
        for opt in optimizers:
            opt.zero_grad()
        logits = head(bag(ids[i % POOL]))
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels[i % POOL])
        loss.backward()
        for opt in optimizers:
            opt.step()
        return loss

    return best_time(step, lambda _: torch.cuda.synchronize(), args.steps, args.warmup, args.repeat)


def _keras_step(dim: int, read: Callable[[Any], Any], table: Any, optimizer: Any, batches: list) -> Callable:
    """A training step: ``read(ids)`` rows, summed per sample, a Dense(1) head (Keras Adagrad)."""
    import tensorflow as tf

    head = tf.keras.layers.Dense(1)
    head.build((None, dim))
    head_opt = tf.keras.optimizers.Adagrad(0.01)

    @tf.function
    def step(ids: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            logits = head(tf.reduce_sum(read(ids), axis=1))
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels, logits))
        grads = tape.gradient(loss, [table] + head.trainable_variables)
        optimizer.apply_gradients([(grads[0], table)])
        head_opt.apply_gradients(zip(grads[1:], head.trainable_variables))
        return loss

    return lambda i: step(*batches[i % POOL])


def _tf_dense_train(args: argparse.Namespace, dim: int, batches: list) -> float:
    import tensorflow as tf

    with tf.device("/GPU:0"):
        dense = tf.Variable(tf.random.uniform([args.vocab, dim], -0.05, 0.05))
    step = _keras_step(dim, lambda ids: tf.gather(dense, ids), dense, tf.keras.optimizers.Adagrad(0.01), batches)
    return best_time(step, tf_sync, args.steps, args.warmup, args.repeat)


def _sok_train(args: argparse.Namespace, dim: int, batches: list, var_type: str, options: dict) -> float:
    import sparse_operation_kit as sok
    import tensorflow as tf

    # Room for every id of the vocabulary (powers of two: hkv takes those), starting at a quarter.
    capacity = 1 << max(14, (args.vocab - 1).bit_length())
    with tf.device("/GPU:0"):
        var = sok.DynamicVariable(
            dimension=dim, var_type=var_type, initializer="uniform", init_capacity=capacity // 16,
            max_capacity=capacity, **options,
        )  # fmt: skip
    wrapper = sok.OptimizerWrapper(tf.keras.optimizers.Adagrad(0.01))
    step = _keras_step(dim, lambda ids: tf.nn.embedding_lookup(var, ids), var, wrapper, batches)
    return best_time(step, tf_sync, args.steps, args.warmup, args.repeat)


def criteo_inputs(args: argparse.Namespace, rng: np.random.Generator) -> tuple[list[int], list[list[Any]]]:
    """Rows per table and POOL batches of 26 RaggedTensors (1 .. 1 + 7t mod 20 ids per sample)."""
    import tensorflow as tf

    rows = [min(c, args.cap) for c in CRITEO]
    batches = []
    for _ in range(POOL):
        tables = []
        for t, r in enumerate(rows):
            top = 1 + (7 * t) % 20
            lengths = rng.integers(1, top + 1, args.batch)
            ids = power_law(rng, int(lengths.sum()), r, args.zipf)
            with tf.device("/GPU:0"):
                tables.append(tf.RaggedTensor.from_row_lengths(on_gpu(ids), on_gpu(lengths.astype(np.int64))))
        batches.append(tables)
    return rows, batches


def bench_lookup_sparse(args: argparse.Namespace, report: Report) -> None:
    rng = np.random.default_rng(11)
    rows, batches = criteo_inputs(args, rng)
    for dim in args.dims:
        t_tf, t_sok = _lookup_sparse_times(args, rows, batches, dim)
        case = f"26 tables dim {dim}"
        report.add("lookup_sparse", case, "tf", t_tf, args.batch, None, "")
        report.add("lookup_sparse", case, "sok", t_sok, args.batch, t_tf, ">= 8x tf")
        gc.collect()


def _lookup_sparse_times(args: argparse.Namespace, rows: list[int], batches: list, dim: int) -> tuple[float, float]:
    import sparse_operation_kit as sok
    import tensorflow as tf

    with tf.device("/GPU:0"):
        values = [tf.random.uniform([r, dim], -0.05, 0.05) for r in rows]
        sok_tables = [sok.Variable(v) for v in values]
        tf_tables = [tf.Variable(v) for v in values]

    @tf.function
    def sok_step(ids: list) -> list:
        with tf.GradientTape() as tape:
            out = sok.lookup_sparse(sok_tables, ids, combiners=["sum"] * len(ids))
            loss = tf.add_n([tf.reduce_sum(o) for o in out])
        return tape.gradient(loss, sok_tables)

    @tf.function
    def tf_step(ids: list) -> list:
        with tf.GradientTape() as tape:
            out = [tf.nn.embedding_lookup_sparse(t, i, None, combiner="sum") for t, i in zip(tf_tables, ids)]
            loss = tf.add_n([tf.reduce_sum(o) for o in out])
        return tape.gradient(loss, tf_tables)

    def sync(grads: list) -> None:
        g = grads[0]
        (g.values if isinstance(g, tf.IndexedSlices) else g).numpy()

    with tf.device("/GPU:0"):  # TensorFlow's lookup takes SparseTensors: made before the clock runs
        sparse = [[ids.to_sparse() for ids in batch] for batch in batches]
    t_tf = best_time(lambda i: tf_step(sparse[i % POOL]), sync, args.steps, args.warmup, args.repeat)
    t_sok = best_time(lambda i: sok_step(batches[i % POOL]), sync, args.steps, args.warmup, args.repeat)
    return t_tf, t_sok


def bench_pooled(args: argparse.Namespace, report: Report, torch: Any) -> None:
    import tensorflow as tf

    rng = np.random.default_rng(13)
    rows, hot = min(args.vocab, args.cap), 10
    ids_np = [power_law(rng, args.batch * hot, rows, args.zipf) for _ in range(POOL)]
    lengths = np.full(args.batch, hot, np.int64)
    with tf.device("/GPU:0"):
        ragged = [tf.RaggedTensor.from_row_lengths(on_gpu(x), on_gpu(lengths)) for x in ids_np]
    for dim in args.dims:
        table = rng.uniform(-0.05, 0.05, (rows, dim)).astype(np.float32)
        times: dict[str, float] = {}
        if torch is not None:
            times["torch"] = _torch_bag(args, torch, table, ids_np, hot)
            torch.cuda.empty_cache()
        times.update(_sok_pooled(args, table, ragged))
        base, case = times.get("torch"), f"{rows:,} rows dim {dim}"
        for kind, seconds in times.items():
            goal = {"sok static": ">= 1.0x torch", "sok dynamic": ">= 0.6x torch"}.get(kind, "")
            report.add("pooled", case, kind, seconds, args.batch, base if kind.startswith("sok") else None, goal)
        gc.collect()


def _torch_bag(args: argparse.Namespace, torch: Any, table: np.ndarray, ids_np: list, hot: int) -> float:
    weight = torch.as_tensor(table, device="cuda")
    ids = [torch.as_tensor(x, device="cuda") for x in ids_np]
    offsets = torch.arange(0, args.batch * hot, hot, device="cuda")

    def bag(i: int) -> Any:
        return torch.nn.functional.embedding_bag(ids[i % POOL], weight, offsets, mode="sum")

    return best_time(bag, lambda _: torch.cuda.synchronize(), args.steps, args.warmup, args.repeat)


def _sok_pooled(args: argparse.Namespace, table: np.ndarray, ragged: list) -> dict[str, float]:
    import sparse_operation_kit as sok
    import tensorflow as tf

    rows, dim = table.shape
    capacity = 1 << max(14, (rows - 1).bit_length())
    with tf.device("/GPU:0"):
        static = sok.Variable(table)
        dynamic = sok.DynamicVariable(dimension=dim, var_type="hbm", init_capacity=capacity, max_capacity=capacity)
    sok.assign(dynamic, tf.range(rows, dtype=tf.int64), table)
    times = {}
    for kind, var in (("sok static", static), ("sok dynamic", dynamic)):
        lookup = tf.function(lambda ids, var=var: sok.lookup_sparse(var, ids, combiners="sum"))
        times[kind] = best_time(lambda i, f=lookup: f(ragged[i % POOL]), tf_sync, args.steps, args.warmup, args.repeat)
    return times


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import sparse_operation_kit as sok
    import tensorflow as tf

    sok.init("single")  # also turns on TensorFlow's memory growth: SOK's tables and Torch share the GPU
    try:
        import torch

        torch = torch if torch.cuda.is_available() else None
    except ImportError:
        torch = None
    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
        name = tf.config.experimental.get_device_details(tf.config.list_physical_devices("GPU")[0]).get("device_name")
    else:
        name = f"no GPU: CPU ({platform.processor() or platform.machine()})"
    report = Report(str(name))
    print(f"# train_gpu.py on {report.device}, {report.date}; TensorFlow {tf.__version__}, "
          f"torch {getattr(torch, '__version__', 'absent (no CUDA Torch: no torch baselines)')}, "
          f"batch {args.batch}, vocab {args.vocab:,}, cap {args.cap:,}, zipf {args.zipf}, "
          f"best of {args.repeat} x {args.steps} steps", flush=True)  # fmt: skip
    print(f"{'part':13} {'case':22} {'kind':12} {'time':>12} {'throughput':>24} {'ratio':>7}  goal")
    parts = args.only or ["train", "lookup_sparse", "pooled"]
    if "train" in parts:
        bench_train(args, report, torch)
    if "lookup_sparse" in parts:
        bench_lookup_sparse(args, report)
    if "pooled" in parts:
        bench_pooled(args, report, torch)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": report.device, "date": report.date, "argv": sys.argv[1:], "rows": report.rows}, f,
                      indent=1)  # fmt: skip
    missed = [f"{r['part']} {r['case']} {r['kind']}" for r in report.rows if r.get("met") is False]
    if missed:
        print(f"goals missed: {'; '.join(missed)}")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
