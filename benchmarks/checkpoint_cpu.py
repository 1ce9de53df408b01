#!/usr/bin/env python
"""CPU checkpoint benchmark: ``sok.dump`` / ``sok.load`` of one big DynamicVariable against NumPy
``tofile`` / ``fromfile`` of the same bytes, both measured in one run.

The table: ``--keys`` int64 keys (default 4Mi) x ``--dim`` float32 columns (default 128), i.e.
2 GiB of rows, in a ``--var-type`` (default ``hbm``: det) DynamicVariable without optimizer state.
One process (world size 1).

* ``dump``: ``sok.dump(path, var)`` into a new directory (the previous round's is removed first,
  untimed): export in chunks (det: in row-arena order, into reused buffers), key and weight files
  with their headers, CRC-32 of each, writeback started per chunk, fsync, manifest, rename into
  place.
* ``load``: ``sok.load(path, fresh_var)`` into a new, empty variable of the same backend and
  capacity (created untimed): checks headers, reads the key file while checking its CRC-32, then
  fills the table while the weight file is read: 128 MiB of whole rows per read into two reused
  buffers, a thread checksums each chunk and another inserts its rows while the next is read (the
  table would be emptied again if a file turned out corrupt).
* baselines: ``keys.tofile`` + ``rows.tofile`` into two files, each flushed and ``os.fsync``-ed as
  dump does (``raw write``), and ``np.fromfile`` of both (``raw read``).

Throughput is payload bytes (keys + rows, without headers; GB = 1e9 bytes) over seconds. By default
(``--cache cold``) the files of a round are dropped from the page cache (``posix_fadvise
DONTNEED``, after their fsync) before they are read, so load and raw read both read from the disk;
``--cache warm`` keeps them cached. Rounds interleave raw write, dump, raw read, load, so drift of a
shared machine hits both sides; the ratios use the best of ``--repeat`` rounds (the median is
printed too). The first round checks the loaded table (a sample of keys) and the raw read (every
byte). Afterwards the parts of dump and load are timed once on their own, to show where the time goes.

Goals: dump >= 0.7x raw write, load >= 0.7x raw read.

Usage::

    python benchmarks/checkpoint_cpu.py                        # 4Mi x 128 (2 GiB), best of 3
    python benchmarks/checkpoint_cpu.py --keys 262144 --repeat 2   # a quick look (128 MiB)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TensorFlow's start-up banner out of the table

import numpy as np  # noqa: E402
from machine import extension_builds, load_average  # noqa: E402

GOAL = 0.7
GB = 1e9
FILL_BATCH = 1 << 18
VERIFY_SAMPLE = 1 << 16
#: Peak resident memory of a round, in table sizes: the table, the source rows, the freshly loaded
#: table, the raw read's copy, and headroom.
MEMORY_FACTOR = 6
#: Disk a round needs, in table sizes: the checkpoint and the raw files.
DISK_FACTOR = 2.2


# -- machine context (as storage_cpu.py) ------------------------------------------------------------
def meminfo(field: str) -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def machine_context(tf: Any, directory: str) -> dict[str, Any]:
    import sparse_operation_kit
    from sparse_operation_kit.env_info import environment_info

    cpu_model = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu_model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    info = environment_info(with_tensorflow=False)
    disk = shutil.disk_usage(directory)
    return {
        "cpu": cpu_model,
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "tensorflow": tf.__version__,
        "sok-core": sparse_operation_kit.__version__,
        "backends": {b["name"]: b["version"] for b in info["backends"]},
        "extensions": extension_builds(),
        "memory": f"{meminfo('MemTotal') / 2**30:.1f} GiB total, {meminfo('MemAvailable') / 2**30:.1f} GiB available",
        "directory": f"{directory}: {disk.free / 2**30:.1f} GiB free of {disk.total / 2**30:.1f} GiB",
    }


# -- the two sides ----------------------------------------------------------------------------------
def timed(fn: Callable[..., Any], *args: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - start, out


def drop_from_page_cache(paths: list[str]) -> None:
    """Evict the (clean, fsync-ed) pages of these files, so the next read comes from the disk."""
    if not hasattr(os, "posix_fadvise"):
        return
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def files_in(directory: str) -> list[str]:
    return [os.path.join(directory, name) for name in sorted(os.listdir(directory))]


def export_in_chunks(storage: Any, dim: int) -> int:
    """Every row, exported as dump does it (64 MiB chunks into two reused sets of buffers)."""
    rows = (64 << 20) // (4 * dim + 8)
    buffers = [(np.empty(rows, storage.key_dtype), np.empty((rows, dim), np.float32)) for _ in range(2)]
    total = 0
    for turn, offset in enumerate(range(0, storage.capacity(), rows)):
        keys, _, _ = storage.export_batch(offset, rows, out=buffers[turn % 2])
        total += keys.size
    return total


def read_as_load_does(infos: list[Any], rows: int) -> None:
    """Read and checksum the files as load does, inserting nothing: the key file into memory, the
    others streamed through two reused buffers."""
    from sparse_operation_kit.checkpoint import format as fmt

    for info in infos:
        if info.file_type == fmt.FILE_KEY:
            fmt.read_payload(info, rows)
        else:
            fmt.stream_payload(info, rows, lambda first, block: None)


def insert_in_chunks(storage: Any, keys: np.ndarray, rows: np.ndarray, chunk_rows: int) -> None:
    """Every row, inserted as load inserts them: one call per chunk of the weight file."""
    for start in range(0, keys.size, chunk_rows):
        storage.insert_or_assign(keys[start : start + chunk_rows], rows[start : start + chunk_rows])


def raw_write(directory: str, keys: np.ndarray, rows: np.ndarray) -> list[str]:
    os.makedirs(directory, exist_ok=True)
    paths = [os.path.join(directory, "key"), os.path.join(directory, "weight")]
    for path, array in zip(paths, (keys, rows)):
        with open(path, "wb") as f:
            array.tofile(f)
            f.flush()
            os.fsync(f.fileno())
    return paths


def raw_read(paths: list[str], dim: int) -> tuple[np.ndarray, np.ndarray]:
    return np.fromfile(paths[0], dtype=np.int64), np.fromfile(paths[1], dtype=np.float32).reshape(-1, dim)


def check(what: str, ok: bool) -> None:
    if not ok:
        raise SystemExit(f"checkpoint_cpu: {what} returned wrong results; the timings would mean nothing")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--keys", type=int, default=4 << 20, help="rows of the table (default 4Mi)")
    parser.add_argument("--dim", type=int, default=128, help="float32 columns per row (default 128)")
    parser.add_argument("--var-type", default="hbm", help="backend of the DynamicVariable (default hbm)")
    parser.add_argument("--repeat", type=int, default=3, help="recorded rounds (default 3)")
    parser.add_argument("--cache", choices=("cold", "warm"), default="cold", help="read from disk or page cache")
    parser.add_argument("--dir", default="/tmp", help="where the temporary files go (default /tmp)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="PATH", help="write the configuration, machine and every sample here")
    parser.add_argument("--check", action="store_true", help="exit 1 when a goal is missed")
    parser.add_argument("--force", action="store_true", help="run even when memory or disk look too small")
    args = parser.parse_args(argv)
    if args.keys < 1024 or args.dim < 1 or args.repeat < 1:
        parser.error("need --keys >= 1024, --dim >= 1, --repeat >= 1")

    n, dim = args.keys, args.dim
    table_bytes = n * dim * 4
    payload = n * 8 + table_bytes
    available, free = meminfo("MemAvailable"), shutil.disk_usage(args.dir).free
    if not args.force and (available < MEMORY_FACTOR * table_bytes or free < DISK_FACTOR * table_bytes):
        print(
            f"checkpoint_cpu: a {table_bytes / 2**30:.2f} GiB table needs about "
            f"{MEMORY_FACTOR * table_bytes / 2**30:.1f} GiB of memory ({available / 2**30:.1f} available) and "
            f"{DISK_FACTOR * table_bytes / 2**30:.1f} GiB "
            f"free in {args.dir} ({free / 2**30:.1f} free); use smaller --keys/--dim, or --force",
            file=sys.stderr,
        )
        return 2

    import sparse_operation_kit as sok
    import tensorflow as tf
    from sparse_operation_kit.checkpoint import format as fmt
    from sparse_operation_kit.progress import TqdmCallback

    machine = machine_context(tf, args.dir)
    machine["load_average_start"] = load_average()
    print(
        f"checkpoint_cpu: {n} int64 keys x {dim} float32 = {table_bytes / 2**30:.2f} GiB of rows "
        f"({payload / GB:.2f} GB payload), var_type {args.var_type}, best of {args.repeat} rounds, "
        f"{args.cache} page cache, seed {args.seed}"
    )
    for key, value in machine.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k}: {v}" for k, v in value.items())
        print(f"  {key:<20} {value}")

    options = {"init_capacity": n}
    if args.var_type == "hybrid":
        capacity = 1 << max(0, 2 * n - 1).bit_length()
        options = {"init_capacity": capacity, "max_capacity": capacity}
    rng = np.random.default_rng(args.seed)
    keys = rng.permutation(np.arange(n, dtype=np.int64) * 2654435761 + 12345)  # distinct, not in order
    rows = np.empty((n, dim), dtype=np.float32)
    var = sok.DynamicVariable(dimension=dim, var_type=args.var_type, name="bench", initializer="zeros", **options)
    with TqdmCallback(desc="fill", unit="row", unit_scale=True, file=sys.stderr) as bar:
        bar.set_size(n)
        for start in range(0, n, FILL_BATCH):
            part = slice(start, start + FILL_BATCH)
            rows[part] = rng.standard_normal((len(keys[part]), dim), dtype=np.float32)
            var.storage.insert_or_assign(keys[part], rows[part])
            bar.relative_update(len(keys[part]))
    check("fill", var.storage.size() == n)

    work = tempfile.mkdtemp(prefix="sok-checkpoint-bench-", dir=args.dir)
    ckpt, raw_dir = os.path.join(work, "ckpt"), os.path.join(work, "raw")
    samples: dict[str, list[float]] = {"raw write": [], "dump": [], "raw read": [], "load": []}
    anatomy: dict[str, float] = {}
    try:
        with TqdmCallback(desc="checkpoint_cpu", unit="step", file=sys.stderr) as bar:
            bar.set_size(4 * args.repeat + 1)
            for round_index in range(args.repeat):
                shutil.rmtree(raw_dir, ignore_errors=True)
                shutil.rmtree(ckpt, ignore_errors=True)
                gc.collect()
                seconds, raw_paths = timed(raw_write, raw_dir, keys, rows)
                samples["raw write"].append(seconds)
                bar.relative_update(1)

                seconds, _ = timed(sok.dump, ckpt, var)
                samples["dump"].append(seconds)
                bar.relative_update(1)

                if args.cache == "cold":
                    drop_from_page_cache(raw_paths)
                seconds, (got_keys, got_rows) = timed(raw_read, raw_paths, dim)
                samples["raw read"].append(seconds)
                if round_index == 0:
                    check("raw read", np.array_equal(got_keys, keys) and np.array_equal(got_rows, rows))
                del got_keys, got_rows
                bar.relative_update(1)

                fresh = sok.DynamicVariable(
                    dimension=dim, var_type=args.var_type, name="bench", initializer="zeros", **options
                )
                gc.collect()
                if args.cache == "cold":
                    drop_from_page_cache(files_in(ckpt))
                seconds, _ = timed(sok.load, ckpt, fresh)
                samples["load"].append(seconds)
                if round_index == 0:
                    pick = rng.choice(n, size=min(n, VERIFY_SAMPLE), replace=False)
                    found_rows, found = fresh.storage.find(keys[pick])
                    check("load", fresh.storage.size() == n and found.all() and np.array_equal(found_rows, rows[pick]))
                del fresh
                bar.relative_update(1)

            # Where the time goes: the parts of dump and load, timed once on their own.
            gc.collect()
            anatomy["export in chunks (reused buffers)"], _ = timed(export_in_chunks, var.storage, dim)
            infos = [fmt.read_header(path) for path in files_in(ckpt) if not path.endswith(fmt.MANIFEST)]
            drop_from_page_cache([info.path for info in infos])
            anatomy["read + CRC-32 of the files (cold)"], _ = timed(read_as_load_does, infos, n)
            target = sok.DynamicVariable(
                dimension=dim, var_type=args.var_type, name="bench", initializer="zeros", **options
            )
            chunk_rows = max(1, fmt.READ_CHUNK // (4 * dim))
            anatomy["insert_or_assign in load's chunks"], _ = timed(
                insert_in_chunks, target.storage, keys, rows, chunk_rows
            )
            del target
            bar.relative_update(1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    machine["load_average_end"] = load_average()

    best = {name: min(v) for name, v in samples.items()}
    median = {name: statistics.median(v) for name, v in samples.items()}
    baseline = {"dump": "raw write", "load": "raw read"}
    header = f"{'op':<10} {'best s':>8} {'median s':>9} {'GB/s':>7} {'spread':>7} {'vs raw':>7}"
    print()
    print(header)
    print("-" * len(header))
    rows_out = []
    for name in ("raw write", "dump", "raw read", "load"):
        ratio = best[baseline[name]] / best[name] if name in baseline else None
        spread = 100 * (max(samples[name]) - min(samples[name])) / median[name]
        rows_out.append(
            {
                "op": name,
                "best_s": best[name],
                "median_s": median[name],
                "gb_per_s": payload / best[name] / GB,
                "spread_pct": spread,
                "vs_raw": ratio,
            }
        )
        print(
            f"{name:<10} {best[name]:>8.2f} {median[name]:>9.2f} {payload / best[name] / GB:>7.2f} {spread:>6.0f}% "
            f"{'' if ratio is None else f'{ratio:.2f}x':>7}"
        )
    print()
    print(f"GB/s = {payload / GB:.2f} GB of keys and rows (headers and manifest not counted) over the best round;")
    print(
        "vs raw = throughput over NumPy tofile+fsync (dump) or fromfile (load) of the same bytes; spread = "
        "(max - min) / median."
    )
    print("where the time goes (each part timed once on its own, seconds; load overlaps the read and the insert):")
    for part, seconds in anatomy.items():
        print(f"  {part:<34} {seconds:6.2f}")
    print(
        f"load average (1, 5, 15 min): {machine['load_average_start']} at start, "
        f"{machine['load_average_end']} at end (this benchmark adds about one)"
    )

    goals = [
        {"goal": f"dump >= {GOAL}x raw write (tofile + fsync)", "value": best["raw write"] / best["dump"]},
        {"goal": f"load >= {GOAL}x raw read (fromfile)", "value": best["raw read"] / best["load"]},
    ]
    print()
    for goal in goals:
        goal["target"] = GOAL
        goal["pass"] = goal["value"] >= GOAL
        print(f"{'PASS' if goal['pass'] else 'FAIL'}  {goal['goal']:<40} {goal['value']:.2f}x")

    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "benchmark": "checkpoint_cpu",
                    "config": {k: v for k, v in vars(args).items() if k != "json"},
                    "machine": machine,
                    "samples_s": samples,
                    "rows": rows_out,
                    "anatomy_s": anatomy,
                    "goals": goals,
                },
                f,
                indent=1,
            )
        print(f"wrote {args.json}")
    return 1 if args.check and not all(g["pass"] for g in goals) else 0


if __name__ == "__main__":
    sys.exit(main())
