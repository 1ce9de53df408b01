#!/usr/bin/env python
"""Where one process's SOK training step spends its time: its phases timed apart, and a trace of it.

``scaling_gpu.py`` times the whole step; this script splits the same step (its tables, ids and
optimizer) in one process, per table kind:

* phases, each a ``tf.function`` of its own over the same batches (ids in GPU memory), best of
  ``--repeat`` rounds of ``--steps`` steps: ``forward`` (``sok.lookup_sparse`` and the loss),
  ``backward`` (the forward and the tables' gradients, each reduced to one number so that none is
  pruned) and ``step`` (forward, backward and ``sok.OptimizerWrapper(Adagrad)``: the benchmark's
  step). The differences are the backward's and the optimizer's shares.
* a trace of ``--trace-steps`` calls of each phase under TensorFlow's profiler, summarised from its
  XPlane: per step, the GPU's busy time (union of its kernels and copies) against the wall time,
  the number of kernels, the device-to-host copies (count and bytes), the stream and event
  synchronisations the host made (CUDA API calls), the kernels that take the most time, and the
  host's TensorFlow ops that take the most time, and for the GPU's idle gaps of 20 us or more
  what the host ran meanwhile (each TensorFlow op's overlap with them, and the idle time during
  which no op ran: Python, the tf.function call). A GPU that is idle most of the step means the
  host launches too slowly or waits for the GPU (a synchronisation), not that a kernel is slow.

Not a benchmark (no baseline, no ratio): it finds what to work on. The raw traces are written to
``--trace-dir`` (TensorBoard's profile plugin reads them; ``--summarize-trace FILE`` prints the
summary of one again).

Under ``horovodrun -np N`` each rank runs the same steps on its own ids and rank 0 prints its
figures and traces its steps (the exchange's collectives included).

Usage::

    python benchmarks/profile_step.py --kinds static,dynamic --dims 32
    horovodrun -np 2 -H localhost:2 --gloo python benchmarks/profile_step.py --kinds static
    python benchmarks/profile_step.py --quick                     # tiny sizes (CPU too)
"""

from __future__ import annotations

import argparse
import bisect
import glob
import json
import os
import re
import sys
import tempfile
from collections import Counter
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from scaling_gpu import (  # noqa: E402
    HOTNESS,
    KINDS,
    device,
    device_name,
    flat_pool,
    flat_signature,
    make_pool,
    make_step,
    make_tables,
    pooled_loss,
    ragged_ids,
    table_rows,
)
from train_gpu import POOL, best_time  # noqa: E402

PHASES = ("forward", "backward", "step")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kinds", default="static,dynamic", help="comma-separated of " + ",".join(KINDS))
    p.add_argument("--dims", default="32", help="comma-separated")
    p.add_argument("--hotness", choices=HOTNESS, default="2")
    p.add_argument("--tables", choices=["criteo", "uniform"], default="criteo")
    p.add_argument("--cap", type=int, default=2**20)
    p.add_argument("--batch", type=int, default=65536)
    p.add_argument("--zipf", type=float, default=1.1)
    p.add_argument("--seed", type=int, default=37)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--trace-steps", type=int, default=5)
    p.add_argument("--trace-dir", default=None, help="where the raw trace goes (default: a temporary folder)")
    p.add_argument("--top", type=int, default=20, help="rows of each top list")
    p.add_argument("--json", help="write the figures to this file too")
    p.add_argument("--summarize-trace", metavar="XPLANE", help="print the summary of this .xplane.pb and exit")
    p.add_argument("--quick", action="store_true", help="tiny sizes: batch 512, cap 4 Ki, dim 8, 3 steps")
    args = p.parse_args(argv)
    args.kinds = [k for k in args.kinds.split(",") if k]
    unknown = sorted(set(args.kinds) - set(KINDS))
    if unknown:
        p.error(f"--kinds: {unknown} are not kinds; valid: {', '.join(KINDS)}")
    args.dims = [int(d) for d in args.dims.split(",") if d]
    if args.quick:
        args.batch, args.cap, args.dims, args.steps, args.warmup, args.repeat = 512, 2**12, [8], 3, 1, 1
        args.trace_steps = 2
    return args


def phase_bodies(tables: list[Any], batch: int) -> dict[str, Any]:
    """``phase -> body(ragged_ids) -> scalar``: the three nested parts of the benchmark's step."""
    import tensorflow as tf

    def forward(ids: list[Any]) -> Any:
        return pooled_loss(tables, ids, batch)

    def backward(ids: list[Any]) -> Any:
        with tf.GradientTape() as tape:
            loss = pooled_loss(tables, ids, batch)
        grads = tape.gradient(loss, tables)
        return loss + tf.add_n([tf.reduce_sum(g.values if isinstance(g, tf.IndexedSlices) else g) for g in grads])

    return {"forward": forward, "backward": backward, "step": make_step(tables, batch)}


def compiled(body: Any, pool: list[list[tuple]], batch: int, ragged_args: bool = False) -> Any:
    """``call(i)``: ``body`` as a tf.function on the pool's batch ``i % POOL``, ids in GPU memory,
    given as flat tensors (values and row splits per table, as ``scaling_gpu.py`` gives them) or,
    with ``ragged_args``, as one RaggedTensor per table (TensorFlow's composite-argument handling
    then runs on every call)."""
    import tensorflow as tf

    with tf.device(device()):
        flat = [[tf.identity(tf.constant(a)) for a in b] for b in flat_pool(pool)]
    if ragged_args:
        batches = [ragged_ids(b) for b in flat]
        spec = tf.RaggedTensorSpec([batch, None], tf.int64, ragged_rank=1, row_splits_dtype=tf.int64)
        fn = tf.function(body, input_signature=[[spec] * len(pool[0])], autograph=False)
        return lambda i: fn(batches[i % POOL])
    fn = tf.function(lambda *args: body(ragged_ids(args)), input_signature=flat_signature(len(pool[0]), batch),
                     autograph=False)  # fmt: skip
    return lambda i: fn(*flat[i % POOL])


def best_ms(call: Any, steps: int, warmup: int, repeat: int) -> float:
    """Best milliseconds per call of ``call(i)`` (train_gpu.py's timing: the last result on the host)."""
    return best_time(call, lambda out: out.numpy(), steps, warmup, repeat) * 1e3


def trace(call: Any, steps: int, logdir: str) -> str:
    """Runs ``steps`` calls under TensorFlow's profiler; the path of the XPlane it wrote."""
    import tensorflow as tf

    call(0).numpy()
    tf.profiler.experimental.start(logdir, tf.profiler.experimental.ProfilerOptions(host_tracer_level=3))
    out = None
    for i in range(steps):
        out = call(i)
    out.numpy()
    tf.profiler.experimental.stop()
    paths = sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True), key=os.path.getmtime)
    if not paths:
        raise RuntimeError(f"the profiler wrote no .xplane.pb under {logdir}")
    return paths[-1]


def _union_us(intervals: list[tuple[int, int]]) -> float:
    total, end = 0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total / 1e6


def _merged(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``intervals`` merged where they overlap or touch, in order."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


#: GPU idle gaps shorter than this (picoseconds) are a launch's latency, not a wait.
GAP_PS = 20_000_000


def idle_gaps(gpu: list[tuple[int, int]], host_ops: list[tuple[int, int, str]], top: int) -> dict[str, Any]:
    """The GPU's idle gaps of at least :data:`GAP_PS` between its first and last event, and what the
    host ran meanwhile: per TensorFlow op (``host_ops``: begin, end, "name:Type"), the idle time its
    run overlaps, and the idle time no op covers (the host in Python, e.g. the tf.function call, or
    between ops). Times in microseconds over the whole trace."""
    busy = _merged(gpu)
    gaps = [(a[1], b[0]) for a, b in zip(busy, busy[1:]) if b[0] - a[1] >= GAP_PS]
    ends = [end for _, end in gaps]
    covered: list[list[tuple[int, int]]] = [[] for _ in gaps]
    by_op: Counter = Counter()
    for begin, end, name in host_ops:  # each op against the few (disjoint, sorted) gaps it overlaps
        g = bisect.bisect_right(ends, begin)
        while g < len(gaps) and gaps[g][0] < end:
            a, b = max(begin, gaps[g][0]), min(end, gaps[g][1])
            by_op[name] += (b - a) / 1e6
            covered[g].append((a, b))
            g += 1
    uncovered = sum((end - start) / 1e6 - _union_us(c) for (start, end), c in zip(gaps, covered))
    return {
        "gaps": len(gaps),
        "idle_us": sum(b - a for a, b in gaps) / 1e6,
        "no_op_us": uncovered,
        "by_op": by_op.most_common(top),
    }


def _stats(plane: Any, event: Any) -> dict[str, Any]:
    """The stats of an event and of its metadata, by name (str, int or float values)."""
    out = {}
    for stat in list(plane.event_metadata[event.metadata_id].stats) + list(event.stats):
        kind = stat.WhichOneof("value")
        value = getattr(stat, kind) if kind else None
        if kind == "ref_value":
            value = plane.stat_metadata[value].name
        out[plane.stat_metadata[stat.metadata_id].name] = value
    return out


def _copy_bytes(stats: dict[str, Any]) -> int:
    """The size of a copy event from its stats (``memcpy_details``' ``size:`` or a byte count; 0 when
    it names none)."""
    details = stats.get("memcpy_details")
    if isinstance(details, str):
        for part in details.replace(",", " ").split():
            if part.startswith(("size:", "num_bytes:")):
                return int(part.split(":", 1)[1])
    for name in ("num_bytes", "bytes", "size"):
        if isinstance(stats.get(name), int):
            return int(stats[name])
    return 0


def _copy_kind(lowered_name: str) -> str | None:
    """The direction of a GPU event that is a copy ("memcpy device-to-host", ...), None for a kernel."""
    if "memcpy" not in lowered_name:
        return None
    if "dtoh" in lowered_name or "d2h" in lowered_name:
        return "memcpy device-to-host"
    if "htod" in lowered_name or "h2d" in lowered_name:
        return "memcpy host-to-device"
    return "memcpy device-to-device"


#: A TensorFlow op's host event: "scope/name:OpType".
_OP_EVENT = re.compile(r"^[^ :]+:[A-Za-z0-9_]+$")


def summarize_xplane(path: str, steps: int, top: int) -> dict[str, Any]:
    """Per step figures of a trace (see the module docstring)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    out: dict[str, Any] = {"steps": steps}
    op_runs: list[tuple[int, int, str]] = []  # the host's TensorFlow ops: begin, end (ps), name
    gpu_spans: dict[str, list[tuple[int, int]]] = {}
    host_ops: Counter = Counter()
    host_counts: Counter = Counter()
    api: Counter = Counter()
    cupti = False
    for plane in space.planes:
        names = {k: v.name for k, v in plane.event_metadata.items()}
        if plane.name.startswith("/device:GPU"):
            kernels: Counter = Counter()
            counts: Counter = Counter()
            spans: list[tuple[int, int]] = []
            copies: dict[str, Counter] = {"d2h": Counter(), "d2h_bytes": Counter(), "h2d": Counter()}
            by_type: Counter = Counter()  # GPU time by the TensorFlow op type that launched it
            for line in plane.lines:
                for ev in line.events:
                    name = names.get(ev.metadata_id, "?")
                    begin = line.timestamp_ns * 1000 + ev.offset_ps
                    spans.append((begin, begin + ev.duration_ps))
                    kernels[name] += ev.duration_ps / 1e6
                    counts[name] += 1
                    stats = _stats(plane, ev)
                    op = str(stats.get("tf_op", "?"))
                    lowered = name.lower()
                    copy = _copy_kind(lowered)
                    by_type[copy or op.rsplit(":", 1)[-1]] += ev.duration_ps / 1e6
                    if copy == "memcpy device-to-host":
                        copies["d2h"][op] += 1
                        copies["d2h_bytes"][op] += _copy_bytes(stats)
                    elif copy == "memcpy host-to-device":
                        copies["h2d"][op] += 1
            if not spans:
                continue
            gpu_spans[plane.name] = spans
            window = (max(b for _, b in spans) - min(a for a, _ in spans)) / 1e6
            out[plane.name] = {
                "window_us_per_step": window / steps,
                "busy_us_per_step": _union_us(spans) / steps,
                "events_per_step": sum(counts.values()) / steps,
                "d2h_copies_per_step": sum(copies["d2h"].values()) / steps,
                "d2h_bytes_per_step": sum(copies["d2h_bytes"].values()) / steps,
                "h2d_copies_per_step": sum(copies["h2d"].values()) / steps,
                # The TensorFlow op of each copy (its "name:type"): where the host waits or moves data.
                "d2h_by_op": [
                    (op, copies["d2h"][op] / steps, size / steps) for op, size in copies["d2h_bytes"].most_common(top)
                ],
                "h2d_by_op": [(op, count / steps) for op, count in copies["h2d"].most_common(top)],
                "top": [(n, us / steps, counts[n] / steps) for n, us in kernels.most_common(top)],
                # Every op type's GPU time (copies by direction; "?" where the event names no op).
                "by_op_type": [(t, us / steps) for t, us in by_type.most_common()],
            }
        elif plane.name.startswith("/host:CUPTI"):
            cupti = True
            for line in plane.lines:
                for ev in line.events:
                    api[names.get(ev.metadata_id, "?")] += 1
        elif plane.name.startswith("/host:CPU"):
            for line in plane.lines:
                for ev in line.events:
                    name = names.get(ev.metadata_id, "?")
                    host_ops[name] += ev.duration_ps / 1e6
                    host_counts[name] += 1
                    if _OP_EVENT.match(name):
                        begin = line.timestamp_ns * 1000 + ev.offset_ps
                        op_runs.append((begin, begin + ev.duration_ps, name))
    for plane_name, spans in gpu_spans.items():
        gaps = idle_gaps(spans, op_runs, top)
        out[plane_name]["idle_gaps"] = {
            "gaps_per_step": gaps["gaps"] / steps,
            "idle_us_per_step": gaps["idle_us"] / steps,
            "no_op_us_per_step": gaps["no_op_us"] / steps,
            "by_op": [(name, us / steps) for name, us in gaps["by_op"]],
        }
    out["cuda_api_per_step"] = {n: c / steps for n, c in api.most_common(top)}
    # None, not 0, when the trace has no CUDA API calls to count (TensorFlow 2.21's GPU traces keep
    # none): then the device-to-host copies are the sign of the host's waits.
    out["syncs_per_step"] = sum(c for n, c in api.items() if "Synchronize" in n) / steps if cupti else None
    out["host_top"] = [(n, us / steps, host_counts[n] / steps) for n, us in host_ops.most_common(top)]
    by_type: Counter = Counter()
    type_counts: Counter = Counter()
    for name, us in host_ops.items():
        if _OP_EVENT.match(name):
            op_type = name.rsplit(":", 1)[1]
            by_type[op_type] += us
            type_counts[op_type] += host_counts[name]
    out["ops_per_step"] = sum(type_counts.values()) / steps
    out["op_types"] = [(t, us / steps, type_counts[t] / steps) for t, us in by_type.most_common(top)]
    return out


def print_summary(title: str, summary: dict[str, Any]) -> None:
    print(f"\n== trace of {title}: per step")
    for plane, s in summary.items():
        if not plane.startswith("/device:GPU"):
            continue
        busy, window = s["busy_us_per_step"], s["window_us_per_step"]
        print(f"{plane}: GPU busy {busy:.0f} us of {window:.0f} us ({busy / window:.0%}), "
              f"{s['events_per_step']:.0f} kernels and copies, {s['d2h_copies_per_step']:.1f} device-to-host "
              f"copies ({s['d2h_bytes_per_step']:.0f} B), {s['h2d_copies_per_step']:.1f} host-to-device")  # fmt: skip
        for name, us, count in s["top"]:
            print(f"  {us:9.1f} us {count:6.1f}x  {name[:110]}")
        print("  device-to-host copies by TensorFlow op, by bytes:")
        for op, count, size in s["d2h_by_op"]:
            print(f"  {count:6.1f}x {size:12.0f} B  {op[:100]}")
        print("  host-to-device copies by TensorFlow op:")
        for op, count in s["h2d_by_op"]:
            print(f"  {count:6.1f}x  {op[:100]}")
        gaps = s["idle_gaps"]
        idle, count, no_op = gaps["idle_us_per_step"], gaps["gaps_per_step"], gaps["no_op_us_per_step"]
        print(f"  GPU idle {idle:.0f} us in {count:.1f} gaps of 20 us or more; no TensorFlow op ran on the host "
              f"for {no_op:.0f} us of it; these ran:")  # fmt: skip
        for op, us in gaps["by_op"]:
            print(f"  {us:9.1f} us  {op[:100]}")
    syncs = summary["syncs_per_step"]
    if syncs is None:
        print("host synchronisations: not in this trace (no CUDA API calls); see the device-to-host copies")
    else:
        print(f"host synchronisations (CUDA API calls with Synchronize): {syncs:.1f}")
    for name, count in summary["cuda_api_per_step"].items():
        print(f"  {count:8.1f}x  {name}")
    print(f"TensorFlow ops run per step: {summary['ops_per_step']:.0f}; by type (host time):")
    for name, us, count in summary["op_types"]:
        print(f"  {us:9.1f} us {count:6.1f}x  {name}")
    print("host events (TensorFlow ops and others), by time:")
    for name, us, count in summary["host_top"]:
        print(f"  {us:9.1f} us {count:6.1f}x  {name[:110]}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.summarize_trace:
        print_summary(args.summarize_trace, summarize_xplane(args.summarize_trace, args.trace_steps, args.top))
        return 0
    import sparse_operation_kit as sok
    from sparse_operation_kit import communication

    sok.init()
    comm = communication.tool()
    rank, n = comm.rank(), comm.num_ranks()
    say = print if rank == 0 else (lambda *a, **k: None)
    rows = table_rows(args.tables, args.cap)
    pool = make_pool(args, rows, args.hotness, rank)
    logroot = args.trace_dir or tempfile.mkdtemp(prefix="sok-profile-")
    say(f"device: {device_name()}; {n} rank(s); 26 tables ({args.tables}, cap {args.cap}), batch {args.batch} "
        f"per rank, hotness {args.hotness}, Adagrad; figures of rank 0")  # fmt: skip
    results = []
    for kind in args.kinds:
        for dim in args.dims:
            tables = make_tables(kind, rows, dim, n)
            bodies = phase_bodies(tables, args.batch)
            times = {p: best_ms(compiled(bodies[p], pool, args.batch), args.steps, args.warmup, args.repeat)
                     for p in PHASES}  # fmt: skip
            times["forward, RaggedTensor arguments"] = best_ms(
                compiled(bodies["forward"], pool, args.batch, ragged_args=True), args.steps, args.warmup, args.repeat
            )
            say(f"\n{kind} dim {dim}: " + ", ".join(f"{p} {ms:.2f} ms" for p, ms in times.items())
                + f" (backward {times['backward'] - times['forward']:.2f}, optimizer "
                f"{times['step'] - times['backward']:.2f})")  # fmt: skip
            traces = {}
            for phase in PHASES:
                call = compiled(bodies[phase], pool, args.batch)
                if rank != 0:  # the other ranks take part in the traced steps, untraced
                    for i in range(args.trace_steps + 1):
                        call(i).numpy()
                    continue
                path = trace(call, args.trace_steps, os.path.join(logroot, f"{kind}_dim{dim}_{phase}"))
                traces[phase] = summarize_xplane(path, args.trace_steps, args.top)
                print_summary(f"{kind} dim {dim}, {phase}", traces[phase])
            results.append({"kind": kind, "dim": dim, "ms": times, "traces": traces})
    if args.json and rank == 0:
        with open(args.json, "w") as f:
            settings = {k: v for k, v in vars(args).items() if k != "json"}
            json.dump({"device": device_name(), "ranks": n, "args": settings, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
