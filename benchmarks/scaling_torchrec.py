#!/usr/bin/env python
"""TorchRec + FBGEMM's training step on the tables of scaling_gpu.py, and Torch's NCCL all-to-all.

The baseline of ``scaling_gpu.py``, run in the same device call under ``torchrun
--nproc_per_node=N`` (one rank per GPU, NCCL). Per configuration (sharding x dim x hotness): the
same 26 tables (``--tables``, ``--cap``), batch per rank, power-law ids (the same generator and
seeds: rank r draws SOK's rank r ids) as a ``KeyedJaggedTensor`` already on the GPU (a pool of 8
batches), a ``DistributedModelParallel`` over an ``EmbeddingBagCollection`` (pooling SUM) sharded
table-wise (``tw``) or row-wise (``rw``) by a planner constraint, the FBGEMM kernel with
``EXACT_ADAGRAD`` (lr 0.01) fused into the backward, and the same loss: sum of squares of the
pooled rows over the batch. Each figure is the best of ``--repeat`` rounds of ``--steps`` steps
after ``--warmup``; a round ends when its last loss is on the host; its time is the slowest rank's.

Then ``torch.distributed.all_to_all_single`` of float32 buffers at the bytes per rank given by
``--a2a-bytes`` and by the ``alltoall_bytes_max`` of the ``scaling_gpu.py`` JSONs of ``--a2a-from``
(SOK's all-to-all input per rank at this N): bus bandwidth = bytes x (N - 1) / N / time, as
nccl-tests prints it (the best of ``--repeat`` rounds of 20 calls).

Needs torch with CUDA, ``fbgemm-gpu`` and ``torchrec`` (``ci/stage_torchrec.sh`` stages them for
the GPU host; ``source /tmp/torchrec/env.sh`` there). Usage::

    torchrun --nproc_per_node=2 benchmarks/scaling_torchrec.py --json torchrec_np2.json --a2a-from sok_np2.json
    torchrun --nproc_per_node=1 benchmarks/scaling_torchrec.py --sharding tw --dims 32 --quick
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from typing import Any

from scaling_gpu import HOTNESS, POOL, csv, make_pool, table_rows
from torchrec_names import import_torchrec

SHARDINGS = {"tw": "table_wise", "rw": "row_wise"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sharding", type=csv(str, tuple(SHARDINGS)), default=["tw", "rw"], help="tw,rw (default both)")
    p.add_argument("--dims", type=csv(int), default=[32, 128], help="comma-separated, default 32,128")
    p.add_argument("--hotness", type=csv(str, HOTNESS), default=["2"], help="1,2,multi (default 2)")
    p.add_argument("--tables", choices=["criteo", "uniform"], default="criteo")
    p.add_argument("--cap", type=int, default=2**20)
    p.add_argument("--batch", type=int, default=65536, help="samples per rank and step")
    p.add_argument("--zipf", type=float, default=1.1)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--seed", type=int, default=37)
    p.add_argument("--only", choices=["train", "a2a"], help="only the training steps, or only the all-to-all")
    p.add_argument("--a2a-bytes", type=csv(int), default=[2**20, 16 * 2**20, 128 * 2**20],
                   help="bytes per rank of the all-to-all measurements (default 1, 16, 128 MiB)")  # fmt: skip
    p.add_argument("--a2a-from", nargs="*", default=[], metavar="JSON",
                   help="scaling_gpu.py results: also at their rows' alltoall_bytes_max (rows of this N)")  # fmt: skip
    p.add_argument("--quick", action="store_true", help="tiny sizes: batch 512, cap 4 Ki, dim 8, 3 steps")
    p.add_argument("--json", help="write the figures to this file too")
    args = p.parse_args(argv)
    if args.quick:
        args.batch, args.cap, args.dims, args.steps, args.warmup, args.repeat = 512, 2**12, [8], 3, 1, 1
        args.a2a_bytes = [2**20]
    return args


def kjt_pool(args: argparse.Namespace, rows: list[int], hotness: str, rank: int, tr: dict[str, Any]) -> list[Any]:
    """POOL KeyedJaggedTensors on this rank's GPU: the ids scaling_gpu.py's rank ``rank`` draws."""
    import numpy as np
    import torch

    keys = [f"f{t}" for t in range(len(rows))]
    pool = []
    for batch in make_pool(args, rows, hotness, rank):
        values = torch.as_tensor(np.concatenate([v for v, _ in batch]), device="cuda")
        lengths = torch.as_tensor(np.concatenate([n for _, n in batch]).astype(np.int32), device="cuda")
        pool.append(tr["KeyedJaggedTensor"].from_lengths_sync(keys=keys, values=values, lengths=lengths))
    return pool


def sharded_model(args: argparse.Namespace, rows: list[int], dim: int, sharding: str, tr: dict[str, Any]) -> Any:
    """A DistributedModelParallel EmbeddingBagCollection, every table sharded ``sharding``, Adagrad fused."""
    import torch
    import torch.distributed as dist

    configs = [
        tr["EmbeddingBagConfig"](name=f"t{t}", embedding_dim=dim, num_embeddings=r, feature_names=[f"f{t}"],
                                 pooling=tr["PoolingType"].SUM)
        for t, r in enumerate(rows)
    ]  # fmt: skip
    ebc = tr["EmbeddingBagCollection"](tables=configs, device=torch.device("meta"))
    sharder = tr["EmbeddingBagCollectionSharder"](
        fused_params={"optimizer": tr["EmbOptimType"].EXACT_ADAGRAD, "learning_rate": 0.01}
    )
    constraints = {
        c.name: tr["ParameterConstraints"](sharding_types=[SHARDINGS[sharding]],
                                           compute_kernels=[tr["EmbeddingComputeKernel"].FUSED.value])
        for c in configs
    }  # fmt: skip
    topology = tr["Topology"](world_size=dist.get_world_size(), local_world_size=int(os.environ.get(
        "LOCAL_WORLD_SIZE", dist.get_world_size())), compute_device="cuda")  # fmt: skip
    planner = tr["EmbeddingShardingPlanner"](topology=topology, batch_size=args.batch, constraints=constraints)
    plan = planner.collective_plan(ebc, [sharder], dist.GroupMember.WORLD)
    return tr["DistributedModelParallel"](
        module=ebc,
        env=tr["ShardingEnv"].from_process_group(dist.GroupMember.WORLD),
        device=torch.device("cuda", torch.cuda.current_device()),
        plan=plan,
        sharders=[sharder],
    )


def slowest(seconds: float) -> float:
    """The largest of every rank's ``seconds`` (also a barrier)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([seconds], dtype=torch.float64, device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def best_round(step: Any, steps: int, warmup: int, repeat: int) -> tuple[float, list[float]]:
    """The best round's seconds per step (the slowest rank's) and every round's."""
    for i in range(warmup):
        step(i).item()
    rounds = []
    for _ in range(repeat):
        slowest(0.0)
        start = time.perf_counter()
        loss = None
        for i in range(steps):
            loss = step(i)
        loss.item()
        rounds.append(slowest((time.perf_counter() - start) / steps))
    return min(rounds), rounds


def train(args: argparse.Namespace, rows: list[int], tr: dict[str, Any], world: int, rank: int) -> list[dict]:
    import torch

    results = []
    for hotness in args.hotness:
        pool = kjt_pool(args, rows, hotness, rank, tr)
        for sharding in args.sharding:
            for dim in args.dims:
                model = sharded_model(args, rows, dim, sharding, tr)

                def step(i: int, model: Any = model, pool: list = pool) -> Any:
                    pooled = model(pool[i % POOL]).values()
                    loss = pooled.square().sum() / args.batch
                    loss.backward()
                    return loss

                seconds, rounds = best_round(step, args.steps, args.warmup, args.repeat)
                row = {
                    "tool": "torchrec", "kind": sharding, "dim": dim, "hotness": hotness, "ids": "gpu", "np": world,
                    "batch": args.batch, "cap": args.cap, "tables": args.tables, "ms": seconds * 1e3,
                    "rounds_ms": [r * 1e3 for r in rounds], "samples_per_s": world * args.batch / seconds,
                }  # fmt: skip
                results.append(row)
                if rank == 0:
                    print(f"torchrec {sharding:3} {dim:4} {hotness:>5} {world:3} {row['ms']:9.2f} ms "
                          f"{row['samples_per_s']:14,.0f} samples/s", flush=True)  # fmt: skip
                del model, step
                torch.cuda.empty_cache()
    return results


def a2a_sizes(args: argparse.Namespace, world: int) -> list[int]:
    """Bytes per rank to measure: ``--a2a-bytes`` and the SOK rows' all-to-all inputs at this N."""
    sizes = set(args.a2a_bytes)
    for path in args.a2a_from:
        with open(path) as f:
            data = json.load(f)
        sizes.update(r["alltoall_bytes_max"] for r in data["rows"] if r["np"] == world and r["alltoall_bytes_max"])
    return sorted(sizes)


def all_to_all(sizes: list[int], repeat: int, world: int, rank: int) -> list[dict]:
    """Torch's NCCL all_to_all_single at each size: time per call and bus bandwidth."""
    import torch
    import torch.distributed as dist

    points = []
    for nbytes in sizes:
        elements = max(world, nbytes // 4 // world * world)
        send = torch.ones(elements, dtype=torch.float32, device="cuda")
        received = torch.empty_like(send)
        for _ in range(5):
            dist.all_to_all_single(received, send)
        calls, best = 20, float("inf")
        for _ in range(repeat):
            torch.cuda.synchronize()
            slowest(0.0)
            start = time.perf_counter()
            for _ in range(calls):
                dist.all_to_all_single(received, send)
            torch.cuda.synchronize()
            best = min(best, slowest((time.perf_counter() - start) / calls))
        size = elements * 4
        point = {"bytes": size, "ms": best * 1e3, "algbw_GBps": size / best / 1e9,
                 "busbw_GBps": size * (world - 1) / world / best / 1e9}  # fmt: skip
        points.append(point)
        if rank == 0:
            print(f"all_to_all_single {size / 2**20:10.2f} MiB/rank {point['ms']:9.3f} ms "
                  f"bus {point['busbw_GBps']:7.1f} GB/s", flush=True)  # fmt: skip
        del send, received
    return points


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tr = import_torchrec("scaling_torchrec.py")
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        raise SystemExit("scaling_torchrec.py needs a CUDA GPU (torch.cuda.is_available() is False)")
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        if "RANK" not in os.environ:  # one process without torchrun
            os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29537")
        dist.init_process_group("nccl")
    world, rank = dist.get_world_size(), dist.get_rank()
    rows = table_rows(args.tables, args.cap)
    date = dt.datetime.now().isoformat(timespec="minutes")
    name = torch.cuda.get_device_name()
    import torchrec

    if rank == 0:
        print(f"# scaling_torchrec.py on {name} x {world} rank(s), {date}; torch {torch.__version__}, torchrec "
              f"{torchrec.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, {args.tables} "
              f"tables (cap {args.cap:,}), batch {args.batch:,} per rank, best of {args.repeat} x {args.steps} steps "
              f"after {args.warmup}", flush=True)  # fmt: skip
    results = train(args, rows, tr, world, rank) if args.only != "a2a" else []
    points = all_to_all(a2a_sizes(args, world), args.repeat, world, rank) if args.only != "train" and world > 1 else []
    if args.json and rank == 0:
        with open(args.json, "w") as f:
            json.dump({"tool": "torchrec", "np": world, "device": name, "date": date, "argv": sys.argv[1:],
                       "rows": results, "a2a": points}, f, indent=1)  # fmt: skip
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
