#!/usr/bin/env python
"""The demo's DLRM with SOK tables against the same DLRM with ``tf.keras.layers.Embedding`` per
feature, in one run: training samples/s of each, their ratio, and the eval AUC of each after the
same steps on the same batches.

Both models share everything but the embeddings: the ``DenseTower`` (bottom MLP, dot interaction,
top MLP; same seed), the data (Criteo-shaped batches of ``sparse_operation_kit.demo.criteo``, made
before timing and cycled), Adagrad on the tables and Adam on the dense layers, one ``tf.function``
per step. SOK: the 26 tables through one ``sok.lookup_sparse`` (``--tables``: the demo's "mixed" by
default, dynamic tables for the large features and ``sok.Variable`` for the others); baseline: 26
``tf.keras.layers.Embedding`` and 26 gathers. Each model takes ``--warmup`` untimed steps
(tracing), then ``--steps`` timed ones, in turns of ``--chunk`` steps (baseline, SOK, baseline, ...)
so that load coming and going on the machine is shared by both.

Usage::

    python benchmarks/dlrm.py                      # 600 steps of 4096, dim 16, largest table 128Ki rows
    python benchmarks/dlrm.py --steps 100 --tables mixed --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
from machine import load_average  # noqa: E402
from sparse_operation_kit.demo.criteo import NUM_CATEGORICAL, CriteoGenerator  # noqa: E402
from sparse_operation_kit.demo.dlrm import DenseTower, SokEmbeddings  # noqa: E402
from sparse_operation_kit.demo.train import AUC_THRESHOLDS  # noqa: E402
from sparse_operation_kit.optimizer import OptimizerWrapper  # noqa: E402

#: SOK / Keras samples/s to reach: on the CPU at np 1, and on a GPU (an H100) under a CUDA TensorFlow.
GOAL_RATIO = {"cpu": 1.3, "gpu": 3.0}
GOAL_AUC_GAP = 0.002


class KerasEmbeddings:
    """One ``tf.keras.layers.Embedding`` per feature, initialised as SokEmbeddings' static tables."""

    def __init__(self, rows: list[int], dim: int, seed: int) -> None:
        init = tf.keras.initializers.RandomUniform(-0.05, 0.05, seed=seed)
        self.layers = [tf.keras.layers.Embedding(r, dim, embeddings_initializer=init) for r in rows]
        for layer in self.layers:
            layer.build((None,))
        self.tables = [layer.embeddings for layer in self.layers]

    def __call__(self, ids: tf.Tensor) -> list[tf.Tensor]:
        return [layer(ids[:, i]) for i, layer in enumerate(self.layers)]


def make_trainer(embeddings, dim: int, args: argparse.Namespace, sparse_optimizer):
    tower = DenseTower(dim, seed=args.seed)
    tower.build_for()
    dense_opt = tf.keras.optimizers.Adam(learning_rate=1e-3)
    tables, dense_vars = embeddings.tables, tower.trainable_variables
    dense_opt.build(dense_vars)

    @tf.function(autograph=False)
    def step(dense, ids, labels):
        with tf.GradientTape() as tape:
            logits = tower((dense, embeddings(ids)))
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
        grads = tape.gradient(loss, tables + dense_vars)
        sparse_optimizer.apply_gradients(zip(grads[: len(tables)], tables))
        dense_opt.apply_gradients(zip(grads[len(tables) :], dense_vars))
        return loss

    @tf.function(autograph=False)
    def predict(dense, ids):
        return tf.sigmoid(tower((dense, embeddings(ids))))

    return step, predict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--chunk", type=int, default=50, help="steps per turn")
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--max-rows", type=int, default=1 << 17)
    parser.add_argument("--tables", choices=("static", "dynamic", "mixed"), default="mixed")
    parser.add_argument("--pool", type=int, default=100, help="distinct training batches, made before timing")
    parser.add_argument("--eval-batches", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()

    gen = CriteoGenerator(seed=args.seed, max_rows=args.max_rows)
    pool = list(gen.dataset(min(args.pool, args.steps + args.warmup), args.batch_size))
    evals = list(gen.dataset(args.eval_batches, args.batch_size, "eval"))
    lr = 0.05
    models = {
        "keras": make_trainer(
            KerasEmbeddings(list(gen.rows), args.dim, args.seed),
            args.dim,
            args,
            tf.keras.optimizers.Adagrad(learning_rate=lr),
        ),
        "sok": make_trainer(
            SokEmbeddings(gen.rows, args.dim, args.tables, seed=args.seed),
            args.dim,
            args,
            OptimizerWrapper(tf.keras.optimizers.Adagrad(learning_rate=lr)),
        ),
    }
    seconds = dict.fromkeys(models, 0.0)
    done = dict.fromkeys(models, 0)
    for step, _ in models.values():
        for i in range(args.warmup):
            step(*pool[i % len(pool)])
    load_before = load_average()
    while min(done.values()) < args.steps:
        for name, (step, _) in models.items():
            count = min(args.chunk, args.steps - done[name])
            start = time.perf_counter()
            for i in range(done[name], done[name] + count):
                loss = step(*pool[(args.warmup + i) % len(pool)])
            float(loss)
            seconds[name] += time.perf_counter() - start
            done[name] += count
    figures = {"config": vars(args), "load_average": [load_before, load_average()]}
    for name, (_, predict) in models.items():
        auc = tf.keras.metrics.AUC(num_thresholds=AUC_THRESHOLDS)
        for dense, ids, labels in evals:
            auc.update_state(labels, predict(dense, ids))
        figures[name] = {"samples_per_s": args.steps * args.batch_size / seconds[name], "auc": float(auc.result())}
    ratio = figures["sok"]["samples_per_s"] / figures["keras"]["samples_per_s"]
    gap = figures["sok"]["auc"] - figures["keras"]["auc"]
    figures["ratio"], figures["auc_gap"] = ratio, gap
    print(
        f"DLRM, {NUM_CATEGORICAL} tables ({sum(gen.rows):,} rows, dim {args.dim}), {args.steps} steps of "
        f"{args.batch_size}, tables {args.tables!r}; load average {figures['load_average']}"
    )
    for name in models:
        print(
            f"  {name:6s} {figures[name]['samples_per_s'] / 1e3:8.1f}k samples/s   eval AUC {figures[name]['auc']:.4f}"
        )
    goal = GOAL_RATIO["gpu" if tf.config.list_logical_devices("GPU") else "cpu"]
    print(f"  SOK / Keras: {ratio:.2f}x (goal >= {goal}x), AUC difference {gap:+.4f} (goal within {GOAL_AUC_GAP})")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main()
