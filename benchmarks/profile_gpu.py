#!/usr/bin/env python
"""Kernel time of the GPU storage operations: where one 1 Mi-key call of det / hkv spends its time.

``storage_gpu.py`` times whole calls; this script splits them. Per table and dim it makes a table of
``--capacity-mi`` Mi slots with ``storage_gpu.py``'s options and drives it with ``storage_gpu.py``'s
``TableBench``: the same fill to ``--load`` (default 0.5; continuous keys 0, 1, 2, ..., top-ups
where eviction lost keys) and the same batch (the first 629,145 keys of the last fill batch and
419,431 new keys from 2**64 - 1 down). It runs each operation ``--calls`` times, each call under its
own ``torch.profiler`` session (CUPTI), refilling the table before each inserting call so that every
call sees the same state. It prints the mean GPU time per call of every kernel,
memset and copy. Not a benchmark: there is no baseline and no ratio.

Needs CuPy, a CUDA Torch and CUDA builds of sok-backend-det / sok-backend-hkv (exit status 2
otherwise). Used to find the kernel worth working on (for example the placing kernel of
find_or_insert at dim 128, most of the call before it wrote new rows in one pass).

With ``--overhead`` it instead times the fixed cost of a call on the host: the median wall time of
a one-key call plus a device synchronize (HKV's timer, as ``storage_gpu.py`` uses it) of each
operation against an empty CuPy kernel plus a synchronize, and the parts of a call that happen in
Python (reading ``__cuda_array_interface__``).

With ``--host-split`` it splits the host time of the 1 Mi-key calls that ``storage_gpu.py``'s ratios
use: per call, the CPU time until the call returns (``perf_counter``, no synchronize), the GPU time
between CUDA events recorded just before and after it (no spin kernel first, so the launch's wait
shows), and the host total with the synchronize; ``--calls`` fresh fills, each timed once ("cold",
as ``storage_gpu.py`` times), then for the lookups ``--calls`` repeats on the same state ("warm").

Usage::

    python3 benchmarks/profile_gpu.py                        # dims 8 and 128, det and hkv
    python3 benchmarks/profile_gpu.py --overhead             # host cost of a one-key call
    python3 benchmarks/profile_gpu.py --host-split --tables hkv --dims 64 --load 0.75  # a call's host time, split
    python3 benchmarks/profile_gpu.py --dims 64 --tables hkv --ops find_or_insert --calls 5
    python3 benchmarks/profile_gpu.py --tables hkv --load 1.0  # eviction on every insert
    python3 benchmarks/profile_gpu.py --tables hkv --mode hybrid --dims 64 --capacity-mi 16
"""

from __future__ import annotations

import argparse
import functools
import importlib
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

from storage_gpu import INSERTING_OPS, MI, MODES, TABLES, TableBench, create_table, free_device_memory

# profile_gpu's operation -> storage_gpu's (TableBench.calls): find_hits is what storage_gpu times as find.
BENCH_OPS = {
    "find_hits": "find",
    "find": "find_default",
    "find_or_insert": "find_or_insert",
    "insert_or_assign": "insert_or_assign",  # with the unique-keys hint, as storage_gpu
    "insert_or_assign_dedup": "insert_or_assign_dedup",
    "insert_and_evict": "insert_and_evict",
    "export_batch": "export_batch",  # over the slots storage_gpu scans at --load
}
OPS = tuple(BENCH_OPS)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[8, 128], help="row widths (default: 8 128)")
    parser.add_argument("--tables", nargs="+", choices=sorted(TABLES), default=sorted(TABLES))
    parser.add_argument("--ops", nargs="+", choices=OPS, default=["find_hits", "find_or_insert", "insert_or_assign"])
    parser.add_argument("--capacity-mi", type=int, default=32, help="slots of each table in Mi (default: 32)")
    parser.add_argument("--calls", type=int, default=3, help="profiled calls per operation (default: 3)")
    parser.add_argument("--load", type=float, default=0.5, help="keys / slots before each call (default: 0.5)")
    parser.add_argument(
        "--mode",
        choices=sorted(MODES),
        default="device",
        help="device: rows in device memory (default); hybrid: half of the rows in host memory (hkv only)",
    )
    parser.add_argument("--overhead", action="store_true", help="time one-key calls on the host instead")
    parser.add_argument(
        "--host-split", action="store_true", help="split the host time of 1 Mi-key calls (CPU, events, total) instead"
    )
    args = parser.parse_args(argv)
    if args.mode == "hybrid" and "det" in args.tables:
        parser.error("--mode hybrid needs --tables hkv (det keeps every row in device memory)")
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
    """storage_gpu's state and batch (TableBench: fill to --load with top-ups, 60/40 keys), then each
    operation under its own profiler session per call, refilled before each inserting call."""
    capacity = args.capacity_mi * MI
    table = create_table(core, kind, args.mode, dim, capacity)
    bench = TableBench(cp, kind, table, dim, capacity)
    state = bench.fill(args.load)
    batch = bench.batch()
    for op in args.ops:
        bench_op = BENCH_OPS[op]
        slots = bench.slots_for(bench_op, args.load, state)
        bench.run(bench_op, batch, slots)  # warm-up
        totals: dict[str, list[float]] = {}  # kernel name -> [GPU us, launches] over every call
        for _ in range(args.calls):
            if bench_op in INSERTING_OPS:
                bench.fill(args.load)
            cp.cuda.runtime.deviceSynchronize()
            with profiler.profile(activities=[profiler.ProfilerActivity.CUDA]) as prof:
                bench.run(bench_op, batch, slots)
                cp.cuda.runtime.deviceSynchronize()
            for event in prof.key_averages():
                total = totals.setdefault(event.key, [0.0, 0])
                total[0] += event.device_time_total
                total[1] += event.count
        title = f"{kind} {args.mode} dim {dim} load {args.load} {op}"
        print(f"== {title}: mean GPU time per call, {args.calls} calls", flush=True)
        for key, (time_us, count) in sorted(totals.items(), key=lambda item: -item[1][0]):
            if time_us > 0:
                print(f"  {time_us / args.calls:9.1f} us  x{count // args.calls:<2} {key[:100]}")


OVERHEAD_CALLS = 300
_EMPTY_SOURCE = 'extern "C" __global__ void profile_gpu_empty() {}'


def median_us(cp: Any, call: Callable[[], Any], sync: bool = True) -> float:
    """Median wall time in microseconds of ``call`` (plus a device synchronize when ``sync``)."""
    samples = []
    for _ in range(OVERHEAD_CALLS):
        cp.cuda.runtime.deviceSynchronize()
        start = time.perf_counter()
        call()
        if sync:
            cp.cuda.runtime.deviceSynchronize()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


def overhead(cp: Any, cores: dict[str, Any], dim: int) -> None:
    """Host cost of one-key calls of each table against an empty kernel and its parts in Python."""
    empty = cp.RawKernel(_EMPTY_SOURCE, "profile_gpu_empty")
    keys = cp.arange(1, dtype=cp.uint64)
    out = cp.empty((1, dim), cp.float32)
    base = median_us(cp, lambda: empty((1,), (1,), ()))
    print(f"== host time of a one-key call + device synchronize, median of {OVERHEAD_CALLS}, dim {dim}")
    print(f"  {base:7.1f} us  empty CuPy kernel (the floor)")
    print(f"  {median_us(cp, lambda: None):7.1f} us  synchronize alone")
    cai = median_us(cp, lambda: (keys.__cuda_array_interface__, out.__cuda_array_interface__), sync=False)
    print(f"  {cai:7.1f} us  two __cuda_array_interface__ reads (no synchronize)")
    for kind, core in cores.items():
        table_overhead(cp, core, kind, dim, base)


def table_overhead(cp: Any, core: Any, kind: str, dim: int, base: float) -> None:
    """One-key calls of each operation of one table, against the floor ``base``."""
    table = create_table(core, kind, "device", dim, 2 * MI)
    keys = cp.arange(1, dtype=cp.uint64)
    out = cp.zeros((1, dim), cp.float32)
    found = cp.empty(1, cp.bool_)
    table.insert_or_assign(keys, 0, dim, out, None, [])
    calls = {
        "find_hits": lambda: table.find_hits(keys, 0, dim, out, found),
        "find": lambda: table.find(keys, 0, dim, out, None, found),
        "find_or_insert": lambda: table.find_or_insert(keys, 0, dim, out, found, None, []),
        "insert_or_assign": lambda: table.insert_or_assign(keys, 0, dim, out, None, []),
        "size": lambda: table.size(),
    }
    for op, call in calls.items():
        spent = median_us(cp, call)
        print(f"  {spent:7.1f} us  {kind} {op} (+{spent - base:.1f} us over the floor)", flush=True)


def host_split(cp: Any, core: Any, kind: str, dim: int, args: argparse.Namespace) -> None:
    """CPU, event and host time of each operation's 1 Mi-key calls, cold (after a fill) and warm."""
    capacity = args.capacity_mi * MI
    table = create_table(core, kind, args.mode, dim, capacity)
    bench = TableBench(cp, kind, table, dim, capacity)
    print(f"== {kind} {args.mode} dim {dim} load {args.load}: us per call (cpu: until it returns; events: GPU)")
    for op in args.ops:
        bench_op = BENCH_OPS[op]
        for _ in range(args.calls):
            state = bench.fill(args.load)
            slots = bench.slots_for(bench_op, args.load, state)
            bench.warmup(bench_op)
            keys = bench.batch()
            repeats = 1 if bench_op in INSERTING_OPS else 1 + args.calls
            for rep in range(repeats):
                cpu, events, host = split_call(cp, functools.partial(bench.run, bench_op, keys, slots))
                state_name = "cold" if rep == 0 else "warm"
                print(f"  {op:22s} {state_name}  cpu {cpu:7.1f}  events {events:7.1f}  host {host:7.1f}", flush=True)


def split_call(cp: Any, call: Callable[[], Any]) -> tuple[float, float, float]:
    """(CPU us until ``call`` returns, GPU us between events around it, host us with the synchronize)."""
    start, end = cp.cuda.Event(), cp.cuda.Event()
    cp.cuda.runtime.deviceSynchronize()
    began = time.perf_counter()
    start.record()
    call()
    end.record()
    returned = time.perf_counter()
    cp.cuda.runtime.deviceSynchronize()
    done = time.perf_counter()
    return (returned - began) * 1e6, cp.cuda.get_elapsed_time(start, end) * 1e3, (done - began) * 1e6


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cp, profiler, cores = modules(args.tables)
    if args.host_split:
        for dim in args.dims:
            for kind, core in cores.items():
                host_split(cp, core, kind, dim, args)
                free_device_memory(cp)
        return 0
    if args.overhead:
        overhead(cp, cores, args.dims[0])
        return 0
    for dim in args.dims:
        for kind, core in cores.items():
            profile(cp, profiler, core, kind, dim, args)
            free_device_memory(cp)  # TableBench's bound methods hold it in a cycle: collect the table now
    return 0


if __name__ == "__main__":
    sys.exit(main())
