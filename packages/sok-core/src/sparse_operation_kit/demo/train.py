"""Training of the demo's model (``model="dlrm"``: the DLRM of :mod:`~.dlrm` on one-hot data;
``"dcnv2"``: MLPerf's DLRM-DCNv2 of :mod:`~.dcnv2` on multi-hot data): epochs of Criteo-shaped
batches, evaluation AUC after each, then ``sok.dump`` of the tables and a PNG of loss and AUC next
to the checkpoint.

On one process, or under ``horovodrun -np N``: then the ranks train one model together, data
parallel for the dense layers (``sok.broadcast_dense_variables`` at the start,
``sok.allreduce_dense_gradients`` each step) and model parallel for the tables
(``sok.lookup_sparse``). Each rank takes its slice of every global batch, and the loss of a rank is
its summed log-loss divided by the global batch, so N ranks take the same steps as one process on
the same global batches.

What :func:`train` writes into ``output``::

    checkpoint/         sok.dump of the 26 tables (and the sparse optimizer's state)
    dense.npz           the tower's weights (arrays w0, w1, ... in tower.weights order)
    eval_predictions.npy  P(click) of the final evaluation, in eval-set order
    demo.json           the configuration, the table names and kinds, and the results
    training.png        loss over steps and evaluation AUC over epochs

Example::

    results = train(DemoConfig(steps=300), "build/demo")
    results["eval_auc"][-1]
    train(DemoConfig(model="dcnv2", steps=50, batch_size=512), "build/dcnv2")   # multi-hot, 214 ids a sample
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sparse_operation_kit.demo.criteo import MLPERF_HOTNESS, check_hotness
from sparse_operation_kit.validate import is_positive_int

__all__ = [
    "MODELS",
    "MLPERF_DCNV2",
    "DemoConfig",
    "train",
    "build_model",
    "CONFIG_FILE",
    "CHECKPOINT_DIR",
    "DENSE_FILE",
    "PREDICTIONS_FILE",
    "PLOT_FILE",
]

CONFIG_FILE = "demo.json"
CHECKPOINT_DIR = "checkpoint"
DENSE_FILE = "dense.npz"
PREDICTIONS_FILE = "eval_predictions.npy"
PLOT_FILE = "training.png"
#: Thresholds of the Keras AUC metric (of training and of serving alike).
AUC_THRESHOLDS = 2000
#: Values of ``DemoConfig.model``: the DLRM (one-hot data) and MLPerf's DLRM-DCNv2 (multi-hot data).
MODELS = ("dlrm", "dcnv2")
#: MLPerf Training's DLRM-DCNv2 sizes (``sok demo --model dcnv2 --mlperf``): dim 128, bottom MLP
#: 512-256-128, top MLP 1024-1024-512-256-1, 3 cross layers of rank 512, MLPerf's hotness, and the
#: tables capped at 4 Mi rows: uncapped, MLPerf's 204 M rows take 209 GB at dim 128 with Adagrad's
#: accumulator (rows x 128 x 4 bytes x 2); capped at 4 Mi, 25.2 M rows take 25.8 GB, which leaves room
#: on one 80 GB GPU for the hkv tables' headroom (twice their rows), the lookups of a large batch and
#: the dense part (capped at 8 Mi, 46.1 M rows would take 47.2 GB before any of those).
MLPERF_DCNV2: dict[str, Any] = {
    "dim": 128,
    "bottom": [512, 256],
    "top": [1024, 1024, 512, 256],
    "cross_layers": 3,
    "low_rank": 512,
    "hotness": list(MLPERF_HOTNESS),
    "max_rows": 1 << 22,
}


@dataclass
class DemoConfig:
    """What the demo trains. The defaults finish ``make demo`` in a few minutes on 2 CPU cores; they
    are small for either model (:data:`MLPERF_DCNV2` holds MLPerf's sizes of the DCNv2).

    Args:
        steps: training steps (global batches) in all.
        epochs: evaluations during training (after every ``steps / epochs`` steps).
        batch_size: the global batch (split over the ranks).
        eval_batches: global batches of the evaluation set.
        dim: embedding width.
        max_rows: ``"dlrm"``: rows of the largest table (Criteo's cardinalities scaled to it);
            ``"dcnv2"``: the cap on each table's rows (MLPerf's table sizes capped at it).
        tables: ``"static"``, ``"dynamic"`` or ``"mixed"`` (:class:`~.dlrm.SokEmbeddings`).
        var_types: the var_types of the dynamic tables, in turn.
        dynamic_rows: with ``"mixed"``, features of at least this many rows are dynamic.
        bottom / top: hidden widths of the MLPs.
        hotness: ``"dcnv2"``: ids per sample of each of the 26 features (MLPerf's by default).
        cross_layers / low_rank: ``"dcnv2"``: layers and rank of the cross network.
        sparse_lr / dense_lr: learning rates of Adagrad (tables) and Adam (dense layers).
        seed: data, hidden model and initial weights.
        train_tsv / eval_tsv: Criteo TSV day files (:func:`~.criteo.read_criteo_tsv`) to train and
            evaluate on instead of generated data (both or neither; the training files are read
            again from the start when ``steps`` needs more lines). Real data has no known ceiling.
            ``"dlrm"`` only: the day files are one-hot.
        model: ``"dlrm"`` (:mod:`~.dlrm`, one id per feature) or ``"dcnv2"`` (:mod:`~.dcnv2`,
            MLPerf's DLRM-DCNv2 on multi-hot data, :class:`~.criteo.MultiHotGenerator`).
    """

    steps: int = 1200
    epochs: int = 4
    batch_size: int = 4096
    eval_batches: int = 8
    dim: int = 16
    max_rows: int = 1 << 17
    tables: str = "mixed"
    var_types: list[str] = field(default_factory=lambda: ["hbm", "hybrid"])
    dynamic_rows: int = 4096
    bottom: list[int] = field(default_factory=lambda: [64, 32])
    top: list[int] = field(default_factory=lambda: [128, 64])
    hotness: list[int] = field(default_factory=lambda: list(MLPERF_HOTNESS))
    cross_layers: int = 3
    low_rank: int = 64
    sparse_lr: float = 0.05
    dense_lr: float = 0.001
    seed: int = 0
    train_tsv: list[str] = field(default_factory=list)
    eval_tsv: list[str] = field(default_factory=list)
    model: str = "dlrm"

    def eval_dataset(self, rank: int = 0, num_ranks: int = 1) -> Any:
        """The evaluation batches (this rank's slice of each): the generator's eval stream, or the
        first ``eval_batches`` batches of ``eval_tsv``."""
        if self.eval_tsv:
            from sparse_operation_kit.demo.criteo import read_criteo_tsv, scaled_cardinalities

            rows = scaled_cardinalities(self.max_rows)
            return read_criteo_tsv(self.eval_tsv, self.batch_size, rows, True, rank, num_ranks).take(self.eval_batches)
        return self.generator().dataset(self.eval_batches, self.batch_size, "eval", rank, num_ranks)

    def train_dataset(self, steps: int, rank: int = 0, num_ranks: int = 1) -> Any:
        """``steps`` training batches (this rank's slice of each)."""
        if self.train_tsv:
            from sparse_operation_kit.demo.criteo import read_criteo_tsv, scaled_cardinalities

            rows = scaled_cardinalities(self.max_rows)
            batches = read_criteo_tsv(self.train_tsv, self.batch_size, rows, True, rank, num_ranks)
            return batches.repeat().take(steps)
        return self.generator().dataset(steps, self.batch_size, "train", rank, num_ranks)

    def generator(self) -> Any:
        """The Criteo-shaped generator of this config (its ``rows`` are the table sizes either way):
        one-hot for ``"dlrm"``, multi-hot of ``hotness`` for ``"dcnv2"``."""
        from sparse_operation_kit.demo.criteo import CriteoGenerator, MultiHotGenerator

        if self.model == "dcnv2":
            return MultiHotGenerator(seed=self.seed, max_rows=self.max_rows, hotness=self.hotness)
        return CriteoGenerator(seed=self.seed, max_rows=self.max_rows)

    def check(self, num_ranks: int) -> None:
        """Raise ValueError naming the first setting that is not valid."""
        if self.model not in MODELS:
            raise ValueError(f"model {self.model!r} is not valid; valid: {', '.join(map(repr, MODELS))}")
        for name in ("steps", "epochs", "batch_size", "eval_batches", "dim", "max_rows", "cross_layers", "low_rank"):
            value = getattr(self, name)
            if not is_positive_int(value, numpy=False):  # Python ints: the config is written to demo.json
                raise ValueError(f"{name} {value!r} is not valid; valid: an integer >= 1")
        for name in ("bottom", "top"):
            widths = list(getattr(self, name))
            if not all(is_positive_int(w, numpy=False) for w in widths):
                raise ValueError(f"{name} {widths!r} is not valid; valid: hidden widths, integers >= 1")
        if self.model == "dcnv2":
            check_hotness(self.hotness)
            if self.train_tsv or self.eval_tsv:
                raise ValueError(
                    "train_tsv / eval_tsv are not valid with model 'dcnv2': Criteo's day files hold one id per "
                    "feature and the DCNv2 trains on multi-hot bags (generated); train on the files with model 'dlrm'"
                )
        if bool(self.train_tsv) != bool(self.eval_tsv):
            raise ValueError(
                f"give both train_tsv and eval_tsv (Criteo day files to train and to evaluate on) or neither, "
                f"got train_tsv={self.train_tsv!r}, eval_tsv={self.eval_tsv!r}"
            )
        if self.epochs > self.steps:
            raise ValueError(f"epochs ({self.epochs}) must not exceed steps ({self.steps})")
        if self.batch_size % num_ranks:
            raise ValueError(
                f"batch_size {self.batch_size} is not a multiple of the {num_ranks} ranks; "
                f"pick a multiple of {num_ranks}"
            )


def _say(rank: int):
    return print if rank == 0 else (lambda *args, **kwargs: None)


def train(config: DemoConfig, output: str) -> dict[str, Any]:
    """Train, evaluate after each epoch, dump, plot (rank 0 writes the files); returns the results
    (``loss`` per step, ``eval_auc`` / ``eval_loss`` per epoch, ``auc_ceiling``, ``samples_per_s``).

    Under ``horovodrun`` it calls ``sok.init()`` when not done yet. Every rank must call it with the
    same config and output. Float32 matmuls compute in float32, not TF32, throughout
    (:func:`~.dlrm.float32_matmuls`), so that serving reproduces the saved predictions.
    """
    from sparse_operation_kit.demo.dlrm import float32_matmuls

    with float32_matmuls():
        return _train(config, output)


def _fed(dataset: Any) -> Any:
    """``dataset``, its next batches copied to this process's GPU while a step runs (where TensorFlow
    sees one: ``sok.init`` pins each rank to its own), so that a step finds its ids on the device."""
    import tensorflow as tf

    if not tf.config.list_logical_devices("GPU"):
        return dataset
    return dataset.apply(tf.data.experimental.prefetch_to_device("/GPU:0", buffer_size=2))


def _train(config: DemoConfig, output: str) -> dict[str, Any]:
    """:func:`train`, inside :func:`~.dlrm.float32_matmuls`."""
    import tensorflow as tf

    from sparse_operation_kit import communication
    from sparse_operation_kit.checkpoint.collective import dump
    from sparse_operation_kit.demo.dlrm import SokEmbeddings
    from sparse_operation_kit.dense_sync import allreduce_dense_gradients, broadcast_dense_variables
    from sparse_operation_kit.lookup import exchange
    from sparse_operation_kit.optimizer import OptimizerWrapper
    from sparse_operation_kit.progress import TqdmCallback

    if "HOROVOD_RANK" in os.environ and communication._tool is None:
        communication.init("horovod")
    comm = communication.tool()
    rank, ranks = comm.rank(), comm.num_ranks()
    config.check(ranks)
    # in the step, the collectives of the tables' exchange (one NCCL communicator on GPU ranks)
    reduce_sum = exchange.of(comm).allreduce_sum if ranks > 1 else comm.allreduce_sum
    say = _say(rank)
    gen = config.generator()
    embeddings = SokEmbeddings(
        gen.rows, config.dim, config.tables, config.var_types, config.dynamic_rows, seed=config.seed
    )
    tower, embed, title = build_model(config, embeddings)
    tower.build_for()
    broadcast_dense_variables(tower.variables)  # equal already (seeded); what a user's model needs
    sparse_opt = OptimizerWrapper(tf.keras.optimizers.Adagrad(learning_rate=config.sparse_lr))
    dense_opt = tf.keras.optimizers.Adam(learning_rate=config.dense_lr)
    tables, dense_vars = embeddings.tables, tower.trainable_variables
    dense_opt.build(dense_vars)
    global_batch = float(config.batch_size)
    say(
        f"\n== {title}, {ranks} rank(s): {len(tables)} tables "
        f"({', '.join(f'{embeddings.kinds.count(k)} {k}' for k in sorted(set(embeddings.kinds)))}; "
        f"{sum(gen.rows):,} ids in all, largest {max(gen.rows):,}), dim {config.dim}, "
        f"{config.steps} steps of {config.batch_size} samples"
    )

    @tf.function(autograph=False)  # no Python control flow to convert (and none of SOK's)
    def train_step(dense: tf.Tensor, ids: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            logits = tower((dense, embed(ids)))
            summed = tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
            loss = summed / global_batch  # this rank's share of the global mean
        grads = tape.gradient(loss, tables + dense_vars)
        grads = allreduce_dense_gradients(grads, tables + dense_vars, op="sum")
        sparse_opt.apply_gradients(zip(grads[: len(tables)], tables))
        dense_opt.apply_gradients(zip(grads[len(tables) :], dense_vars))
        return reduce_sum(loss, name="demo: loss")

    @tf.function(autograph=False)
    def predict(dense: tf.Tensor, ids: tf.Tensor) -> tf.Tensor:
        return tf.sigmoid(tower((dense, embed(ids))))

    auc = tf.keras.metrics.AUC(num_thresholds=AUC_THRESHOLDS)

    def evaluate() -> tuple[float, float, np.ndarray]:
        auc.reset_state()
        probabilities, losses = [], 0.0
        for dense, ids, labels in config.eval_dataset(rank, ranks):
            p = predict(dense, ids)
            auc.update_state(labels, p)
            probabilities.append(p.numpy()[:, 0])
            q = np.clip(probabilities[-1], 1e-7, 1 - 1e-7)
            y = labels.numpy()[:, 0]
            losses += float(-np.sum(y * np.log(q) + (1 - y) * np.log(1 - q)))
        for var in auc.variables:  # the metric over the global eval set
            var.assign(comm.allreduce_sum(tf.convert_to_tensor(var), name=f"demo: auc {var.name}"))
        total = float(comm.allreduce_sum(tf.constant(losses, tf.float64), name="demo: eval loss"))
        if not probabilities:
            raise ValueError(
                f"the evaluation set has no full batch of {config.batch_size} samples ({config.eval_tsv}); give more "
                f"lines or a smaller batch_size"
            )
        batches = len(probabilities)  # eval_batches, or fewer when the eval files are short
        gathered = np.asarray(comm.allgather(tf.constant(np.concatenate(probabilities)), name="demo: predictions"))
        # Rank-major [ranks, batches, local] -> the eval set's order.
        ordered = gathered.reshape(ranks, batches, -1).transpose(1, 0, 2).reshape(-1)
        return float(auc.result()), total / (batches * config.batch_size), ordered

    ceiling = None if config.eval_tsv else _auc_ceiling(gen, config, auc)
    if ceiling is None:
        say(f"training on {config.train_tsv}, evaluating on {config.eval_tsv} (real data: no known AUC ceiling)")
    else:
        say(f"the hidden click model's own AUC on the eval set (the ceiling): {ceiling:.4f}")
    steps_per_epoch = [config.steps // config.epochs + (e < config.steps % config.epochs) for e in range(config.epochs)]
    data = iter(_fed(config.train_dataset(config.steps + 1, rank, ranks)))
    train_step(*next(data))  # trace once, outside the timing (its batch is not counted)
    losses: list[float] = []
    pending: list[tf.Tensor] = []  # losses of steps not yet read: a read waits for the GPU
    results: dict[str, Any] = {"eval_auc": [], "eval_loss": [], "eval_step": [], "auc_ceiling": ceiling}
    seconds = 0.0
    for epoch, count in enumerate(steps_per_epoch):
        with TqdmCallback(desc=f"epoch {epoch + 1}/{config.epochs}", unit="step", disable=rank != 0) as bar:
            bar.set_size(count)
            start = time.perf_counter()
            for _ in range(count):
                pending.append(train_step(*next(data)))
                done = bar.value + 1
                # The text first, then the count: a log's line (at a tenth of the epoch) shows this step's.
                if len(pending) == 10 or done == count:  # the losses read every 10 steps
                    losses.extend(float(loss) for loss in pending)
                    pending.clear()
                    rate = done * config.batch_size / (time.perf_counter() - start)
                    bar.set_postfix_str(f"{rate / 1e3:.1f}k samples/s, loss {np.mean(losses[-10:]):.4f}")
                bar.relative_update(1)
            seconds += time.perf_counter() - start
        value, eval_loss, predictions = evaluate()
        results["eval_auc"].append(value)
        results["eval_loss"].append(eval_loss)
        results["eval_step"].append(len(losses))
        bound = "" if ceiling is None else f" (ceiling {ceiling:.4f})"
        say(f"epoch {epoch + 1}: eval AUC {value:.4f}{bound}, eval log-loss {eval_loss:.4f}")
    results["loss"] = losses
    results["samples_per_s"] = config.steps * config.batch_size / seconds
    say(f"trained {config.steps} steps at {results['samples_per_s'] / 1e3:.1f}k samples/s over {ranks} rank(s)")

    os.makedirs(output, exist_ok=True)
    checkpoint = os.path.join(output, CHECKPOINT_DIR)
    dump(checkpoint, tables, sparse_opt)  # after the last evaluation: the rows it read are in it
    if rank == 0:
        np.savez(os.path.join(output, DENSE_FILE), *[w.numpy() for w in tower.weights])
        np.save(os.path.join(output, PREDICTIONS_FILE), predictions)
        record = {
            "config": dataclasses.asdict(config),
            "ranks": ranks,
            "rows": list(gen.rows),
            "table_names": embeddings.table_names,
            "table_kinds": embeddings.kinds,
            "results": {k: v for k, v in results.items() if k != "loss"},
        }
        with open(os.path.join(output, CONFIG_FILE), "w", encoding="utf-8") as f:
            json.dump(record, f, indent=2)
        plot = _plot(results, os.path.join(output, PLOT_FILE), config)
        say(f"checkpoint: {checkpoint}\nplot: {plot}")
    # Every rank returns once rank 0 has written the files, so that the ranks also end together.
    comm.allreduce_sum(tf.constant(0), name="demo: files written")
    return results


def build_model(config: DemoConfig, embeddings: Any) -> tuple[Any, Any, str]:
    """The tower of ``config.model``, the function from a batch's ids to the 26 embeddings, and the
    title the demo prints: training builds its model with it from SOK's tables, serving from HPS's
    lookups (``embeddings``: an object with ``__call__(ids)`` and ``lookup(bags)``, as
    :class:`~.dlrm.SokEmbeddings`).

    Example::

        tower, embed, _ = build_model(config, SokEmbeddings(gen.rows, config.dim))
        logits = tower((preprocess_dense(counts), embed(tf.constant(ids))))
    """
    if config.model == "dcnv2":
        from sparse_operation_kit.demo.dcnv2 import DCNv2Tower, split_bags

        tower = DCNv2Tower(config.dim, config.bottom, config.top, config.cross_layers, config.low_rank, config.seed)
        title = f"DLRM-DCNv2 on multi-hot Criteo-shaped data ({sum(config.hotness)} ids per sample)"
        return tower, lambda ids: embeddings.lookup(split_bags(ids, config.hotness)), title
    from sparse_operation_kit.demo.dlrm import DenseTower

    return DenseTower(config.dim, config.bottom, config.top, seed=config.seed), embeddings, "DLRM on Criteo-shaped data"


def _auc_ceiling(gen: Any, config: DemoConfig, auc: Any) -> float:
    """The Keras AUC of the hidden model's probabilities on the whole eval set (every rank the same)."""
    auc.reset_state()
    for index in range(config.eval_batches):
        counts, ids, labels = gen.batch(index, config.batch_size, "eval")
        auc.update_state(labels, gen.click_probability(counts, ids).astype(np.float32))
    value = float(auc.result())
    auc.reset_state()
    return value


def _plot(results: dict[str, Any], path: str, config: DemoConfig) -> str:
    """Loss per step (and its moving average) and eval AUC per epoch, in one PNG; returns the path
    (or why there is none: matplotlib is optional)."""
    try:
        import matplotlib
    except ImportError:
        return "not written (matplotlib is not installed: pip install matplotlib)"
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    losses = np.asarray(results["loss"])
    window = max(1, min(50, losses.size // 10))
    smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot(np.arange(1, losses.size + 1), losses, color="0.75", linewidth=0.6, label="loss per step")
    left.plot(np.arange(window, losses.size + 1), smooth, color="C0", label=f"mean of {window} steps")
    left.set(xlabel="step", ylabel="log-loss", title=f"training ({config.batch_size} samples per step)")
    left.legend()
    right.plot(results["eval_step"], results["eval_auc"], "o-", color="C1", label="eval AUC")
    if results["auc_ceiling"] is not None:
        right.axhline(results["auc_ceiling"], color="C2", linestyle="--", label="ceiling (hidden model)")
    right.set(xlabel="step", ylabel="AUC", title="evaluation after each epoch")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
