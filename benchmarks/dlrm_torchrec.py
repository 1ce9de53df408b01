#!/usr/bin/env python
"""TorchRec + FBGEMM's training step of MLPerf's DLRM-DCNv2 on one GPU: the baseline that
``dlrm.py --model dcnv2`` (SOK) is set against in the same device call (issue 38: SOK >= 1.0x it).

The same model, data and optimizers as ``dlrm.py --model dcnv2`` (``--mlperf``: MLPerf's sizes):

* the model: TorchRec's own DLRM-DCNv2, ``torchrec.models.dlrm.DLRM_DCN`` (what MLPerf's reference
  trains): 26 tables of ``MultiHotGenerator``'s rows (MLPerf's capped at ``--max-rows``) in one
  ``EmbeddingBagCollection`` (pooling SUM, float32 rows of ``dim``, initialised uniform in
  [-0.05, 0.05] as dlrm.py's tables), a bottom MLP over the 13 dense features, the low-rank cross
  network over the bottom MLP's output and the 26 pooled rows side by side (``27 x dim``), the top
  MLP down to one logit, ReLU after every layer but the last; the MLPs' weights and the cross
  network's re-initialised Glorot uniform with zero biases, as the Keras tower's;
* the tables' optimizer: FBGEMM's kernel with the update fused into the backward (no gradient of a
  table is ever formed): ``--sparse-optimizer rowwise`` ``EXACT_ROWWISE_ADAGRAD`` (one accumulator
  per row: ``acc += mean(g^2)``, ``w -= lr g / (sqrt(acc) + eps)``, ``sok.RowWiseAdagrad``'s rule),
  ``adagrad`` ``EXACT_ADAGRAD`` (one per element; Keras' Adagrad puts its epsilon inside the square
  root, FBGEMM after it: within 1e-6 relative at an accumulator >= 0.1); learning rate
  ``sparse_lr`` of the demo's config, epsilon 1e-7 and the accumulators set to 0.1 before the first
  step (Keras' and SOK's defaults; FBGEMM starts them at 0);
* the dense part: ``torch.optim.Adam`` at the config's ``dense_lr``, epsilon 1e-7 (Keras'), fused
  on a GPU; ``--precision mixed_bfloat16``: the model's forward under ``torch.autocast`` (bfloat16)
  with the tables and their state float32 (the pooled rows stay float32, so autocast computes the
  cross network's elementwise ops in float32 and its matmuls in bfloat16; Keras' policy computes
  both in bfloat16); ``float32``: float32 matmuls as TF32 on the GPU as TensorFlow's default does
  (``--no-tf32``: full float32); ``--compile``: the bottom MLP, the cross network and the top MLP
  each through ``torch.compile`` (``dlrm.py --xla``'s counterpart; compiled during the first step
  and ``--warmup``); the loss: binary cross-entropy with logits in float32, the mean;
* the data: the batches of ``dlrm.py`` (``MultiHotGenerator.batch`` of the same seed, index and
  size, dense counts through ``preprocess_dense``: the same bytes), ``min(--pool, --steps +
  --warmup)`` training batches made before timing, as ``KeyedJaggedTensor`` already in GPU memory
  (the step without its input's copy: ``dlrm.py --input gpu``), cycled in dlrm.py's order (a first
  step on batch 0, then batch 0, 1, ...), and ``--eval-batches`` of the eval stream.

One process, one GPU, and TorchRec's way of training on it: ``DistributedModelParallel`` over the
model on a process group of one rank (a ``HashStore``: no port, no launcher), the
``EmbeddingBagCollection`` sharded by the planner with every table table-wise on that rank and
compute kernel ``FUSED`` (FBGEMM's ``SplitTableBatchedEmbeddingBagsCodegen``, the optimizer given
in the sharder's ``fused_params``), the dense layers data parallel (DDP of one rank). That is the
path of TorchRec's examples and of MLPerf's DLRM-DCNv2 reference at any number of GPUs; the
unsharded ``EmbeddingBagCollection`` (an ``nn.EmbeddingBag`` per table, each table's gradient
formed and then applied by a Torch optimizer) is TorchRec's reference module, not its training
path. With the ids already on
the GPU and one rank, the train pipeline's overlap (``TrainPipelineSparseDist``: the next batch's
copy and id exchange during this step) has nothing to hide, so each step is called plainly.

Reported: samples/s, the best of ``--repeat`` rounds of ``--steps`` steps after ``--warmup`` (a
round timed between ``torch.cuda.synchronize`` calls), the eval AUC after ``1 + --warmup +
--steps`` steps (dlrm.py's count: its first step, its warm-up and its timed steps), as
``tf.keras.metrics.AUC(num_thresholds=2000)`` computes it (``thresholded_auc``) and exactly
(``exact_auc``), and on a GPU the memory of the model (the driver's count after building it and one
step, as ``dlrm.py``'s ``gpu_bytes_of_model``, and Torch's tensors) and the run's peak
(``torch.cuda.max_memory_allocated``). ``--trace-steps N`` then profiles N more steps
(``torch.profiler``) and splits the device's kernel time by part: ``embedding`` (FBGEMM's ops:
the lookups, their backward and the fused update), ``comm`` (the one-rank exchange), ``input``
(host-to-device copies), ``dense`` (the rest).

Needs torch, ``fbgemm-gpu`` and ``torchrec`` (``ci/stage_torchrec.sh`` stages them for the GPU host;
``source /tmp/torchrec/env.sh`` there) and ``sparse_operation_kit``'s demo modules (NumPy only; read
from this checkout when SOK is not installed). ``--quick`` runs on a CPU too (``fbgemm-gpu-cpu``),
where FBGEMM's fused optimizers run on its CPU kernels. Usage::

    python benchmarks/dlrm_torchrec.py --mlperf --precision mixed_bfloat16 --sparse-optimizer rowwise \\
        --steps 20 --warmup 5 --pool 10 --json torchrec_dcnv2.json
    python benchmarks/dlrm_torchrec.py --mlperf --steps 20 --trace-steps 3     # Adagrad, float32 (TF32)
    python benchmarks/dlrm_torchrec.py --quick                                 # a smoke test, CPU too
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from machine import load_average
from torchrec_names import import_torchrec

try:
    from sparse_operation_kit.demo.criteo import NUM_CATEGORICAL, NUM_DENSE, preprocess_dense
except ImportError:  # SOK not installed: its demo's data and config are NumPy only, read from this checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "packages" / "sok-core" / "src"))
    from sparse_operation_kit.demo.criteo import NUM_CATEGORICAL, NUM_DENSE, preprocess_dense
from sparse_operation_kit.demo.train import AUC_THRESHOLDS, MLPERF_DCNV2, DemoConfig

#: The ``--sparse-optimizer`` choices (``dlrm.py``'s names): FBGEMM's optimizer, fused into the backward.
SPARSE_OPTIMIZERS = {"adagrad": "EXACT_ADAGRAD", "rowwise": "EXACT_ROWWISE_ADAGRAD"}
#: The tables' Adagrad accumulators' start and epsilon: Keras' Adagrad's and ``sok.RowWiseAdagrad``'s defaults.
INITIAL_ACCUMULATOR = 0.1
SPARSE_EPSILON = 1e-7
#: Adam's epsilon on the dense part: Keras' default (Torch's is 1e-8).
DENSE_EPSILON = 1e-7
#: The tables' initial rows: uniform in [-0.05, 0.05], as dlrm.py's Keras and SOK tables.
INIT_RANGE = 0.05
#: ``--mlperf``'s batch per step, as ``dlrm.py``'s (MLPerf's DCNv2 reference trains at 65,536 per GPU).
MLPERF_BATCH = 65536
#: The ``--precision`` choices, ``dlrm.py``'s names: float32, or the dense part under bfloat16 autocast.
PRECISIONS = ("float32", "mixed_bfloat16")
#: The ``--id-dtype`` choices: the dtype of the KeyedJaggedTensors' ids.
ID_DTYPES = ("int64", "int32")
#: ``--quick``: tiny tables and batch, a few steps (the demo's small tower unless ``--mlperf``).
QUICK = {"batch_size": 256, "max_rows": 1 << 12, "steps": 3, "warmup": 1, "repeat": 1, "pool": 2, "eval_batches": 2}
#: ``--trace-steps``' parts, and what an op's name (lower case) holds to put its kernels in one (``step_part``).
STEP_PARTS = ("embedding", "comm", "input", "dense")
PART_MARKERS = {"embedding": ("fbgemm", "splitlookupfunction", "embedding_bag"),
                "comm": ("nccl", "c10d", "all_to_all", "alltoall", "record_param_comms")}  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mlperf", action="store_true", help="MLPerf's sizes for those not given (as dlrm.py's)")
    p.add_argument("--precision", choices=PRECISIONS, default="float32", help="mixed_bfloat16: autocast bf16")
    p.add_argument("--no-tf32", action="store_true", help="float32 matmuls in full float32 (TensorFlow: TF32)")
    p.add_argument(
        "--compile", action="store_true", help="torch.compile the dense part (dlrm.py's --xla), tables outside"
    )
    p.add_argument("--sparse-optimizer", choices=sorted(SPARSE_OPTIMIZERS), default="adagrad", help="the tables'")
    p.add_argument("--steps", type=int, default=600, help="timed steps per round")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeat", type=int, default=3, help="rounds of --steps; the best is reported")
    p.add_argument("--batch-size", type=int, default=None, help=f"default 4096 (--mlperf: {MLPERF_BATCH})")
    p.add_argument("--dim", type=int, default=None, help="default 16 (--mlperf: 128)")
    p.add_argument("--max-rows", type=int, default=None, help="default 128Ki (--mlperf: 4Mi)")
    p.add_argument("--pool", type=int, default=100, help="distinct training batches, made before timing")
    p.add_argument("--id-dtype", choices=ID_DTYPES, default="int64", help="the KeyedJaggedTensors' ids")
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto", help="auto: the GPU if there is one")
    p.add_argument("--trace-steps", type=int, default=0, help="after timing, profile this many steps: time by part")
    p.add_argument(
        "--quick",
        action="store_true",
        help="tiny tables and batch, 3 steps: a smoke test (CPU too); options given beside it win",
    )
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    if args.quick:  # its sizes as defaults: options given beside it still win
        p.set_defaults(**QUICK)
        args = p.parse_args(argv)
    for name in ("steps", "repeat", "pool", "eval_batches"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} {getattr(args, name)} is not valid; give 1 or more")
    for name in ("warmup", "trace_steps"):
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} {getattr(args, name)} is negative; give 0 or more")
    return args


def demo_config(args: argparse.Namespace) -> DemoConfig:
    """The demo's DCNv2 config of these options: ``dlrm.py --model dcnv2``'s (the same sizes, seed and
    learning rates)."""
    sizes = dict(MLPERF_DCNV2, batch_size=MLPERF_BATCH) if args.mlperf else {}
    given = {"batch_size": args.batch_size, "dim": args.dim, "max_rows": args.max_rows}
    sizes.update({name: value for name, value in given.items() if value is not None})
    config = DemoConfig(model="dcnv2", seed=args.seed, **sizes)
    config.check(1)
    return config


def make_batches(gen: Any, count: int, batch_size: int, stream: str = "train") -> list[tuple[np.ndarray, ...]]:
    """Batches ``0 .. count - 1`` of ``stream`` as ``dlrm.py`` takes them from
    ``CriteoGenerator.dataset`` (its ``make``, without TensorFlow): ``dense float32 [B, 13]`` (the
    counts through ``preprocess_dense``), ``ids int64 [B, sum(hotness)]``, ``labels float32 [B, 1]``."""
    out = []
    for index in range(count):
        counts, ids, labels = gen.batch(index, batch_size, stream)
        out.append((preprocess_dense(counts), ids, labels[:, None]))
    return out


def feature_major(ids: np.ndarray, hotness: list[int] | tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """A batch's ids ``[B, sum(hotness)]`` (feature ``i`` the next ``hotness[i]`` columns, the layout of
    ``MultiHotGenerator``) as a ``KeyedJaggedTensor``'s ``values`` and ``lengths``: feature by
    feature, sample by sample, each bag's ids in column order; ``lengths`` int32 ``[26 * B]``.

    Example::

        feature_major(np.array([[1, 2, 7], [3, 4, 8]]), [2, 1])
        # values [1, 2, 3, 4, 7, 8], lengths [2, 2, 1, 1]
    """
    if ids.ndim != 2 or ids.shape[1] != sum(hotness):
        raise ValueError(
            f"ids of shape {ids.shape} do not hold bags of hotness {list(hotness)}; valid: [B, {sum(hotness)}]"
        )
    starts = np.concatenate([[0], np.cumsum(hotness)])
    values = np.concatenate([ids[:, starts[f] : starts[f + 1]].reshape(-1) for f in range(len(hotness))])
    lengths = np.repeat(np.asarray(hotness, dtype=np.int32), ids.shape[0])
    return values, lengths


def exact_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """The ROC AUC of ``scores`` for binary ``labels``: P(a positive outscores a negative), ties
    counting a half (Mann-Whitney U over average ranks).

    Example::

        exact_auc(np.array([0, 1, 1, 0]), np.array([0.1, 0.8, 0.4, 0.4]))   # 0.875
    """
    labels = np.asarray(labels).reshape(-1).astype(bool)
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    positives, negatives = int(labels.sum()), int((~labels).sum())
    if positives == 0 or negatives == 0:
        raise ValueError(f"AUC needs both classes; got {positives} positives and {negatives} negatives")
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    ranks = (ends - (counts - 1) / 2.0)[inverse]  # the average rank (from 1) of each tie group
    return float((ranks[labels].sum() - positives * (positives + 1) / 2.0) / (positives * negatives))


def thresholded_auc(labels: np.ndarray, scores: np.ndarray, num_thresholds: int = AUC_THRESHOLDS) -> float:
    """The ROC AUC as ``tf.keras.metrics.AUC(num_thresholds)`` computes it (``dlrm.py``'s figure):
    thresholds ``-1e-7, 1/(n-1), ..., (n-2)/(n-1), 1 + 1e-7``, a score above a threshold counted
    positive, the trapezoids between the (false positive rate, recall) points.

    Example::

        thresholded_auc(np.array([0, 1, 1, 0]), np.array([0.1, 0.8, 0.4, 0.4]))   # 0.875
    """
    labels = np.asarray(labels).reshape(-1).astype(np.float64)
    scores = np.asarray(scores, dtype=np.float32).reshape(-1)
    interior = np.array([(i + 1) * 1.0 / (num_thresholds - 1) for i in range(num_thresholds - 2)], np.float32)
    thresholds = np.concatenate([np.array([-1e-7], np.float32), interior, np.array([1.0 + 1e-7], np.float32)])
    order = np.argsort(scores, kind="stable")
    ranked, positive_below = scores[order], np.concatenate([[0.0], np.cumsum(labels[order])])
    at_most = np.searchsorted(ranked, thresholds, side="right")  # scores <= each threshold
    tp = positive_below[-1] - positive_below[at_most]
    fp = (scores.size - at_most) - tp
    positives, negatives = positive_below[-1], scores.size - positive_below[-1]
    recall = tp / positives if positives else np.zeros_like(tp)
    fp_rate = fp / negatives if negatives else np.zeros_like(fp)
    return float(np.sum((fp_rate[:-1] - fp_rate[1:]) * (recall[:-1] + recall[1:]) / 2.0))


def one_rank_group(device: Any) -> Any:
    """A process group of this process alone (NCCL on a GPU, Gloo on a CPU) over a ``HashStore``: no
    port and no launcher; refuses a run under ``torchrun`` with several ranks."""
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != 1:
        raise SystemExit(
            f"dlrm_torchrec.py runs as one process on one GPU; WORLD_SIZE is {world}: run it without torchrun"
        )
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return dist.GroupMember.WORLD


def glorot_dense_part(model: Any, torch: Any) -> None:
    """The Keras tower's initial distributions on ``DLRM_DCN``'s dense part: Glorot uniform weights
    (the MLPs' and the cross network's ``V`` and ``W``), zero biases."""
    for name, param in model.named_parameters():
        if "sparse_arch" in name:
            continue
        with torch.no_grad():
            if param.dim() >= 2:
                torch.nn.init.xavier_uniform_(param)
            else:
                param.zero_()


def build_model(config: DemoConfig, rows: tuple[int, ...], args: argparse.Namespace, device: Any, tr: dict) -> Any:
    """``DLRM_DCN`` of ``config``'s sizes under ``DistributedModelParallel`` on one rank: every table
    table-wise with the ``FUSED`` kernel and the ``--sparse-optimizer`` in its backward, the
    accumulators set to ``INITIAL_ACCUMULATOR``."""
    torch = tr["torch"]
    keys = [f"f{t}" for t in range(len(rows))]
    tables = [
        tr["EmbeddingBagConfig"](name=f"t{t}", embedding_dim=config.dim, num_embeddings=r, feature_names=[keys[t]],
                                 pooling=tr["PoolingType"].SUM, weight_init_min=-INIT_RANGE, weight_init_max=INIT_RANGE)
        for t, r in enumerate(rows)
    ]  # fmt: skip
    ebc = tr["EmbeddingBagCollection"](tables=tables, device=torch.device("meta"))
    model = tr["DLRM_DCN"](
        embedding_bag_collection=ebc,
        dense_in_features=NUM_DENSE,
        dense_arch_layer_sizes=[*config.bottom, config.dim],
        over_arch_layer_sizes=[*config.top, 1],
        dcn_num_layers=config.cross_layers,
        dcn_low_rank_dim=config.low_rank,
        dense_device=device,
    )
    model.inter_arch.to(device)  # the cross network is made on the default device
    glorot_dense_part(model, torch)
    if args.compile:  # each dense part compiled (Inductor); the sparse part stays TorchRec's sharded module
        model.dense_arch, model.inter_arch, model.over_arch = (
            torch.compile(part) for part in (model.dense_arch, model.inter_arch, model.over_arch)
        )
    optimizer = getattr(tr["EmbOptimType"], SPARSE_OPTIMIZERS[args.sparse_optimizer])
    sharder = tr["EmbeddingBagCollectionSharder"](
        fused_params={"optimizer": optimizer, "learning_rate": config.sparse_lr, "eps": SPARSE_EPSILON}
    )
    constraints = {
        table.name: tr["ParameterConstraints"](
            sharding_types=[tr["ShardingType"].TABLE_WISE.value],
            compute_kernels=[tr["EmbeddingComputeKernel"].FUSED.value],
            pooling_factors=[float(h)],
        )
        for table, h in zip(tables, config.hotness)
    }
    memory = {"hbm_cap": torch.cuda.get_device_properties(device).total_memory} if device.type == "cuda" else {}
    topology = tr["Topology"](world_size=1, local_world_size=1, compute_device=device.type, **memory)
    planner = tr["EmbeddingShardingPlanner"](topology=topology, batch_size=config.batch_size, constraints=constraints)
    plan = planner.plan(model, [sharder])
    group = one_rank_group(device)
    dmp = tr["DistributedModelParallel"](
        module=model, env=tr["ShardingEnv"].from_process_group(group), device=device, plan=plan, sharders=[sharder]
    )
    # The sharded collection's lookups (a list, not submodules) hold FBGEMM's table modules.
    lookups = getattr(dmp.module.sparse_arch.embedding_bag_collection, "_lookups", [])
    fbgemm_modules = [m for lookup in lookups for m in lookup.modules() if hasattr(m, "split_optimizer_states")]
    if not fbgemm_modules:
        raise RuntimeError(
            f"the sharded EmbeddingBagCollection's lookups ({[type(x).__name__ for x in lookups]}) hold no FBGEMM "
            f"table module (SplitTableBatchedEmbeddingBagsCodegen): torchrec {tr['torchrec'].__version__} keeps "
            f"them elsewhere; the accumulators cannot be set to {INITIAL_ACCUMULATOR}"
        )
    with torch.no_grad():
        for module in fbgemm_modules:
            for states in module.split_optimizer_states():
                states[0].fill_(INITIAL_ACCUMULATOR)  # momentum1: the Adagrad accumulators
    return dmp, fbgemm_modules


def kjt_of(ids: np.ndarray, hotness: tuple[int, ...], device: Any, id_dtype: str, tr: dict) -> Any:
    """A batch's ids as a ``KeyedJaggedTensor`` on ``device``, its per-key lengths and offsets given
    (no device-to-host read in the step)."""
    torch = tr["torch"]
    values, lengths = feature_major(ids, hotness)
    batch = ids.shape[0]
    per_key = [batch * h for h in hotness]
    return tr["KeyedJaggedTensor"](
        keys=[f"f{t}" for t in range(len(hotness))],
        values=torch.as_tensor(values.astype(id_dtype)).to(device),
        lengths=torch.as_tensor(lengths).to(device),
        offsets=torch.as_tensor(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)).to(device),
        stride=batch,
        length_per_key=per_key,
        offset_per_key=[0, *np.cumsum(per_key).tolist()],
    )


def device_of(choice: str, torch: Any) -> Any:
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: torch.cuda.is_available() is False (a CPU build of torch, or no GPU)")
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def synchronize(device: Any, torch: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def driver_bytes(device: Any, torch: Any) -> int | None:
    """Bytes in use on the GPU as the CUDA driver counts them (None on a CPU)."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    return int(total - free)


def step_part(event: Any) -> str:
    """The part of ``STEP_PARTS`` of a profiled op: that of the innermost name among the op's and its
    enclosing ops' (``cpu_parent``) that holds one of ``PART_MARKERS``, else "dense"."""
    while event is not None:
        name = event.name.lower()
        for part, marks in PART_MARKERS.items():
            if any(mark in name for mark in marks):
                return part
        event = event.cpu_parent
    return "dense"


def traced_split(step: Any, next_batch: Any, steps: int, device: Any, torch: Any) -> dict:
    """``steps`` steps under ``torch.profiler``, their time split by ``STEP_PARTS`` per step (ms): on
    a GPU each kernel's and copy's time, in the part of the innermost op around it whose name (or an
    enclosing op's) has one of ``PART_MARKERS``; on a CPU the host's time of each op (its own)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    synchronize(device, torch)
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step(*next_batch())
        synchronize(device, torch)
    parts: Counter = Counter({part: 0.0 for part in STEP_PARTS})
    by_op: Counter = Counter()
    for event in prof.events():
        if device.type == "cuda":
            kernels = getattr(event, "kernels", [])
            us = sum(k.duration for k in kernels)
            if not us:
                continue
            names = [k.name.lower() for k in kernels]
            part = "input" if all("memcpy htod" in n for n in names) else None
        else:
            us = event.self_cpu_time_total
            part = None
        parts[part or step_part(event)] += us / 1e3 / steps
        by_op[event.name] += us / 1e3 / steps
    return {"device": device.type, "parts_ms": dict(parts), "top_ms": by_op.most_common(12)}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    config = demo_config(args)
    tr = import_torchrec("dlrm_torchrec.py")
    torch = tr["torch"]
    import torch.nn.functional as F

    device = device_of(args.device, torch)
    torch.manual_seed(args.seed)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("highest" if args.no_tf32 else "high")  # "high": TF32
    mixed = args.precision == "mixed_bfloat16"
    gen = config.generator()
    rows, hotness = tuple(gen.rows), tuple(gen.hotness)

    def on_device(batches: list[tuple[np.ndarray, ...]]) -> list[tuple[Any, ...]]:
        return [
            (
                torch.as_tensor(d).to(device),
                kjt_of(i, hotness, device, args.id_dtype, tr),
                torch.as_tensor(y).to(device),
            )
            for d, i, y in batches
        ]

    pool_before = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    pool = on_device(make_batches(gen, min(args.pool, args.steps + args.warmup), config.batch_size))
    evals = on_device(make_batches(gen, args.eval_batches, config.batch_size, "eval"))
    pool_bytes = torch.cuda.memory_allocated(device) - pool_before if device.type == "cuda" else None

    before = (driver_bytes(device, torch), torch.cuda.memory_allocated(device) if device.type == "cuda" else 0)
    model, fbgemm_modules = build_model(config, rows, args, device, tr)
    dense_params = [p for _, p in tr["in_backward_optimizer_filter"](model.named_parameters())]
    fused = {"fused": True} if device.type == "cuda" else {}
    adam = torch.optim.Adam(dense_params, lr=config.dense_lr, eps=DENSE_EPSILON, **fused)

    def step(dense: Any, kjt: Any, labels: Any) -> Any:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=mixed):
            logits = model(dense, kjt)
        loss = F.binary_cross_entropy_with_logits(logits.float(), labels)
        loss.backward()  # the tables' update runs here (FBGEMM's fused backward)
        adam.step()
        adam.zero_grad(set_to_none=True)
        return loss.detach()

    def predict(dense: Any, kjt: Any) -> Any:
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=mixed):
            return torch.sigmoid(model(dense, kjt).float())

    step(*pool[0])  # dlrm.py's first step (its memory measurement), on batch 0
    synchronize(device, torch)
    after = (driver_bytes(device, torch), torch.cuda.memory_allocated(device) if device.type == "cuda" else 0)
    cursor = iter(range(1 << 62))

    def next_batch() -> tuple[Any, ...]:
        return pool[next(cursor) % len(pool)]

    for _ in range(args.warmup):
        step(*next_batch())
    load_before = load_average()
    rounds, auc, auc_exact = [], None, None
    for r in range(args.repeat):
        synchronize(device, torch)
        start = time.perf_counter()
        for _ in range(args.steps):
            loss = step(*next_batch())
        float(loss)
        synchronize(device, torch)
        rounds.append(time.perf_counter() - start)
        if r == 0:  # after dlrm.py's number of steps: 1 + warmup + steps
            model.eval()
            scores = np.concatenate([predict(d, k).cpu().numpy().reshape(-1) for d, k, _ in evals])
            labels = np.concatenate([y.cpu().numpy().reshape(-1) for _, _, y in evals])
            model.train()
            auc, auc_exact = thresholded_auc(labels, scores), exact_auc(labels, scores)
    split = traced_split(step, next_batch, args.trace_steps, device, torch) if args.trace_steps else None

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    held = None if before[0] is None else after[0] - before[0]
    result = {
        "samples_per_s": args.steps * config.batch_size / min(rounds),
        "rounds_samples_per_s": [args.steps * config.batch_size / s for s in rounds],
        "auc": auc,
        "auc_exact": auc_exact,
        "steps_before_auc": 1 + args.warmup + args.steps,
        "sparse_optimizer": SPARSE_OPTIMIZERS[args.sparse_optimizer],
        "fbgemm_tables_modules": len(fbgemm_modules),
        "gpu_bytes_of_model": held,
        "torch_tensor_bytes_of_model": after[1] - before[1] if device.type == "cuda" else None,
        "peak_gpu_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        "pool_gpu_bytes": pool_bytes,
        "step_split": split,
    }
    figures = {
        "tool": "torchrec",
        "argv": list(sys.argv[1:] if argv is None else argv),
        "device": name,
        "date": dt.datetime.now().isoformat(timespec="minutes"),
        "versions": {
            "torch": torch.__version__,
            "torchrec": tr["torchrec"].__version__,
            "fbgemm_gpu": getattr(tr["fbgemm_gpu"], "__version__", "?"),
        },
        "config": vars(args),
        "demo_config": dataclasses.asdict(config),
        "load_average": [load_before, load_average()],
        "torchrec": result,
    }
    matmuls = "" if mixed or device.type != "cuda" else (", full float32" if args.no_tf32 else ", TF32 matmuls")
    matmuls += ", dense part torch.compile'd" if args.compile else ""
    print(
        f"# dlrm_torchrec.py on {name}, {figures['date']}; torch {torch.__version__}, torchrec "
        f"{figures['versions']['torchrec']}, fbgemm_gpu {figures['versions']['fbgemm_gpu']}\n"
        f"DLRM-DCNv2 (torchrec DLRM_DCN), {NUM_CATEGORICAL} tables ({sum(rows):,} rows, dim {config.dim}), best of "
        f"{args.repeat} x {args.steps} steps of {config.batch_size} after {args.warmup}, FBGEMM "
        f"{result['sparse_optimizer']} fused ({args.sparse_optimizer}), {args.precision}{matmuls}, {args.id_dtype} "
        f"ids from {'GPU' if device.type == 'cuda' else 'host'} memory; load average {figures['load_average']}"
    )
    memory = ""
    if device.type == "cuda":
        tensors, peak = result["torch_tensor_bytes_of_model"] / 2**30, result["peak_gpu_bytes"] / 2**30
        memory = (f"   GPU memory of the model: driver +{held / 2**30:.2f} GiB, torch tensors +{tensors:.2f} GiB; "
                  f"peak {peak:.2f} GiB (with the batches' {pool_bytes / 2**30:.2f})")  # fmt: skip
    rates = ", ".join(f"{r / 1e3:.1f}k" for r in result["rounds_samples_per_s"])
    print(f"  torchrec {result['samples_per_s'] / 1e3:8.1f}k samples/s (rounds: {rates})   eval AUC {auc:.4f} "
          f"(exact {auc_exact:.4f}) after {result['steps_before_auc']} steps{memory}")  # fmt: skip
    if split is not None:
        parts = ", ".join(f"{part} {ms:.2f}" for part, ms in split["parts_ms"].items())
        where = "GPU kernels and copies" if device.type == "cuda" else "host time in torch ops"
        print(f"  torchrec {where} per step, by part: {parts} ms")
        print("           " + "; ".join(f"{op} {ms:.2f}" for op, ms in split["top_ms"][:8]))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(figures, f, indent=2)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    return figures


if __name__ == "__main__":
    main()
