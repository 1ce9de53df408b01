#!/usr/bin/env python
"""The demo's models with SOK tables against the same models with ``tf.keras.layers.Embedding`` per
feature, in one run: training samples/s of each, their ratio, the eval AUC of each after the same
steps on the same batches, and on a GPU the memory each model's tables and state take.

``--model dlrm`` (the default): the demo's DLRM, one id per feature. ``--model dcnv2``: MLPerf's
DLRM-DCNv2 on multi-hot data (``--mlperf``: MLPerf's sizes, dim 128 and its MLPs and cross network,
tables capped at ``--max-rows``), the model of issue 38. Both models of a run share everything but
the embeddings: the tower (same seed), the data (Criteo-shaped batches of
``sparse_operation_kit.demo.criteo``, made before timing and cycled; on a GPU fed through
``tf.data`` with the next batches copied to the device during a step), Adagrad on the tables
(``--sparse-optimizer rowwise``: ``sok.RowWiseAdagrad``, one accumulator per row) and Adam on the
dense layers, one ``tf.function`` per step, and ``--precision`` (a Keras policy:
``mixed_bfloat16`` computes the towers in bfloat16; tables and their state stay float32 either
way). SOK: the 26 tables through one ``sok.lookup_sparse`` (``--tables``: the demo's "mixed" by
default, dynamic tables for the large features and ``sok.Variable`` for the others); baseline: 26
``tf.keras.layers.Embedding`` (multi-hot: the sum of a bag's rows). Each model takes ``--warmup``
untimed steps (tracing), then ``--steps`` timed ones, in turns of ``--chunk`` steps (baseline, SOK,
baseline, ...) so that load coming and going on the machine is shared by both. ``--trace-steps N``
then traces N more steps of each model and splits their time by part (``step_part``: lookup,
update, dense, input), from the GPU's kernels and copies or, on a CPU, the host's ops, and sets
SOK's tables' part (lookup + update) against its bandwidth floor: ``floor_bytes`` of a batch over
the bandwidth of a device-to-device copy measured in the same run (``copy_bandwidth``).

Usage::

    python benchmarks/dlrm.py                      # 600 steps of 4096, dim 16, largest table 128Ki rows
    python benchmarks/dlrm.py --steps 100 --tables mixed --json out.json
    python benchmarks/dlrm.py --model dcnv2 --mlperf --batch-size 65536 --precision mixed_bfloat16   # GPU
    python benchmarks/dlrm.py --sparse-optimizer rowwise     # sok.RowWiseAdagrad on both models' tables
    python benchmarks/dlrm.py --tables mixed --var-types hbm  # every dynamic table in device memory
    python benchmarks/dlrm.py --trace-steps 5      # then each model's step time by part (lookup, update, ...)
    python benchmarks/dlrm.py --input gpu          # batches already in GPU memory (int64 ids)

On a GPU, give int64 ids: TensorFlow keeps int32 tensors of its GPU device in host memory, so int32
ids "in GPU memory" are sliced on the host and copied to the GPU in every step (26 copies per
DCNv2 step), and int32 ids from ``tf.data`` are copied back to the host first.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import itertools
import json
import os
import tempfile
import time
from collections import Counter
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import sparse_operation_kit as sok  # noqa: E402
import tensorflow as tf  # noqa: E402
from machine import load_average  # noqa: E402
from sparse_operation_kit.demo.criteo import NUM_CATEGORICAL  # noqa: E402
from sparse_operation_kit.demo.dlrm import SokEmbeddings  # noqa: E402
from sparse_operation_kit.demo.train import AUC_THRESHOLDS, MLPERF_DCNV2, MODELS, DemoConfig, build_model  # noqa: E402
from sparse_operation_kit.dtypes import STATIC_ROW_DTYPES  # noqa: E402
from sparse_operation_kit.optimizer import OptimizerWrapper  # noqa: E402

#: SOK / Keras samples/s to reach: on the CPU at np 1, and on a GPU (an H100) under a CUDA TensorFlow.
GOAL_RATIO = {"cpu": 1.3, "gpu": 3.0}
GOAL_AUC_GAP = 0.002
#: SOK's tables' part of a step (lookup + update, traced) over its bandwidth floor (``floor_bytes``
#: at ``copy_bandwidth``): the goal on a GPU.
GOAL_FLOOR = 2.0
#: The ``--sparse-optimizer`` choices: Keras' Adagrad (one accumulator per element) or SOK's row-wise
#: one (one per row), given to both models' tables.
SPARSE_OPTIMIZERS = {"adagrad": tf.keras.optimizers.Adagrad, "rowwise": sok.RowWiseAdagrad}
#: ``--mlperf``'s batch per step (MLPerf's DCNv2 reference trains at 65,536 per GPU).
MLPERF_BATCH = 65536
#: The ``--input`` choices: where a step's batch comes from (see ``feeder``).
INPUTS = ("host", "gpu")
#: The ``--id-dtype`` choices: the ids' dtype in the batches of both models.
ID_DTYPES = {"int64": tf.int64, "int32": tf.int32}
#: The ``--precision`` choices: Keras dtype policies (float16 would need loss scaling of both optimizers).
PRECISIONS = ("float32", "mixed_bfloat16")


class KerasEmbeddings:
    """One ``tf.keras.layers.Embedding`` per feature, initialised as SokEmbeddings' static tables;
    called as :class:`~sparse_operation_kit.demo.dlrm.SokEmbeddings` is (``__call__`` one id per
    feature, ``lookup`` the sum of each feature's bag)."""

    def __init__(self, rows: list[int], dim: int, seed: int) -> None:
        init = tf.keras.initializers.RandomUniform(-0.05, 0.05, seed=seed)
        self.layers = [tf.keras.layers.Embedding(r, dim, embeddings_initializer=init) for r in rows]
        for layer in self.layers:
            layer.build((None,))
        self.tables = [layer.embeddings for layer in self.layers]

    def __call__(self, ids: tf.Tensor) -> list[tf.Tensor]:
        return [layer(ids[:, i]) for i, layer in enumerate(self.layers)]

    def lookup(self, bags: list[tf.RaggedTensor]) -> list[tf.Tensor]:
        return [tf.reduce_sum(layer(bag), axis=1) for bag, layer in zip(bags, self.layers)]


def make_trainer(embeddings, config: DemoConfig, sparse_optimizer, xla: bool = False):
    """The model's training step and prediction; with ``xla`` the tower runs as one XLA cluster
    (``jit_compile``) while the lookups and the tables' updates stay outside it."""
    tower, embed, _ = build_model(config, embeddings)
    tower.build_for()

    def call_tower(dense, pooled):
        return tower((dense, pooled))

    dense_part = tf.function(call_tower, jit_compile=True) if xla else call_tower
    dense_opt = tf.keras.optimizers.Adam(learning_rate=config.dense_lr)
    tables, dense_vars = embeddings.tables, tower.trainable_variables
    dense_opt.build(dense_vars)

    @tf.function(autograph=False)
    def step(dense, ids, labels):
        with tf.GradientTape() as tape:
            logits = tf.cast(dense_part(dense, embed(ids)), tf.float32)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
        grads = tape.gradient(loss, tables + dense_vars)
        sparse_optimizer.apply_gradients(zip(grads[: len(tables)], tables))
        dense_opt.apply_gradients(zip(grads[len(tables) :], dense_vars))
        return loss

    @tf.function(autograph=False)
    def predict(dense, ids):
        return tf.sigmoid(tf.cast(dense_part(dense, embed(ids)), tf.float32))

    return step, predict


def feeder(pool: list[tuple], source: str = "host") -> Any:
    """``next_batch()``: the pool's batches in order, cycled; on a GPU with ``source`` "host" through
    ``tf.data`` with the next two batches copied to it while a step runs (an input pipeline that
    keeps the GPU fed), with "gpu" from copies of the pool made in GPU memory before timing (the
    step without its input's copy)."""
    gpu = bool(tf.config.list_logical_devices("GPU"))
    if not gpu or source == "gpu":
        if gpu:
            with tf.device("/GPU:0"):
                pool = [tuple(tf.identity(part) for part in batch) for batch in pool]
        batches = itertools.cycle(pool)
        return lambda: next(batches)
    stacked = tuple(tf.stack(parts) for parts in zip(*pool))
    dataset = tf.data.Dataset.from_tensor_slices(stacked).repeat()
    iterator = iter(dataset.apply(tf.data.experimental.prefetch_to_device("/GPU:0", buffer_size=2)))
    return lambda: next(iterator)


def step_part(op_type: str) -> str:
    """The part of a training step that a TensorFlow op type (or a copy) belongs to, for
    ``--trace-steps``' split: "input" (batches copied to the GPU), "update" (the tables' optimizer
    ops: SOK's and TensorFlow's ``*Apply*``), "lookup" (SOK's other ops: lookups, their gradients,
    the exchange) and "dense" (everything else: the towers, the loss, the dense optimizer, Keras'
    own embedding ops)."""
    if op_type == "memcpy host-to-device":
        return "input"
    if "Apply" in op_type:
        return "update"
    return "lookup" if op_type.startswith("Sok") else "dense"


def traced_split(step, next_batch, steps: int) -> dict:
    """Traces ``steps`` training steps under TensorFlow's profiler (``profile_step.py``'s trace and
    summary) and splits their time by ``step_part``: per step, the GPU's kernels and copies by their
    op's type, or on a CPU the host's time in each op; milliseconds."""
    from profile_step import summarize_xplane, trace

    path = trace(lambda _: step(*next_batch()), steps, tempfile.mkdtemp(prefix="sok-dlrm-trace-"))
    summary = summarize_xplane(path, steps, top=12)
    gpus = [value for key, value in summary.items() if key.startswith("/device:GPU")]
    if gpus:
        by_type = [(op_type, us) for op_type, us in gpus[0]["by_op_type"]]
        busy, window = gpus[0]["busy_us_per_step"] / 1e3, gpus[0]["window_us_per_step"] / 1e3
    else:
        by_type = [(op_type, us) for op_type, us, _ in summary["op_types"]]
        busy, window = None, None
    parts: Counter = Counter({part: 0.0 for part in ("lookup", "update", "dense", "input")})
    for op_type, us in by_type:
        parts[step_part(op_type)] += us / 1e3
    return {
        "device": "gpu" if gpus else "cpu",
        "busy_ms": busy,
        "window_ms": window,
        "parts_ms": dict(parts),
        "top_ms": [(op_type, us / 1e3) for op_type, us in by_type[:12]],
    }


def floor_bytes(
    ids: np.ndarray, widths: list[int], dim: int, state_columns: int, row_itemsize: int = 4
) -> dict[str, int]:
    """The bytes the tables' part of one training step must move at least, for a batch's ids
    ``[B, sum(widths)]`` (feature ``i`` the next ``widths[i]`` columns), table rows of ``dim``
    elements of ``row_itemsize`` bytes (4: float32, 2: float16 / bfloat16) and ``state_columns``
    floats of optimizer state per row: the ids read once; forward: each id's row read, each sample's
    pooled row (float32) written; backward: each pooled gradient row read, a float32 gradient row per
    distinct id written; update: that row read, the table's row and its state read and written.

    Example::

        floor_bytes(np.array([[1, 1], [2, 1]]), [2], dim=4, state_columns=1)["distinct"]   # 2
    """
    batch, tables, row, state = ids.shape[0], len(widths), 4 * dim, 4 * state_columns
    table_row = row_itemsize * dim
    distinct, start = 0, 0
    for width in widths:
        distinct += int(np.unique(ids[:, start : start + width]).size)
        start += width
    out = {
        "ids": int(ids.size * ids.itemsize),
        "forward": int(ids.size * table_row + batch * tables * row),
        "backward": batch * tables * row + distinct * row,
        "update": distinct * (row + 2 * table_row + 2 * state),
    }
    return {**out, "total": sum(out.values()), "distinct": distinct}


def copy_bandwidth(mib: int = 1024, repeat: int = 5) -> float:
    """Bytes per second of a device-to-device copy on the GPU (else the CPU): twice the size (read
    and written) over the best of ``repeat`` copies of ``mib`` MiB."""
    device = "/GPU:0" if tf.config.list_logical_devices("GPU") else "/CPU:0"
    with tf.device(device):
        x = tf.ones([mib * 2**20 // 4], tf.float32)
        copy = tf.function(lambda t: tf.raw_ops.DeepCopy(x=t)[:1])
        copy(x).numpy()
        best = float("inf")
        for _ in range(repeat):
            start = time.perf_counter()
            copy(x).numpy()
            best = min(best, time.perf_counter() - start)
    return 2 * x.shape[0] * 4 / best


def print_split(name: str, split: dict) -> None:
    parts = ", ".join(f"{part} {ms:.2f}" for part, ms in split["parts_ms"].items())
    if split["device"] == "gpu":
        print(f"  {name:6s} GPU per step: busy {split['busy_ms']:.2f} of {split['window_ms']:.2f} ms; by part "
              f"(kernels and copies summed): {parts} ms")  # fmt: skip
    else:
        print(f"  {name:6s} host time per step in TensorFlow ops, by part: {parts} ms")
    print("         " + "; ".join(f"{op_type} {ms:.2f}" for op_type, ms in split["top_ms"][:8]))


def gpu_bytes() -> tuple[int, int] | None:
    """Bytes in use on this process's GPU now (None without a GPU): as the CUDA driver counts them
    (dynamic tables allocate from CUDA directly, which TensorFlow's own count does not see), and
    TensorFlow's tensors (static tables, Keras' variables), which its allocator may place in memory
    it already holds, freed by another model's step: the driver then sees no change."""
    if not tf.config.list_logical_devices("GPU"):
        return None
    driver = ctypes.CDLL("libcuda.so.1")
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    result = driver.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
    if result != 0:
        raise RuntimeError(f"cuMemGetInfo_v2 returned CUDA error {result}")
    return int(total.value - free.value), int(tf.config.experimental.get_memory_info("GPU:0")["current"])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=MODELS, default="dlrm")
    parser.add_argument("--mlperf", action="store_true", help="dcnv2: MLPerf's sizes for those not given")
    parser.add_argument("--precision", choices=PRECISIONS, default="float32", help="Keras dtype policy")
    parser.add_argument("--xla", action="store_true", help="the towers under XLA (jit_compile), lookups outside")
    parser.add_argument(
        "--sparse-optimizer", choices=sorted(SPARSE_OPTIMIZERS), default="adagrad", help="both models' tables"
    )
    parser.add_argument(
        "--row-dtype", choices=STATIC_ROW_DTYPES, default="float32",
        help="SOK's static tables' rows (float16 / bfloat16: with --sparse-optimizer rowwise); Keras' stay float32",
    )  # fmt: skip
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--chunk", type=int, default=50, help="steps per turn")
    parser.add_argument("--batch-size", type=int, default=None, help=f"default 4096 (--mlperf: {MLPERF_BATCH})")
    parser.add_argument("--dim", type=int, default=None, help="default 16 (--mlperf: 128)")
    parser.add_argument("--max-rows", type=int, default=None, help="default 128Ki (--mlperf: 4Mi)")
    parser.add_argument("--tables", choices=("static", "dynamic", "mixed"), default="mixed")
    parser.add_argument(
        "--var-types", default="hbm,hybrid", help="the dynamic tables' var_types, in turn (comma-separated)"
    )
    parser.add_argument("--pool", type=int, default=100, help="distinct training batches, made before timing")
    parser.add_argument("--input", choices=INPUTS, default="host", help="host: tf.data prefetched to the GPU; gpu: "
                        "the pool's batches in GPU memory (no copy in the step)")  # fmt: skip
    parser.add_argument("--id-dtype", choices=sorted(ID_DTYPES), default="int64",
                        help="the batches' ids (int64 on a GPU: see the docstring)")  # fmt: skip
    parser.add_argument("--eval-batches", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--trace-steps", type=int, default=0, help="after timing, trace this many steps of each model: time by part"
    )
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    if args.trace_steps < 0:
        parser.error(f"--trace-steps {args.trace_steps} is negative; give 0 (no trace) or more")
    if args.row_dtype != "float32" and (args.sparse_optimizer != "rowwise" or args.tables != "static"):
        parser.error(f"--row-dtype {args.row_dtype} takes --sparse-optimizer rowwise and --tables static")
    if args.mlperf and args.model != "dcnv2":
        parser.error("--mlperf sizes the dcnv2 model; add --model dcnv2")

    sizes = dict(MLPERF_DCNV2, batch_size=MLPERF_BATCH) if args.mlperf else {}
    given = {"batch_size": args.batch_size, "dim": args.dim, "max_rows": args.max_rows}
    sizes.update({name: value for name, value in given.items() if value is not None})
    var_types = [v.strip() for v in args.var_types.split(",") if v.strip()]
    config = DemoConfig(model=args.model, tables=args.tables, seed=args.seed, var_types=var_types, **sizes)
    keras.mixed_precision.set_global_policy(args.precision)
    gen = config.generator()
    id_dtype = ID_DTYPES[args.id_dtype]
    pool = [
        (d, tf.cast(i, id_dtype), y)
        for d, i, y in gen.dataset(min(args.pool, args.steps + args.warmup), config.batch_size)
    ]
    evals = [(d, tf.cast(i, id_dtype), y) for d, i, y in gen.dataset(args.eval_batches, config.batch_size, "eval")]
    memory: dict[str, tuple[int, int] | None] = {}
    models = {}
    for name in ("keras", "sok"):
        before = gpu_bytes()
        if name == "keras":
            embeddings = KerasEmbeddings(list(gen.rows), config.dim, config.seed)
            optimizer = SPARSE_OPTIMIZERS[args.sparse_optimizer](learning_rate=config.sparse_lr)
        else:
            embeddings = SokEmbeddings(
                gen.rows, config.dim, config.tables, config.var_types, seed=config.seed, row_dtype=args.row_dtype
            )
            optimizer = OptimizerWrapper(SPARSE_OPTIMIZERS[args.sparse_optimizer](learning_rate=config.sparse_lr))
        models[name] = make_trainer(embeddings, config, optimizer, xla=args.xla)
        models[name][0](*pool[0])  # the tables' optimizer state exists after a first step
        after = gpu_bytes()
        memory[name] = None if before is None or after is None else (after[0] - before[0], after[1] - before[1])
    seconds = dict.fromkeys(models, 0.0)
    done = dict.fromkeys(models, 0)
    feeds = {name: feeder(pool, args.input) for name in models}  # each model the pool's batches in the same order
    for name, (step, _) in models.items():
        for _ in range(args.warmup):
            step(*feeds[name]())
    load_before = load_average()
    while min(done.values()) < args.steps:
        for name, (step, _) in models.items():
            count = min(args.chunk, args.steps - done[name])
            start = time.perf_counter()
            for _ in range(count):
                loss = step(*feeds[name]())
            float(loss)
            seconds[name] += time.perf_counter() - start
            done[name] += count
    steps = {name: step for name, (step, _) in models.items()}
    splits = {
        name: traced_split(step, feeds[name], args.trace_steps) for name, step in steps.items() if args.trace_steps
    }
    floor = None
    if args.trace_steps:
        widths = list(getattr(gen, "hotness", [1] * NUM_CATEGORICAL))
        state = 1 if args.sparse_optimizer == "rowwise" else config.dim
        moved = floor_bytes(np.asarray(pool[0][1]), widths, config.dim, state, tf.as_dtype(args.row_dtype).size)
        bandwidth = copy_bandwidth()
        part = splits["sok"]["parts_ms"]
        floor = {"bytes": moved, "copy_bytes_per_s": bandwidth, "floor_ms": moved["total"] / bandwidth * 1e3,
                 "embedding_ms": part["lookup"] + part["update"]}  # fmt: skip
    figures = {
        "config": vars(args),
        "demo_config": dataclasses.asdict(config),
        "load_average": [load_before, load_average()],
    }
    for name, (_, predict) in models.items():
        auc = tf.keras.metrics.AUC(num_thresholds=AUC_THRESHOLDS)
        for dense, ids, labels in evals:
            auc.update_state(labels, predict(dense, ids))
        figures[name] = {
            "samples_per_s": args.steps * config.batch_size / seconds[name],
            "auc": float(auc.result()),
            "gpu_bytes_of_model": None if memory[name] is None else memory[name][0],
            "tf_tensor_bytes_of_model": None if memory[name] is None else memory[name][1],
            "step_split": splits.get(name),
        }
    figures["embedding_floor"] = floor
    ratio = figures["sok"]["samples_per_s"] / figures["keras"]["samples_per_s"]
    gap = figures["sok"]["auc"] - figures["keras"]["auc"]
    figures["ratio"], figures["auc_gap"] = ratio, gap
    title = "DLRM-DCNv2" if config.model == "dcnv2" else "DLRM"
    tables = config.tables if config.tables == "static" else f"{config.tables} ({'/'.join(config.var_types)})"
    setting = f"tables {tables!r} ({args.row_dtype} rows), {args.sparse_optimizer}, {args.precision}"
    setting += f"{', XLA towers' if args.xla else ''}, "
    setting += f"{args.id_dtype} ids from {'GPU memory' if args.input == 'gpu' else 'the host (tf.data)'}"
    print(
        f"{title}, {NUM_CATEGORICAL} tables ({sum(gen.rows):,} rows, dim {config.dim}), {args.steps} steps of "
        f"{config.batch_size}, {setting}; load average {figures['load_average']}"
    )
    for name in models:
        held = memory[name]
        gpu = (
            ""
            if held is None
            else f"   GPU memory of the model: driver +{held[0] / 2**30:.2f} GiB, TF tensors +{held[1] / 2**30:.2f} GiB"
        )
        rate, auc = figures[name]["samples_per_s"] / 1e3, figures[name]["auc"]
        print(f"  {name:6s} {rate:8.1f}k samples/s   eval AUC {auc:.4f}{gpu}")
    for name, split in splits.items():
        print_split(name, split)
    if floor is not None:
        embed, least = floor["embedding_ms"], floor["floor_ms"]
        moved, speed = floor["bytes"], floor["copy_bytes_per_s"] / 1e9
        print(f"  SOK's tables (lookup + update) {embed:.2f} ms a step against its floor {least:.2f} ms "
              f"({moved['total'] / 1e9:.2f} GB at a copy's {speed:.0f} GB/s, {moved['distinct']:,} distinct ids): "
              f"{embed / least:.2f}x (goal <= {GOAL_FLOOR}x)")  # fmt: skip
    goal = GOAL_RATIO["gpu" if tf.config.list_logical_devices("GPU") else "cpu"]
    print(f"  SOK / Keras: {ratio:.2f}x (goal >= {goal}x), AUC difference {gap:+.4f} (goal within {GOAL_AUC_GAP})")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(figures, f, indent=2)
    return figures


if __name__ == "__main__":
    main()
