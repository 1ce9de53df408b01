#!/usr/bin/env python
"""Forward+backward of ``sok.lookup_sparse`` over 26 Criteo-like tables against 26
``tf.nn.embedding_lookup_sparse`` calls, on CPU, at np 1 and np 2 (weak scaling).

The model: 26 float32 tables with the relative sizes of Criteo Kaggle's 26 categorical features,
scaled to fit (``rows = ceil(cardinality ** alpha)``, ``alpha`` <= 1 the largest that keeps one
full copy of all tables within ``--table-mib``: the ordering of the sizes is kept, small tables
keep their size, the largest ones shrink the most). Table ``t`` has a fixed hotness
``1 + 7t mod 20`` (1..20, 261 ids per sample in all) and power-law ids (bounded Pareto,
exponent ``--zipf``, so row 0 is the hottest) within its rows. Each rank draws its own
``--batch`` samples (seed ``--seed`` + rank); every timed step has a fresh batch.

A step is one ``tf.function``: the lookups (combiner ``sum``), ``loss = sum of reduce_sum`` of
the 26 outputs, and ``tape.gradient`` with respect to the 26 tables. There is no optimizer step
in either kind: the gradients (``tf.IndexedSlices``) are returned by the function, so they are
computed in full and nothing else is.

* ``sok``: one ``sok.lookup_sparse`` call over 26 ``sok.Variable`` tables (distributed: row ``i``
  on rank ``i % np``), the ids as ``tf.RaggedTensor``; with ``--tables dynamic`` 26
  ``sok.DynamicVariable`` tables instead (key ``k`` on rank ``k mod np``; rows of zeros);
* ``tf``: 26 ``tf.nn.embedding_lookup_sparse`` calls on plain ``tf.Variable`` tables holding the
  FULL tables on every process, the same ``tf.RaggedTensor`` ids; at np 2 each process runs it
  on its own batch with no communication at all (data parallel without the gradient exchange:
  the most a replicated table could scale on this machine).

Figures are samples/s: per rank (the batch over the slowest rank's step time, best of
``--repeat`` rounds of ``--steps`` steps, after ``--warmup`` steps) and total (np x per rank).
``vs tf np1`` is against the ``tf`` kind at np 1 of the same dim; ``scaling`` is total samples/s
over the same kind's total at np 1. Goals: sok >= 1.5x tf at np 1; sok at np 2 >= 1.6x sok at
np 1 (total samples/s). The bytes each rank receives per step in sok's exchange are computed
analytically from the shapes (not measured): the ids and row splits sent to their holders, the
forward all-to-all of partial sums (global batch x sum(dims) x 4 bytes, less the local part)
and the backward all-to-all of their gradients (the same size).

Usage::

    python benchmarks/lookup_sparse_cpu.py                   # runs np 1 then np 2 (horovodrun --gloo)
    python benchmarks/lookup_sparse_cpu.py --dims 16 --steps 4 --repeat 2
    horovodrun -np 2 -H localhost:2 --gloo python benchmarks/lookup_sparse_cpu.py   # one np, here
    python benchmarks/lookup_sparse_cpu.py --no-launch       # np 1 in this process, no Horovod
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import re
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

#: Criteo Kaggle (Display Advertising Challenge) categorical cardinalities, C1..C26.
CRITEO_CARDINALITIES = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip
NUM_TABLES = len(CRITEO_CARDINALITIES)
HOTNESS = tuple(1 + (7 * t) % 20 for t in range(NUM_TABLES))  # every value 1..20 at least once
GOAL_VS_TF = 1.5
GOAL_SCALING = 1.6
KINDS = ("sok", "tf")
PROGRESS = "@@progress"  # a worker's progress line to the launcher (stdout, rank 0)


# -- the model and its data ---------------------------------------------------------------------
def table_rows(dim: int, table_mib: float) -> tuple[list[int], float]:
    """Rows per table, ``ceil(card ** alpha)`` with the largest alpha <= 1 that fits the budget."""
    budget = table_mib * 2**20 / (4 * dim)

    def rows(alpha: float) -> list[int]:
        return [max(1, math.ceil(c**alpha)) for c in CRITEO_CARDINALITIES]

    if sum(rows(1.0)) <= budget:
        return rows(1.0), 1.0
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if sum(rows(mid)) <= budget else (low, mid)
    return rows(low), low


def power_law_ids(rng: np.random.Generator, rows: int, count: int, exponent: float) -> np.ndarray:
    """``count`` ids in [0, rows), P(id = k) ~ (k + 1) ** -exponent (bounded Pareto, inverse CDF)."""
    u = rng.random(count)
    if abs(exponent - 1.0) < 1e-9:
        x = np.exp(u * math.log(rows + 1.0))
    else:
        one = 1.0 - exponent
        x = (1.0 - u * (1.0 - (rows + 1.0) ** one)) ** (1.0 / one)
    return np.minimum(x.astype(np.int64) - 1, rows - 1)


def make_batches(rows: list[int], args: argparse.Namespace, rank: int) -> list[list[np.ndarray]]:
    """``warmup + steps`` batches, each 26 flat id arrays of ``batch * hotness[t]`` ids (row-major)."""
    rng = np.random.default_rng([args.seed, rank])
    return [
        [power_law_ids(rng, rows[t], args.batch * HOTNESS[t], args.zipf) for t in range(NUM_TABLES)]
        for _ in range(args.warmup + args.steps)
    ]


def exchange_bytes(n: int, batch: int, dim: int) -> dict[str, int]:
    """Bytes one rank receives from the other ranks per step in sok's exchange (it sends as much),
    computed from the shapes, for the ids sent to their holders (``SOK_ID_EXCHANGE`` holders, the
    default on CPU ranks: every rank holds rows of every distributed table): every table has
    ``dim`` columns and every rank ``batch`` samples."""
    from sparse_operation_kit.lookup.input_dist import RECORD_TABLES  # the record's tables (imports TensorFlow)

    ids = batch * sum(HOTNESS)
    peers = n - 1
    result = {
        "ids": peers * ids * 8,  # to every holder, int64
        "row lengths": peers * NUM_TABLES * (batch + 1) * 8,  # the row splits, int64
        "other": peers * (3 + RECORD_TABLES + 1) * 8,  # the call's record, and each rank's count of problems
        "sums fwd": peers * batch * NUM_TABLES * dim * 4,  # all-to-all of float32 partial sums
        "grads bwd": peers * batch * NUM_TABLES * dim * 4,  # its gradient: the same all-to-all back
    }
    result["total"] = sum(result.values())
    # For comparison: the owners sending every looked-up row (and its gradient back) instead of sums.
    result["rows instead"] = 2 * (ids * peers // n) * dim * 4
    return result


def mib(value: int) -> str:
    return f"{value / 2**20:.3f}" if value >= 1024 or value == 0 else f"{value} B"


# -- context ------------------------------------------------------------------------------------
def dist_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def machine_context() -> dict[str, Any]:
    """CPU, versions and load, without importing TensorFlow (the launcher never does)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu": cpu,
        "cpus": f"{os.cpu_count()} ({usable} usable)",
        "python": platform.python_version(),
        "versions": ", ".join(
            f"{name} {dist_version(dist)}"
            for name, dist in (
                ("tensorflow", "tensorflow_cpu"),
                ("horovod", "horovod"),
                ("numpy", "numpy"),
                ("sok-core", "sok-core"),
            )
        ),
        "load average": load_average(),
    }


def print_setup(args: argparse.Namespace, machine: dict[str, Any], nps: list[int]) -> None:
    print(
        f"lookup_sparse_cpu: 26 Criteo-like tables, batch {args.batch} per rank, np {' and '.join(map(str, nps))}, "
        f"dims {' '.join(map(str, args.dims))}; best of {args.repeat} rounds of {args.steps} steps "
        f"(+{args.warmup} warm-up), seed {args.seed}"
    )
    for key, value in machine.items():
        print(f"  {key:<14} {value}")
    print(
        f"  {'step':<14} forward + backward in one tf.function: lookups (combiner sum), loss = sum of "
        f"reduce_sum, tape.gradient w.r.t. the 26 tables; no optimizer step"
    )
    print(
        f"  {'hotness':<14} {' '.join(map(str, HOTNESS))} ({sum(HOTNESS)} ids per sample, "
        f"{args.batch * sum(HOTNESS):,} per rank per step); power-law ids, exponent {args.zipf}"
    )
    for dim in args.dims:
        rows, alpha = table_rows(dim, args.table_mib)
        print(f"  {'dim ' + str(dim) + ' rows':<14} {' '.join(map(str, rows))}")
        print(
            f"  {'':<14} = ceil(criteo ** {alpha:.4f}): {sum(rows):,} rows, "
            f"{sum(rows) * dim * 4 / 2**20:,.0f} MiB per full copy"
        )


# -- the worker: one np, every dim --------------------------------------------------------------
class Progress:
    """rank 0's progress: a tqdm bar, or lines on stdout that the launcher turns into its bar."""

    def __init__(self, total: int, enabled: bool, lines: bool, desc: str) -> None:
        self.enabled, self.lines, self.bar = enabled, lines, None
        if enabled and not lines:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="step", file=sys.stderr)

    def update(self, inc: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(inc)
        elif self.enabled and self.lines:
            print(f"{PROGRESS} {inc}", flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class Worker:
    """One process of one np: builds the tables and steps of a dim and times them."""

    def __init__(self, args: argparse.Namespace) -> None:
        import tensorflow as tf

        if args.threads:
            tf.config.threading.set_intra_op_parallelism_threads(args.threads)
            tf.config.threading.set_inter_op_parallelism_threads(args.threads)
        import sparse_operation_kit as sok

        self.tf, self.sok, self.hvd, self.args = tf, sok, None, args
        if "HOROVOD_RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ:
            import horovod.tensorflow as hvd

            hvd.init()
            sok.init("horovod")
            self.hvd = hvd
        else:
            sok.init("single")
        self.n, self.rank = sok.num_ranks(), sok.rank()
        total = len(args.dims) * len(KINDS) * (args.warmup + args.repeat * args.steps)
        self.progress = Progress(total, self.rank == 0, args.progress_lines, f"np {self.n}")

    def slowest(self, seconds: float) -> float:
        """The slowest rank's time (all ranks call it)."""
        if self.hvd is None or self.n == 1:
            return seconds
        return float(self.tf.reduce_max(self.hvd.allgather(self.tf.constant([seconds], self.tf.float64))).numpy())

    def barrier(self) -> None:
        if self.hvd is not None and self.n > 1:
            self.hvd.allreduce(self.tf.zeros([1]), op=self.hvd.Sum).numpy()

    def any_rank(self, flag: bool) -> bool:
        if self.hvd is None or self.n == 1:
            return flag
        return bool(self.hvd.allreduce(self.tf.constant([int(flag)]), op=self.hvd.Sum).numpy()[0])

    def train_step(self, forward: Any, tables: list[Any]) -> Any:
        tf = self.tf

        @tf.function
        def step(ids: list[Any]) -> Any:
            with tf.GradientTape() as tape:
                outputs = forward(ids)
                loss = tf.add_n([tf.reduce_sum(e) for e in outputs])
            return loss, tape.gradient(loss, tables), outputs  # returned: computed in full

        return step

    def steps(self, rows: list[int], dim: int) -> dict[str, Any]:
        """The two kinds' step functions, on the same full tables (the same seed on every rank)."""
        tf, sok, seed = self.tf, self.sok, self.args.seed
        sok_tables, tf_tables = [], []
        for t, r in enumerate(rows):
            if self.args.tables == "dynamic":  # rows of zeros on both sides: the first step's check holds
                sok_tables.append(sok.DynamicVariable(dimension=dim, initializer="0", var_type="hbm", name=f"sok_t{t}"))
                tf_tables.append(tf.Variable(tf.zeros([r, dim]), name=f"tf_t{t}"))
                continue
            value = np.random.default_rng([seed, 1000 + t]).random((r, dim), dtype=np.float32) - 0.5
            sok_tables.append(sok.Variable(value, dtype=tf.float32, name=f"sok_t{t}"))  # keeps its rows
            tf_tables.append(tf.Variable(value, name=f"tf_t{t}"))  # the full table
            del value

        def sok_forward(ids: list[Any]) -> list[Any]:
            return sok.lookup_sparse(sok_tables, ids, combiners=["sum"] * NUM_TABLES)

        def tf_forward(ids: list[Any]) -> list[Any]:
            return [tf.nn.embedding_lookup_sparse(v, x, None, combiner="sum") for v, x in zip(tf_tables, ids)]

        return {"sok": self.train_step(sok_forward, sok_tables), "tf": self.train_step(tf_forward, tf_tables)}

    def measure(self, dim: int) -> dict[str, Any]:
        tf, args = self.tf, self.args
        rows, _ = table_rows(dim, args.table_mib)
        arrays = make_batches(rows, args, self.rank)
        unique = float(np.mean([sum(np.unique(a).size for a in b) / sum(a.size for a in b) for b in arrays]))
        owners = sum(np.bincount(a % self.n, minlength=self.n) for b in arrays for a in b)  # sok's i % np
        if self.hvd is not None and self.n > 1:
            owners = self.hvd.allreduce(tf.constant(owners, tf.int64), op=self.hvd.Sum).numpy()
        batches = [
            [tf.RaggedTensor.from_uniform_row_length(tf.constant(a), HOTNESS[t]) for t, a in enumerate(b)]
            for b in arrays
        ]
        del arrays
        steps = self.steps(rows, dim)
        # The first call of each kind traces; its results are checked, outside the timed regions.
        first = {kind: steps[kind](batches[0]) for kind in KINDS}
        self.progress.update(len(KINDS))
        diff = max(float(tf.reduce_max(tf.abs(a - b))) for a, b in zip(first["sok"][2], first["tf"][2]))
        scale = max(float(tf.reduce_max(tf.abs(b))) for b in first["tf"][2])
        gradients = {}
        for kind in KINDS:
            types = "/".join(sorted({type(g).__name__ for g in first[kind][1]}))
            count = sum(int(tf.shape(getattr(g, "values", g))[0]) for g in first[kind][1])
            gradients[kind] = f"{types}, {count:,} rows"
        del first
        if self.any_rank(diff > 1e-4 * max(1.0, scale)):
            raise SystemExit(
                f"lookup_sparse_cpu: sok and tf outputs differ at dim {dim} (max |diff| {diff:g} "
                f"on rank {self.rank}); the timings would mean nothing"
            )
        for kind in KINDS:  # the rest of the warm-up
            for b in batches[1 : args.warmup]:
                steps[kind](b)
                self.progress.update()
        rates: dict[str, list[float]] = {kind: [] for kind in KINDS}
        for _ in range(args.repeat):  # rounds interleave the kinds, so drift of the machine is shared
            for kind in KINDS:
                self.barrier()
                start = time.perf_counter()
                for b in batches[args.warmup :]:
                    steps[kind](b)
                    self.progress.update()
                seconds = self.slowest(time.perf_counter() - start)
                rates[kind].append(args.steps * args.batch / seconds)
        return {
            "rows": rows,
            "unique_id_fraction": unique,
            "busiest_rank_id_share": float(np.max(owners) / np.sum(owners)),
            "check_max_abs_diff": diff,
            "gradients": gradients,
            "samples_per_s_per_rank": {kind: max(r) for kind, r in rates.items()},
            "rounds_samples_per_s_per_rank": rates,
        }


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """Measures both kinds for every dim at this process's np; returns the results (rank 0's view)."""
    w = Worker(args)
    results: dict[str, Any] = {"np": w.n, "threads": args.threads or "tf default", "dims": {}}
    for dim in args.dims:
        results["dims"][str(dim)] = w.measure(dim)
        gc.collect()  # the tables of this dim go before the next dim's are made
    w.progress.close()
    results["load_average_end"] = load_average()
    return results


# -- the launcher -------------------------------------------------------------------------------
def horovodrun() -> str:
    local = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    found = local if os.path.exists(local) else shutil.which("horovodrun")
    if found is None:
        raise SystemExit(
            "lookup_sparse_cpu: horovodrun not found next to this Python or on PATH; "
            "run with --no-launch for np 1 without Horovod"
        )
    return found


def forwarded(args: argparse.Namespace) -> list[str]:
    return [
        "--dims", *map(str, args.dims), "--batch", str(args.batch), "--steps", str(args.steps),
        "--warmup", str(args.warmup), "--repeat", str(args.repeat), "--seed", str(args.seed),
        "--zipf", str(args.zipf), "--table-mib", str(args.table_mib), "--threads", str(args.threads),
        "--tables", args.tables,
    ]  # fmt: skip


def launch(args: argparse.Namespace, n: int, bar: Any) -> dict[str, Any]:
    """Runs this script under ``horovodrun -np n --gloo``; its rank 0 writes the results to a file."""
    with tempfile.TemporaryDirectory(prefix="lookup_sparse_cpu_") as tmp:
        result_file = os.path.join(tmp, "result.json")
        command = [horovodrun(), "-np", str(n), "-H", f"localhost:{n}", "--gloo", sys.executable,
                   os.path.abspath(__file__), "--worker", "--progress-lines", "--result-file", result_file,
                   *forwarded(args)]  # fmt: skip
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
        log = []
        prefix = re.compile(r"^\[(\d+)\]<(stdout|stderr)>:")
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.append(line)
                body = prefix.sub("", line).strip()
                if body.startswith(PROGRESS):
                    bar.update(int(body.split()[1]))
        if proc.returncode != 0 or not os.path.exists(result_file):
            sys.stderr.write("".join(log[-60:]))
            raise SystemExit(f"lookup_sparse_cpu: {' '.join(command[:6])} ... exited with {proc.returncode}")
        with open(result_file) as f:
            return json.load(f)


# -- the report ---------------------------------------------------------------------------------
def report(args: argparse.Namespace, runs: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """Prints the combined table, the exchange volume and the goals; returns the goals."""
    nps = sorted(runs)
    print()
    header = (
        f"{'dim':>4} {'np':>3} {'kind':<5} {'ms/step':>8} {'samples/s/rank':>15} {'samples/s total':>16} "
        f"{'vs tf np1':>9} {'scaling':>8} {'spread':>7}"
    )
    print(header)
    print("-" * len(header))
    table = []
    for dim in args.dims:
        base = {
            kind: runs[1]["dims"][str(dim)]["samples_per_s_per_rank"][kind] if 1 in runs else None for kind in KINDS
        }
        for n in nps:
            d = runs[n]["dims"][str(dim)]
            for kind in KINDS:
                rate = d["samples_per_s_per_rank"][kind]
                rounds = d["rounds_samples_per_s_per_rank"][kind]
                row = {
                    "dim": dim, "np": n, "kind": kind, "ms_per_step": 1e3 * args.batch / rate,
                    "samples_per_s_per_rank": rate, "samples_per_s_total": n * rate,
                    "vs_tf_np1": n * rate / base["tf"] if base["tf"] else None,
                    "scaling": n * rate / base[kind] if base[kind] else None,
                    "spread_pct": 100 * (max(rounds) - min(rounds)) / max(rounds),
                }  # fmt: skip
                table.append(row)
                vs_tf = f"{row['vs_tf_np1']:.2f}x" if row["vs_tf_np1"] else ""
                scaling = f"{row['scaling']:.2f}x" if row["scaling"] and n > 1 else ""
                print(
                    f"{dim:>4} {n:>3} {kind:<5} {row['ms_per_step']:>8.1f} {rate:>15,.0f} {n * rate:>16,.0f} "
                    f"{vs_tf:>9} {scaling:>8} {row['spread_pct']:>6.0f}%"
                )
        print()
    print(
        "samples/s/rank = batch / slowest rank's step time, best round; total = np x per rank; vs tf np1 = "
        "total over tf's at np 1;\nscaling = total over the same kind's at np 1; spread = (best - worst) / best "
        "of the rounds. tf at np > 1: independent\nprocesses, full tables each, no gradient exchange."
    )
    for dim in args.dims:
        d = runs[nps[0]]["dims"][str(dim)]
        print(
            f"dim {dim}: unique ids {100 * d['unique_id_fraction']:.0f}% of a batch's; sok vs tf max |diff| "
            f"{d['check_max_abs_diff']:.2g}; gradient rows (rank 0):"
        )
        for n in nps:
            d = runs[n]["dims"][str(dim)]
            grads = "; ".join(f"{kind} {desc}" for kind, desc in d["gradients"].items())
            share = f"; the busiest rank owns {100 * d['busiest_rank_id_share']:.1f}% of the ids" if n > 1 else ""
            print(f"  np {n}: {grads}{share}")
    if any(n > 1 for n in nps):
        print("sok exchange, computed from the shapes (not measured): MiB each rank receives per step (and sends):")
        columns = ("ids", "row lengths", "other", "sums fwd", "grads bwd", "total", "rows instead")
        print(f"  {'np':>3} {'dim':>4} " + " ".join(f"{c:>12}" for c in columns))
        for n in nps:
            for dim in args.dims if n > 1 else ():
                volume = exchange_bytes(n, args.batch, dim)
                print(f"  {n:>3} {dim:>4} " + " ".join(f"{mib(volume[c]):>12}" for c in columns))
        print(
            "  ids, row lengths: every table's ids and row splits to every holder (SOK_ID_EXCHANGE holders, the "
            "default\n  here; routed: each id to its owner, 16 bytes); other: the call's record and count of "
            "problems; sums fwd:\n  all-to-all of float32 partial sums (global batch x 26 x dim x 4 bytes, less "
            "the local part); grads bwd: its\n  gradient, the same all-to-all back; rows instead: what sending "
            "every looked-up row and its gradient would take."
        )
    print(
        f"threads per process: {runs[nps[0]]['threads']}; load average at the end: {runs[nps[-1]]['load_average_end']}"
    )

    goals = []
    for row in table:
        if row["kind"] == "sok" and row["np"] == 1 and row["vs_tf_np1"] is not None:
            goals.append(
                {
                    "goal": f"dim {row['dim']}: sok >= {GOAL_VS_TF}x tf at np 1",
                    "value": row["vs_tf_np1"],
                    "target": GOAL_VS_TF,
                }
            )
        if row["kind"] == "sok" and row["np"] == 2 and row["scaling"] is not None:
            goals.append(
                {
                    "goal": f"dim {row['dim']}: sok np 2 >= {GOAL_SCALING}x np 1 (total)",
                    "value": row["scaling"],
                    "target": GOAL_SCALING,
                }
            )
    print()
    for goal in goals:
        goal["pass"] = goal["value"] >= goal["target"]
        print(f"{'PASS' if goal['pass'] else 'FAIL'}  {goal['goal']:<40} {goal['value']:.2f}x")
    if args.json:
        result = {
            "benchmark": "lookup_sparse_cpu",
            "config": {k: v for k, v in vars(args).items() if k not in ("json", "result_file", "progress_lines")},
            "hotness": HOTNESS,
            "machine": machine_context(),
            "runs": {str(n): runs[n] for n in nps},
            "rows": table,
            "exchange_bytes_per_rank_per_step": {
                str(n): {str(dim): exchange_bytes(n, args.batch, dim) for dim in args.dims} for n in nps
            },
            "goals": goals,
        }
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.json}")
    return goals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dims", type=int, nargs="+", default=[16, 128], help="embedding dims (default 16 128)")
    parser.add_argument("--batch", type=int, default=4096, help="samples per rank per step (default 4096)")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per round (default 4)")
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="untimed steps first, per kind; the first traces and is checked (default 1)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="timed rounds, the best counts (default 3)")
    parser.add_argument(
        "--np", type=int, nargs="+", default=[1, 2], dest="nps", help="process counts the launcher runs (default 1 2)"
    )
    parser.add_argument(
        "--table-mib", type=float, default=1024, help="size of one full copy of the 26 tables (default 1024 MiB)"
    )
    parser.add_argument("--zipf", type=float, default=1.05, help="power-law exponent of the ids (default 1.05)")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="TF intra- and inter-op threads per process (default 0: TensorFlow's choice)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--tables",
        choices=["static", "dynamic"],
        default="static",
        help="the sok kind's tables: sok.Variable (static, default), or sok.DynamicVariable (var_type 'hbm', rows "
        "of zeros, as the tf kind's tables then: the first step's check compares zeros)",
    )
    parser.add_argument(
        "--no-launch",
        action="store_true",
        help="measure in this process (np 1, or the np of the horovodrun it runs under)",
    )
    parser.add_argument("--json", metavar="PATH", help="write the configuration, machine and every round here")
    parser.add_argument("--check", action="store_true", help="exit 1 when a goal is missed")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--progress-lines", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result-file", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.batch < 1 or args.steps < 1 or args.repeat < 1 or args.warmup < 1 or min(args.dims) < 1:
        parser.error("need --batch, --steps, --repeat, --warmup and --dims >= 1")

    in_horovod = "HOROVOD_RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ
    if args.worker or args.no_launch or in_horovod:
        rank = int(os.environ.get("HOROVOD_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
        n = int(os.environ.get("HOROVOD_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1")))
        if rank == 0 and not args.worker:
            print_setup(args, machine_context(), [n])
        result = worker(args)
        if rank == 0:
            if args.result_file:
                with open(args.result_file, "w") as f:
                    json.dump(result, f)
            if not args.worker:
                goals = report(args, {result["np"]: result})
                return 1 if args.check and not all(g["pass"] for g in goals) else 0
        return 0

    from tqdm import tqdm

    nps = sorted(set(args.nps))
    print_setup(args, machine_context(), nps)
    sys.stdout.flush()
    per_np = len(args.dims) * len(KINDS) * (args.warmup + args.repeat * args.steps)
    runs = {}
    with tqdm(total=per_np * len(nps), desc="lookup_sparse_cpu", unit="step", file=sys.stderr) as bar:
        for n in nps:
            bar.set_postfix_str(f"np {n}")
            runs[n] = launch(args, n, bar)
    goals = report(args, runs)
    return 1 if args.check and not all(g["pass"] for g in goals) else 0


if __name__ == "__main__":
    sys.exit(main())
