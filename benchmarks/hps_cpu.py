#!/usr/bin/env python
"""HPS lookups per tier against ``tf.gather`` on a resident ``tf.Variable`` of the same rows.

One table of ``--rows`` x ``--dim`` float32 rows (keys 0 .. rows-1) is written in HPS's
sparse-model layout and served by ``hps.LookupLayer`` (in a ``tf.function``) from one tier at a
time, each its own ps_config (HPS is shut down and started again between tiers):

* ``cache``: the embedding cache at ``gpucacheper`` 1.0 in front of the in-process hash map: a det
  table that holds every row from the start;
* ``cache_hkv``: the evicting cache (hkv) at ``gpucacheper`` 0.99 (the same power-of-two capacity
  as 1.0 had before it meant a det table), warm: every batch of the run is looked up once before
  the timing, so the timed lookups hit it (the hit rate of the timed keys is printed; at HKV's full
  buckets a few keys may miss);
* ``hash_map``: ``gpucache: false``, the volatile ``hash_map`` only (no ``overflow_margin``: the
  lookup reads its CPU storage in the graph);
* ``redis``: ``gpucache: false``, a ``redis_cluster`` of 3 nodes on loopback ports that this script
  starts and stops (``--redis HOST:PORT`` uses a running cluster instead; skipped without
  ``redis-server``);
* ``rocks_db``: ``gpucache: false``, the persistent ``rocks_db`` only, in a temporary folder.

A batch is ``B`` samples x 26 keys (int64, uniform over the rows); ``--batches`` lists the B
(default 1 to 65,536). For each tier and B, ``--pool`` batches are drawn and cycled through:
``--warmup`` unrecorded calls, then ``--iters`` timed calls (each synchronised with
``tf.test.experimental.sync_devices``). ``tf.gather`` on a ``tf.Variable`` holding the same rows,
in a ``tf.function``, takes turns with the tier call by call on the same batches (the ``gather``
line under each tier's), so load that comes and goes on a shared machine hits both alike.

Printed per tier and B: M lookups/s (keys over the mean call time), p50 and p99 latency (ms), and
``vs gather`` = the paired gather's p50 over the tier's p50 (1.0 = as fast as ``tf.gather``). Goals
(``--check``): warm cache (both) >= 0.8x ``tf.gather`` at B >= 4,096; ``hash_map`` >= 0.5x.

Usage::

    .venv/bin/python benchmarks/hps_cpu.py                 # the full sweep
    .venv/bin/python benchmarks/hps_cpu.py --quick         # CI-sized: small table, B 1 .. 4,096
    .venv/bin/python benchmarks/hps_cpu.py --tiers cache hash_map --batches 1024 4096 16384 65536
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TensorFlow's start-up banner out of the table

import numpy as np  # noqa: E402
from machine import load_average  # noqa: E402

KEYS_PER_SAMPLE = 26
TIERS = ("cache", "cache_hkv", "hash_map", "redis", "rocks_db")
#: The tiers with an embedding cache, and its gpucacheper.
CACHES = {"cache": 1.0, "cache_hkv": 0.99}
DEFAULT_BATCHES = (1, 16, 256, 1024, 4096, 16384, 65536)
QUICK_BATCHES = (1, 64, 1024, 4096)
GOALS = {"cache": 0.8, "cache_hkv": 0.8, "hash_map": 0.5}  # x tf.gather's p50, at B >= GOAL_MIN_BATCH
GOAL_MIN_BATCH = 4096


def parse_args(argv: list[str] | None, device: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rows", type=int, default=196608, help="table rows (default 196,608: 3/4 of the cache's 2**18)")
    p.add_argument("--dim", type=int, default=32, help="embedding width (default 32)")
    p.add_argument("--batches", type=int, nargs="+", default=None, help="samples per batch (x 26 keys)")
    p.add_argument("--tiers", nargs="+", choices=TIERS, default=list(TIERS))
    p.add_argument("--iters", type=int, default=30, help="timed calls per tier and batch (default 30)")
    p.add_argument("--warmup", type=int, default=3, help="unrecorded calls per tier and batch (default 3)")
    p.add_argument("--pool", type=int, default=4, help="distinct batches cycled through (default 4)")
    p.add_argument("--redis", default=None, help="HOST:PORT of a running Redis cluster (default: start one)")
    p.add_argument("--quick", action="store_true", help="CI-sized: 12,288 rows, dim 16, B 1 .. 4,096, 10 calls")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write configuration, machine and every sample here")
    p.add_argument("--check", action="store_true", help="exit status 1 when a goal is missed")
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.dim, args.iters, args.warmup = 12288, 16, 10, 2
        args.batches = args.batches or list(QUICK_BATCHES)
    args.batches = args.batches or list(DEFAULT_BATCHES)
    args.device = device
    return args


# -- the tiers ------------------------------------------------------------------------------------
def tier_config(tier: str, folder: str, args: argparse.Namespace, workdir: str, redis: str | None) -> dict[str, Any]:
    batch = max(args.batches)
    model = {
        "model": "bench",
        "sparse_files": [folder],
        "embedding_vecsize_per_table": [args.dim],
        "maxnum_catfeature_query_per_table_per_sample": [KEYS_PER_SAMPLE],
        "default_value_for_each_table": [0.0],
        "deployed_device_list": [0],
        "max_batch_size": batch,
        "hit_rate_threshold": 1.0,
        "gpucache": tier in CACHES,
        "gpucacheper": CACHES.get(tier, 1.0),
    }
    disabled = {"type": "disabled"}
    volatile, persistent = disabled, disabled
    if tier in CACHES or tier == "hash_map":
        volatile = {"type": "hash_map"}
    elif tier == "redis":
        volatile = {"type": "redis_cluster", "address": redis}
    else:
        persistent = {"type": "rocks_db", "path": os.path.join(workdir, "rocksdb")}
    return {"supportlonglong": True, "models": [model], "volatile_db": volatile, "persistent_db": persistent}


# -- timing ---------------------------------------------------------------------------------------
def timed(fns: list[Any], batches: list[Any], warmup: int, iters: int) -> list[np.ndarray]:
    """Seconds of each of ``iters`` calls of each of ``fns`` on the cycled ``batches``, after
    ``warmup`` calls of each; the functions take turns call by call, so load that comes and goes
    on the machine hits them alike."""
    import tensorflow as tf

    for i in range(warmup):
        for fn in fns:
            fn(batches[i % len(batches)])
    tf.test.experimental.sync_devices()
    samples = [np.empty(iters) for _ in fns]
    for i in range(iters):
        for fn, out in zip(fns, samples):
            start = time.perf_counter()
            fn(batches[i % len(batches)])
            tf.test.experimental.sync_devices()
            out[i] = time.perf_counter() - start
    return samples


def summary(samples: np.ndarray, keys: int) -> dict[str, float]:
    return {
        "mlookups_s": keys / samples.mean() / 1e6,
        "p50_ms": float(np.percentile(samples, 50) * 1e3),
        "p99_ms": float(np.percentile(samples, 99) * 1e3),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    import hierarchical_parameter_server as hps
    import tensorflow as tf
    from hierarchical_parameter_server import init
    from hierarchical_parameter_server.testing_redis import LocalRedisCluster
    from tqdm import tqdm

    rng = np.random.default_rng(args.seed)
    workdir = tempfile.mkdtemp(prefix="hps_bench_")
    results: dict[str, Any] = {"gather": {}, "tiers": {}, "hit_rate": {}}
    tiers = [t for t in args.tiers if t != "redis" or args.redis or shutil.which("redis-server")]
    if len(tiers) < len(args.tiers):
        print("redis: skipped (no redis-server on PATH and no --redis)")
    try:
        folder = os.path.join(workdir, "table")
        os.makedirs(folder)
        weights = rng.random((args.rows, args.dim), dtype=np.float32)
        np.arange(args.rows, dtype=np.int64).tofile(os.path.join(folder, "key"))
        weights.tofile(os.path.join(folder, "emb_vector"))
        with tf.device(args.device):
            table = tf.Variable(weights)
            pools = {
                b: [
                    tf.constant(rng.integers(0, args.rows, size=(b, KEYS_PER_SAMPLE)), tf.int64)
                    for _ in range(args.pool)
                ]
                for b in args.batches
            }
        gather = tf.function(lambda ids: tf.gather(table, ids))
        total = len(args.batches) * len(tiers)
        with (
            tqdm(total=total, desc=f"hps {args.device}", unit="run", file=sys.stderr) as bar,
            contextlib.ExitStack() as stack,
        ):
            redis = args.redis
            if "redis" in tiers and redis is None:
                cluster = LocalRedisCluster(os.path.join(workdir, "redis"), nodes=3)
                redis = stack.enter_context(cluster).address
            for tier in tiers:
                path = os.path.join(workdir, f"{tier}.json")
                with open(path, "w") as f:
                    json.dump(tier_config(tier, folder, args, workdir, redis), f)
                init.shutdown()
                hps.Init(ps_config_file=path, global_batch_size=max(args.batches))
                layer = hps.LookupLayer(model_name="bench", table_id=0, emb_vec_size=args.dim, emb_vec_dtype=tf.float32)
                lookup = tf.function(lambda ids, layer=layer: layer(ids))
                results["tiers"][tier] = {}
                for b in args.batches:
                    if tier in CACHES:  # warm: every key of the pool looked up once
                        for ids in pools[b]:
                            lookup(ids)
                        results["hit_rate"].setdefault(tier, {})[b] = hit_rate(init.get_server(), pools[b])
                    samples, baseline = timed([lookup, gather], pools[b], args.warmup, args.iters)
                    results["tiers"][tier][b] = summary(samples, b * KEYS_PER_SAMPLE)
                    results["gather"].setdefault(tier, {})[b] = summary(baseline, b * KEYS_PER_SAMPLE)
                    bar.update()
                init.shutdown()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return results


def hit_rate(server: Any, pool: list[Any]) -> float:
    """The fraction of the pool's keys the cache holds now."""
    import tensorflow as tf

    cache = server.table("bench", 0).cache
    return float(np.mean(np.concatenate([cache.find(tf.reshape(ids, [-1]))[1].numpy() for ids in pool])))


# -- report ---------------------------------------------------------------------------------------
def machine_context(args: argparse.Namespace) -> dict[str, Any]:
    import tensorflow as tf

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    return {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "sok-hps": version("sok-hps"),
        "redis-server": (
            subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.strip()
            if shutil.which("redis-server")
            else "not installed"
        ),  # fmt: skip
        "device": args.device,
        "load_average": load_average(),
    }


def report(args: argparse.Namespace, results: dict[str, Any]) -> list[str]:
    """Prints the table; returns the missed goals."""
    print(f"table {args.rows} x {args.dim} float32, {KEYS_PER_SAMPLE} keys per sample, "
          f"{args.iters} timed calls (after {args.warmup}) over {args.pool} batches, device {args.device}")  # fmt: skip
    print(f"{'tier':<10} {'B':>6} {'M lookups/s':>12} {'p50 ms':>9} {'p99 ms':>9} {'vs gather':>10}")
    missed = []
    for tier, by_batch in results["tiers"].items():
        for b, r in by_batch.items():
            g = results["gather"][tier][b]
            ratio = g["p50_ms"] / r["p50_ms"]
            r["vs_gather"] = ratio
            print(f"{tier:<10} {b:>6} {r['mlookups_s']:>12.2f} {r['p50_ms']:>9.3f} {r['p99_ms']:>9.3f} {ratio:>10.2f}")
            print(f"{'  gather':<10} {b:>6} {g['mlookups_s']:>12.2f} {g['p50_ms']:>9.3f} {g['p99_ms']:>9.3f}")
            goal = GOALS.get(tier)
            if goal is not None and b >= GOAL_MIN_BATCH and ratio < goal:
                missed.append(f"{tier} at B={b}: {ratio:.2f}x tf.gather < {goal}x")
    for tier, by_batch in results["hit_rate"].items():
        rates = ", ".join(f"B={b}: {r:.4f}" for b, r in by_batch.items())
        print(f"{tier} hit rate of the timed keys after the warm-up: {rates}")
    for tier, goal in GOALS.items():
        checked = [b for b in results["tiers"].get(tier, {}) if b >= GOAL_MIN_BATCH]
        if checked:
            ok = not any(m.startswith(f"{tier} ") for m in missed)
            print(f"{'PASS' if ok else 'FAIL'}: {tier} >= {goal}x tf.gather at B >= {GOAL_MIN_BATCH}")
    return missed


def main(argv: list[str] | None = None, device: str = "/CPU:0") -> int:
    args = parse_args(argv, device)
    machine = machine_context(args)
    print(" | ".join(f"{k} {v}" for k, v in machine.items()))
    sys.stdout.flush()
    results = run(args)
    missed = report(args, results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "machine": machine, "results": results}, f, indent=1, default=str)
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
