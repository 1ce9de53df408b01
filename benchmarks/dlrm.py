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
baseline, ...) so that load coming and going on the machine is shared by both.

Usage::

    python benchmarks/dlrm.py                      # 600 steps of 4096, dim 16, largest table 128Ki rows
    python benchmarks/dlrm.py --steps 100 --tables mixed --json out.json
    python benchmarks/dlrm.py --model dcnv2 --mlperf --batch-size 65536 --precision mixed_bfloat16   # GPU
    python benchmarks/dlrm.py --sparse-optimizer rowwise     # sok.RowWiseAdagrad on both models' tables
    python benchmarks/dlrm.py --tables mixed --var-types hbm  # every dynamic table in device memory
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import itertools
import json
import os
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import sparse_operation_kit as sok  # noqa: E402
import tensorflow as tf  # noqa: E402
from machine import load_average  # noqa: E402
from sparse_operation_kit.demo.criteo import NUM_CATEGORICAL  # noqa: E402
from sparse_operation_kit.demo.dlrm import SokEmbeddings  # noqa: E402
from sparse_operation_kit.demo.train import AUC_THRESHOLDS, MLPERF_DCNV2, MODELS, DemoConfig, build_model  # noqa: E402
from sparse_operation_kit.optimizer import OptimizerWrapper  # noqa: E402

#: SOK / Keras samples/s to reach: on the CPU at np 1, and on a GPU (an H100) under a CUDA TensorFlow.
GOAL_RATIO = {"cpu": 1.3, "gpu": 3.0}
GOAL_AUC_GAP = 0.002
#: The ``--sparse-optimizer`` choices: Keras' Adagrad (one accumulator per element) or SOK's row-wise
#: one (one per row), given to both models' tables.
SPARSE_OPTIMIZERS = {"adagrad": tf.keras.optimizers.Adagrad, "rowwise": sok.RowWiseAdagrad}
#: ``--mlperf``'s batch per step (MLPerf's DCNv2 reference trains at 65,536 per GPU).
MLPERF_BATCH = 65536
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


def feeder(pool: list[tuple]) -> Any:
    """``next_batch()``: the pool's batches in order, cycled; on a GPU through ``tf.data`` with the
    next two batches copied to it while a step runs (an input pipeline that keeps the GPU fed)."""
    if not tf.config.list_logical_devices("GPU"):
        batches = itertools.cycle(pool)
        return lambda: next(batches)
    stacked = tuple(tf.stack(parts) for parts in zip(*pool))
    dataset = tf.data.Dataset.from_tensor_slices(stacked).repeat()
    iterator = iter(dataset.apply(tf.data.experimental.prefetch_to_device("/GPU:0", buffer_size=2)))
    return lambda: next(iterator)


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
    parser.add_argument("--eval-batches", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    if args.mlperf and args.model != "dcnv2":
        parser.error("--mlperf sizes the dcnv2 model; add --model dcnv2")

    sizes = dict(MLPERF_DCNV2, batch_size=MLPERF_BATCH) if args.mlperf else {}
    given = {"batch_size": args.batch_size, "dim": args.dim, "max_rows": args.max_rows}
    sizes.update({name: value for name, value in given.items() if value is not None})
    var_types = [v.strip() for v in args.var_types.split(",") if v.strip()]
    config = DemoConfig(model=args.model, tables=args.tables, seed=args.seed, var_types=var_types, **sizes)
    keras.mixed_precision.set_global_policy(args.precision)
    gen = config.generator()
    pool = list(gen.dataset(min(args.pool, args.steps + args.warmup), config.batch_size))
    evals = list(gen.dataset(args.eval_batches, config.batch_size, "eval"))
    memory: dict[str, tuple[int, int] | None] = {}
    models = {}
    for name in ("keras", "sok"):
        before = gpu_bytes()
        if name == "keras":
            embeddings = KerasEmbeddings(list(gen.rows), config.dim, config.seed)
            optimizer = SPARSE_OPTIMIZERS[args.sparse_optimizer](learning_rate=config.sparse_lr)
        else:
            embeddings = SokEmbeddings(gen.rows, config.dim, config.tables, config.var_types, seed=config.seed)
            optimizer = OptimizerWrapper(SPARSE_OPTIMIZERS[args.sparse_optimizer](learning_rate=config.sparse_lr))
        models[name] = make_trainer(embeddings, config, optimizer, xla=args.xla)
        models[name][0](*pool[0])  # the tables' optimizer state exists after a first step
        after = gpu_bytes()
        memory[name] = None if before is None or after is None else (after[0] - before[0], after[1] - before[1])
    seconds = dict.fromkeys(models, 0.0)
    done = dict.fromkeys(models, 0)
    feeds = {name: feeder(pool) for name in models}  # each model the pool's batches in the same order
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
        }
    ratio = figures["sok"]["samples_per_s"] / figures["keras"]["samples_per_s"]
    gap = figures["sok"]["auc"] - figures["keras"]["auc"]
    figures["ratio"], figures["auc_gap"] = ratio, gap
    title = "DLRM-DCNv2" if config.model == "dcnv2" else "DLRM"
    tables = config.tables if config.tables == "static" else f"{config.tables} ({'/'.join(config.var_types)})"
    setting = f"tables {tables!r}, {args.sparse_optimizer}, {args.precision}{', XLA towers' if args.xla else ''}"
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
    goal = GOAL_RATIO["gpu" if tf.config.list_logical_devices("GPU") else "cpu"]
    print(f"  SOK / Keras: {ratio:.2f}x (goal >= {goal}x), AUC difference {gap:+.4f} (goal within {GOAL_AUC_GAP})")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(figures, f, indent=2)
    return figures


if __name__ == "__main__":
    main()
