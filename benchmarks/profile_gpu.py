#!/usr/bin/env python
"""Kernel time of the GPU storage operations: where one 1 Mi-key call of det / hkv spends its time.

``storage_gpu.py`` times whole calls; this script splits them. Per table and dim it fills a table of
``--capacity-mi`` Mi slots to ``--load`` (default 0.5) with the continuous keys 0, 1, 2, ... (as
``storage_gpu.py`` does, with its table options), builds its batch (the first 629,145 keys of the
last fill batch and 419,431 new keys from 2**64 - 1 down), and runs each operation ``--calls`` times,
each call under its own ``torch.profiler`` session (CUPTI), refilling the table before each inserting
call so that every call sees the same state. It prints the mean GPU time per call of every kernel,
memset and copy. Not a benchmark: there is no baseline and no ratio.

Needs CuPy, a CUDA Torch and CUDA builds of sok-backend-det / sok-backend-hkv (exit status 2
otherwise). Used to find the kernel worth working on (for example the placing kernel of
find_or_insert at dim 128, 481 us of an 880 us call, before it wrote new rows in one pass).

Usage::

    python3 benchmarks/profile_gpu.py                        # dims 8 and 128, det and hkv
    python3 benchmarks/profile_gpu.py --dims 64 --tables hkv --ops find_or_insert --calls 5
    python3 benchmarks/profile_gpu.py --tables hkv --load 1.0  # eviction on every insert
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any, NoReturn

from storage_gpu import INSERTING_OPS, MI, N_HIT, N_NEW, TABLES, table_options

OPS = ("find_hits", "find", "find_or_insert", "insert_or_assign")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[8, 128], help="row widths (default: 8 128)")
    parser.add_argument("--tables", nargs="+", choices=sorted(TABLES), default=sorted(TABLES))
    parser.add_argument("--ops", nargs="+", choices=OPS, default=["find_hits", "find_or_insert", "insert_or_assign"])
    parser.add_argument("--capacity-mi", type=int, default=32, help="slots of each table in Mi (default: 32)")
    parser.add_argument("--calls", type=int, default=3, help="profiled calls per operation (default: 3)")
    parser.add_argument("--load", type=float, default=0.5, help="keys / slots before each call (default: 0.5)")
    args = parser.parse_args(argv)
    if args.capacity_mi < 2 or args.calls < 1 or not 0.0 < args.load <= 1.0:
        parser.error(
            f"--capacity-mi must be >= 2, --calls >= 1 and 0 < --load <= 1,"
            f" got {args.capacity_mi}, {args.calls} and {args.load}"
        )
    return args


def modules(tables: list[str]) -> tuple[Any, Any, dict[str, Any]]:
    """CuPy, torch.profiler and each table's native module, or exit 2 saying what is missing."""
    try:
        import cupy
        from torch import profiler

        cores = {kind: importlib.import_module(f"{TABLES[kind]}._core") for kind in tables}
    except ImportError as error:
        fail(f"needs CuPy, a CUDA Torch and the backends: {error}")
    for kind, core in cores.items():
        if not core.BUILD_INFO.get("cuda"):
            fail(f"{TABLES[kind]} was built without CUDA (BUILD_INFO {core.BUILD_INFO})")
    return cupy, profiler, cores


def fail(message: str) -> NoReturn:
    print(f"profile_gpu: {message}", file=sys.stderr)
    sys.exit(2)


def profile(cp: Any, profiler: Any, core: Any, kind: str, dim: int, args: argparse.Namespace) -> None:
    capacity = args.capacity_mi * MI
    table = core.Table("uint64", dim, table_options(kind, "device", dim, capacity), device="cuda:0")
    values = cp.zeros((MI, dim), cp.float32)
    target = int(capacity * args.load)

    def fill() -> Any:
        """Clear, then keys 0 .. target - 1 in 1 Mi calls; returns the last call's keys."""
        table.clear()
        for start in range(0, target, MI):
            keys = cp.arange(start, min(start + MI, target), dtype=cp.uint64)
            table.insert_or_assign(keys, 0, dim, values[: keys.shape[0]], None, [])
        return keys

    last = fill()
    hits = last[: min(N_HIT, last.shape[0])]
    batch = cp.concatenate([hits, cp.uint64(2**64 - 1) - cp.arange(N_NEW, dtype=cp.uint64)])
    out = cp.empty((batch.shape[0], dim), cp.float32)
    found = cp.empty(batch.shape[0], cp.bool_)
    calls = {
        "find_hits": lambda: table.find_hits(batch, 0, dim, out, found),
        "find": lambda: table.find(batch, 0, dim, out, None, found),
        "find_or_insert": lambda: table.find_or_insert(batch, 0, dim, out, found, None, []),
        "insert_or_assign": lambda: table.insert_or_assign(batch, 0, dim, values[: batch.shape[0]], None, []),
    }
    for op in args.ops:
        call = calls[op]
        call()  # warm-up
        totals: dict[str, list[float]] = {}  # kernel name -> [GPU us, launches] over every call
        for _ in range(args.calls):
            if op in INSERTING_OPS:
                fill()
            cp.cuda.runtime.deviceSynchronize()
            with profiler.profile(activities=[profiler.ProfilerActivity.CUDA]) as prof:
                call()
                cp.cuda.runtime.deviceSynchronize()
            for event in prof.key_averages():
                total = totals.setdefault(event.key, [0.0, 0])
                total[0] += event.device_time_total
                total[1] += event.count
        print(f"== {kind} dim {dim} load {args.load} {op}: mean GPU time per call, {args.calls} calls", flush=True)
        for key, (time_us, count) in sorted(totals.items(), key=lambda item: -item[1][0]):
            if time_us > 0:
                print(f"  {time_us / args.calls:9.1f} us  x{count // args.calls:<2} {key[:100]}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cp, profiler, cores = modules(args.tables)
    for dim in args.dims:
        for kind, core in cores.items():
            profile(cp, profiler, core, kind, dim, args)  # the table is freed on return
            cp.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    sys.exit(main())
