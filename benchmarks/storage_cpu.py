#!/usr/bin/env python
"""CPU storage benchmark: det ("hbm") and hkv ("hybrid") against TensorFlow's hash tables and a
dense ``tf.gather``, all measured in one run.

Operations, each on a batch of ``--keys`` random int64 keys with ``--dim`` float32 columns:

* ``insert``  insert_or_assign of new keys into an empty table sized for them (no growth, no
  eviction);
* ``update``  insert_or_assign of the same keys again, in another shuffled order, new values;
* ``find``    find of every key, in a third shuffled order;
* ``foi``     find_or_insert of a batch of 60% existing and 40% new keys (shuffled together);
  hkv ends at load 0.7 and may evict a few keys from full buckets (the output says how many).
  TensorFlow's tables have no find_or_insert: it is emulated as lookup (NaN default row marks
  misses) + insert of the misses with zero rows + where.

Baselines: ``tf.lookup.experimental.MutableHashTable`` (empty at start) and ``DenseHashTable``
(``initial_num_buckets`` = 2 x keys), both with vector values, each run eagerly and inside a
``tf.function``; the faster mode of each operation is the baseline. For ``find`` the baseline is a
dense ``tf.gather`` of the same rows (a ``(keys, dim)`` tensor and variable, eager and
``tf.function``; the fastest of the four); a gather is also timed right before each det and hkv
find, for a paired ratio that load coming and going over seconds does not skew. Note that
``DenseHashTable.insert`` grows the table whenever the batch *could* overflow it (it counts every
key as new), so its update includes a rehash.

Every round builds fresh tables and runs insert, update, find, foi in that order; rounds cycle
through all tables (so drift of the machine is shared) after ``--warmup`` unrecorded rounds. Times
are ``time.perf_counter`` around one call; M keys/s and the ratios use the best of ``--repeat``
rounds (``--stat median`` for the median; both are printed): on a shared machine the best round is
the one least disturbed by other work. The first round checks every result against NumPy, outside
the timed regions.

Usage::

    python benchmarks/storage_cpu.py                    # 1Mi keys, dim 64, best of 5 rounds
    python benchmarks/storage_cpu.py --keys 65536 --repeat 3 --json out.json --check
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TensorFlow's start-up banner out of the table

import numpy as np  # noqa: E402
from machine import extension_builds, load_average  # noqa: E402

OPS = ("insert", "update", "find", "foi")
OP_TITLES = {
    "insert": "insert_or_assign (new keys)",
    "update": "insert_or_assign (existing)",
    "find": "find",
    "foi": "find_or_insert (60% hit)",
}
FOI_HIT_FRACTION = 0.6
#: DenseHashTable reserves two key values; the random keys avoid both.
EMPTY_KEY = np.iinfo(np.int64).min
DELETED_KEY = EMPTY_KEY + 1
GOAL_FIND_VS_GATHER = 0.5
GOAL_INSERT_VS_MUTABLE = 7.0


def next_pow2(value: int) -> int:
    return 1 << max(0, int(value) - 1).bit_length()


# -- data ---------------------------------------------------------------------------------------
@dataclass
class Data:
    """Inputs of every round, as NumPy arrays (SOK) and as tf.constant (TensorFlow)."""

    n: int
    dim: int
    keys: np.ndarray  # (n,) the keys, in insertion order
    values: np.ndarray  # (n, dim) inserted with keys
    upd_keys: np.ndarray  # (n,) keys[upd_perm]
    upd_values: np.ndarray  # (n, dim) final[upd_perm]
    final: np.ndarray  # (n, dim) row of keys[i] after the update; the dense table of tf.gather
    find_index: np.ndarray  # (n,) positions in keys/final, shuffled
    find_keys: np.ndarray  # (n,) keys[find_index]
    foi_keys: np.ndarray  # (n,) existing and new keys, shuffled
    foi_hit: np.ndarray  # (n,) bool, foi_keys[i] is an existing key
    foi_expected: np.ndarray  # (n, dim) rows find_or_insert returns (zeros for new keys)
    tf: dict[str, Any] | None = None


def make_data(n: int, dim: int, seed: int) -> Data:
    rng = np.random.default_rng(seed)
    n_hit = int(round(FOI_HIT_FRACTION * n))
    n_new = n - n_hit
    pool = np.empty(0, dtype=np.int64)
    while pool.size < n + n_new:  # distinct keys over the whole int64 range but the two reserved
        more = rng.integers(
            DELETED_KEY + 1, np.iinfo(np.int64).max, size=n + n_new + 1024, dtype=np.int64, endpoint=True
        )
        pool = np.unique(np.concatenate([pool, more]))
    pool = rng.permutation(pool)[: n + n_new]
    keys, new_keys = pool[:n], pool[n:]
    values = rng.standard_normal((n, dim), dtype=np.float32)
    final = rng.standard_normal((n, dim), dtype=np.float32)
    upd_perm = rng.permutation(n)
    find_index = rng.permutation(n)
    hit_index = rng.choice(n, size=n_hit, replace=False)
    foi_keys = np.concatenate([keys[hit_index], new_keys])
    foi_rows = np.concatenate([final[hit_index], np.zeros((n_new, dim), np.float32)])
    foi_hit = np.concatenate([np.ones(n_hit, bool), np.zeros(n_new, bool)])
    order = rng.permutation(n)
    return Data(
        n=n,
        dim=dim,
        keys=keys,
        values=values,
        upd_keys=keys[upd_perm],
        upd_values=final[upd_perm],
        final=final,
        find_index=find_index,
        find_keys=keys[find_index],
        foi_keys=foi_keys[order],
        foi_hit=foi_hit[order],
        foi_expected=foi_rows[order],
    )


def attach_tf(data: Data, tf: Any) -> None:
    """tf.constant copies of the inputs, made once, outside every timed region."""
    data.tf = {
        name: tf.constant(getattr(data, name))
        for name in ("keys", "values", "upd_keys", "upd_values", "final", "find_index", "find_keys", "foi_keys")
    }


# -- runners: one per (table, mode); a round returns {op: seconds} ------------------------------
def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def check(name: str, what: str, ok: bool) -> None:
    if not ok:
        raise SystemExit(f"storage_cpu: {name} returned wrong results for {what}; the timings would mean nothing")


class SokRunner:
    """det or hkv through ``create_storage`` (NumPy in, NumPy out)."""

    mode = "numpy"

    def __init__(
        self, label: str, var_type: str, options: dict[str, int], gather: Callable[[], Any] | None = None
    ) -> None:
        self.label, self.var_type, self.options = label, var_type, options
        self.gather = gather  # timed right before find: a paired baseline, immune to slow drift
        self.description = ""
        self.notes: list[str] = []

    def round(self, data: Data, verify: bool) -> dict[str, float]:
        from sparse_operation_kit.storage import create_storage

        table = create_storage(self.var_type, row_width=data.dim, **self.options)
        t: dict[str, float] = {}
        t["insert"], _ = timed(lambda: table.insert_or_assign(data.keys, data.values))
        t["update"], _ = timed(lambda: table.insert_or_assign(data.upd_keys, data.upd_values))
        if self.gather is not None:
            t["paired_gather"], rows = timed(self.gather)
            del rows
        t["find"], (rows, found) = timed(lambda: table.find(data.find_keys))
        if verify:
            check(self.label, "find", bool(found.all()) and np.array_equal(rows, data.final[data.find_index]))
        del rows, found
        t["foi"], (rows, found) = timed(lambda: table.find_or_insert(data.foi_keys))
        if verify:
            check(self.label, "find_or_insert found", np.array_equal(found, data.foi_hit))
            check(self.label, "find_or_insert rows", np.array_equal(rows, data.foi_expected))
        del rows, found
        lost = data.n + int((~data.foi_hit).sum()) - table.size()
        if lost:
            self.notes.append(f"{lost} keys evicted during find_or_insert")
        self.description = table.describe()
        return t


class TfTableRunner:
    """MutableHashTable or DenseHashTable, eagerly or inside tf.function (traced before timing)."""

    def __init__(self, tf: Any, kind: str, mode: str) -> None:
        self.tf, self.kind, self.mode = tf, kind, mode
        self.label = {"mutable": "TF MutableHashTable", "dense": "TF DenseHashTable"}[kind]
        self.description = ""
        self.notes: list[str] = []

    def _table(self, data: Data) -> Any:
        tf = self.tf
        default = tf.fill([data.dim], float("nan"))  # NaN row: how the foi emulation spots misses
        # Anonymous: freed with the Python object (a named table lives as long as the process).
        if self.kind == "mutable":
            return tf.lookup.experimental.MutableHashTable(
                tf.int64, tf.float32, default_value=default, experimental_is_anonymous=True
            )
        return tf.lookup.experimental.DenseHashTable(
            tf.int64,
            tf.float32,
            default_value=default,
            empty_key=int(EMPTY_KEY),
            deleted_key=int(DELETED_KEY),
            initial_num_buckets=next_pow2(2 * data.n),
            experimental_is_anonymous=True,
        )

    def _ops(self, table: Any, dim: int) -> tuple[Callable, Callable, Callable]:
        tf = self.tf

        def insert(keys: Any, values: Any) -> None:
            table.insert(keys, values)

        def lookup(keys: Any) -> Any:
            return table.lookup(keys)

        def find_or_insert(keys: Any) -> Any:
            rows = table.lookup(keys)
            rows.set_shape([None, dim])  # tf.function cannot infer it; boolean_mask needs the rank
            miss = tf.math.is_nan(rows[:, 0])
            new_keys = tf.boolean_mask(keys, miss)
            table.insert(new_keys, tf.zeros([tf.shape(new_keys)[0], dim], tf.float32))
            return tf.where(miss[:, None], tf.zeros_like(rows), rows), tf.logical_not(miss)

        if self.mode == "eager":
            return insert, lookup, find_or_insert
        k_spec = tf.TensorSpec([None], tf.int64)
        v_spec = tf.TensorSpec([None, dim], tf.float32)
        fns = (
            tf.function(insert, input_signature=[k_spec, v_spec]),
            tf.function(lookup, input_signature=[k_spec]),
            tf.function(find_or_insert, input_signature=[k_spec]),
        )
        no_keys = tf.zeros([0], tf.int64)
        fns[0](no_keys, tf.zeros([0, dim], tf.float32))  # trace now, not in the timed call
        fns[1](no_keys)
        fns[2](no_keys)
        return fns

    def round(self, data: Data, verify: bool) -> dict[str, float]:
        assert data.tf is not None
        d = data.tf
        table = self._table(data)
        insert, lookup, find_or_insert = self._ops(table, data.dim)
        t: dict[str, float] = {}
        t["insert"], _ = timed(lambda: insert(d["keys"], d["values"]))
        t["update"], _ = timed(lambda: insert(d["upd_keys"], d["upd_values"]))
        t["find"], rows = timed(lambda: lookup(d["find_keys"]))
        if verify:
            check(self.label, "lookup", np.array_equal(rows.numpy(), data.final[data.find_index]))
        del rows
        t["foi"], (rows, found) = timed(lambda: find_or_insert(d["foi_keys"]))
        if verify:
            check(self.label, "find_or_insert emulation found", np.array_equal(found.numpy(), data.foi_hit))
            check(self.label, "find_or_insert emulation rows", np.array_equal(rows.numpy(), data.foi_expected))
        del rows, found
        self.description = f"{int(table.size())} keys"
        return t


class GatherRunner:
    """Dense tf.gather of the rows find returns, from a tensor or a variable, eager or tf.function."""

    def __init__(self, tf: Any, source: str, mode: str) -> None:
        self.tf, self.source, self.mode = tf, source, mode
        self.label = f"dense tf.gather ({source})"
        self.description = ""
        self.notes: list[str] = []
        self._fn: Callable | None = None

    def round(self, data: Data, verify: bool) -> dict[str, float]:
        tf = self.tf
        assert data.tf is not None
        if self._fn is None:
            params = data.tf["final"] if self.source == "tensor" else tf.Variable(data.tf["final"])

            def gather(index: Any) -> Any:
                return tf.gather(params, index)

            if self.mode == "function":
                gather = tf.function(gather, input_signature=[tf.TensorSpec([None], tf.int64)])
                gather(tf.zeros([0], tf.int64))
            self._fn = gather
            self.description = f"{data.n} x {data.dim} float32 {self.source}"
        index = data.tf["find_index"]
        seconds, rows = timed(lambda: self._fn(index))
        if verify:
            check(self.label, "gather", np.array_equal(rows.numpy(), data.final[data.find_index]))
        return {"find": seconds}


# -- report -------------------------------------------------------------------------------------
def machine_context(tf: Any) -> dict[str, Any]:
    import sparse_operation_kit
    from sparse_operation_kit.env_info import environment_info

    cpu_model = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu_model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    info = environment_info(with_tensorflow=False)
    return {
        "cpu": cpu_model,
        "cpu_count": os.cpu_count(),
        "cpus_usable": affinity,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "tensorflow": tf.__version__,
        "tf_intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads() or "default",
        "sok-core": sparse_operation_kit.__version__,
        "backends": {b["name"]: b["version"] for b in info["backends"]},
        "extensions": extension_builds(),
    }


def fmt_ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"


STATISTICS = {"best": min, "median": statistics.median}
TF_TABLES = ("TF MutableHashTable", "TF DenseHashTable")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--keys", type=int, default=1 << 20, help="keys per batch (default 1Mi)")
    parser.add_argument("--dim", type=int, default=64, help="float32 columns per row (default 64)")
    parser.add_argument("--repeat", type=int, default=5, help="recorded rounds (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="unrecorded rounds first (default 1)")
    parser.add_argument(
        "--stat",
        choices=tuple(STATISTICS),
        default="best",
        help="what M keys/s and the ratios use: the best (default) or the median round",
    )
    parser.add_argument(
        "--tf-mode",
        choices=("best", "eager", "function"),
        default="best",
        help="how TF baselines run: both modes, the faster one per op counts (default), or one",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="PATH", help="write the configuration, machine and every sample here")
    parser.add_argument("--check", action="store_true", help="exit 1 when a goal is missed")
    args = parser.parse_args(argv)
    if args.keys < 1024 or args.dim < 1 or args.repeat < 1 or args.warmup < 0:
        parser.error("need --keys >= 1024, --dim >= 1, --repeat >= 1, --warmup >= 0")

    import tensorflow as tf
    from sparse_operation_kit.progress import TqdmCallback

    n, dim = args.keys, args.dim
    machine = machine_context(tf)
    machine["load_average_start"] = load_average()
    print(
        f"storage_cpu: {n} int64 keys x {dim} float32, {args.stat} of {args.repeat} rounds "
        f"(+{args.warmup} warm-up), seed {args.seed}"
    )
    for key, value in machine.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k}: {v}" for k, v in value.items())
        print(f"  {key:<20} {value}")

    data = make_data(n, dim, args.seed)
    attach_tf(data, tf)
    hkv_capacity = next_pow2(2 * n)
    n_new = int((~data.foi_hit).sum())

    def paired_gather() -> Any:
        return tf.gather(data.tf["final"], data.tf["find_index"])

    sok_runners = [
        SokRunner("det (hbm)", "hbm", {"init_capacity": n + n_new}, paired_gather),
        SokRunner(
            "hkv (hybrid)", "hybrid", {"init_capacity": hkv_capacity, "max_capacity": hkv_capacity}, paired_gather
        ),
    ]
    modes = ("eager", "function") if args.tf_mode == "best" else (args.tf_mode,)
    tf_runners = [TfTableRunner(tf, kind, mode) for kind in ("mutable", "dense") for mode in modes]
    gather_runners = [GatherRunner(tf, source, mode) for source in ("tensor", "variable") for mode in modes]
    runners: list[Any] = [*sok_runners, *tf_runners, *gather_runners]

    samples: dict[tuple[str, str], dict[str, list[float]]] = {(r.label, r.mode): {} for r in runners}
    total = (args.warmup + args.repeat) * len(runners)
    with TqdmCallback(desc="storage_cpu", unit="table-round", file=sys.stderr) as progress:
        progress.set_size(total)
        for round_index in range(args.warmup + args.repeat):
            for runner in runners:
                gc.collect()
                times = runner.round(data, verify=round_index == 0)
                if round_index >= args.warmup:
                    for op, seconds in times.items():
                        samples[(runner.label, runner.mode)].setdefault(op, []).append(seconds)
                progress.relative_update(1)
    machine["load_average_end"] = load_average()

    # The chosen statistic per (table, mode, op); each op's baseline is its fastest mode (and source).
    reduce = STATISTICS[args.stat]
    stat = {key: {op: reduce(v) for op, v in ops.items()} for key, ops in samples.items()}

    def fastest(labels: list[str], op: str) -> tuple[str, str, float]:
        found = [(label, mode, ops[op]) for (label, mode), ops in stat.items() if label in labels and op in ops]
        return min(found, key=lambda item: item[2])

    gather_base = fastest([r.label for r in gather_runners], "find")
    tf_base = {(kind, op): fastest([kind], op) for kind in TF_TABLES for op in OPS}

    rows = []
    for op in OPS:
        entries = [(r.label, r.mode) for r in sok_runners] + [tf_base[(kind, op)][:2] for kind in TF_TABLES]
        if op == "find":
            entries.append(gather_base[:2])
        for label, mode in entries:
            times = samples[(label, mode)][op]
            seconds = stat[(label, mode)][op]
            rows.append(
                {
                    "op": op,
                    "table": label,
                    "mode": mode,
                    "seconds": seconds,
                    "best_s": min(times),
                    "median_s": statistics.median(times),
                    "mkeys_per_s": n / seconds / 1e6,
                    "spread_pct": 100 * (max(times) - min(times)) / statistics.median(times),
                    "vs_gather": gather_base[2] / seconds if op == "find" else None,
                    "vs_mutable": tf_base[("TF MutableHashTable", op)][2] / seconds,
                    "vs_dense": tf_base[("TF DenseHashTable", op)][2] / seconds,
                }
            )

    header = (
        f"{'op':<28} {'table':<25} {'mode':<8} {'best ms':>8} {'median ms':>9} {'M keys/s':>8} "
        f"{'spread':>6} {'vs gather':>9} {'vs MutHT':>8} {'vs DenseHT':>10}"
    )
    print()
    print(header)
    print("-" * len(header))
    previous = None
    for row in rows:
        if previous is not None and row["op"] != previous:
            print()
        previous = row["op"]
        print(
            f"{OP_TITLES[row['op']]:<28} {row['table']:<25} {row['mode']:<8} {1e3 * row['best_s']:>8.1f} "
            f"{1e3 * row['median_s']:>9.1f} {row['mkeys_per_s']:>8.2f} {row['spread_pct']:>5.0f}% "
            f"{fmt_ratio(row['vs_gather']):>9} {fmt_ratio(row['vs_mutable']):>8} {fmt_ratio(row['vs_dense']):>10}"
        )
    print()
    print(f"M keys/s and ratios use the {args.stat} round; ratios are throughput over the baseline's (>1 = faster);")
    print(
        "spread = (max - min) / median. TF find_or_insert is emulated: lookup with a NaN default row, "
        "insert of the misses, where."
    )
    if len(modes) > 1:
        print(f"TF {args.stat} ms, eager / tf.function (the faster is the baseline above):")
        for label in TF_TABLES:
            parts = [
                f"{op} {1e3 * stat[(label, 'eager')][op]:.1f} / {1e3 * stat[(label, 'function')][op]:.1f}" for op in OPS
            ]
            print(f"  {label:<20} " + ", ".join(parts))
        parts = [f"{r.source} {r.mode} {1e3 * stat[(r.label, r.mode)]['find']:.1f}" for r in gather_runners]
        print(f"  {'dense tf.gather':<20} " + ", ".join(parts))
    paired = {}
    for runner in sok_runners:
        times = samples[(runner.label, runner.mode)]
        ratios = [g / f for g, f in zip(times["paired_gather"], times["find"], strict=True)]
        paired[runner.label] = statistics.median(ratios)
    print(
        "find vs tf.gather (tensor, eager) timed just before it in the same round, median of rounds: "
        + ", ".join(f"{label} {ratio:.2f}x" for label, ratio in paired.items())
    )
    for runner in sok_runners:
        notes = sorted(set(runner.notes))
        print(f"{runner.label}: {runner.description}" + (f" [{'; '.join(notes)}]" if notes else ""))
    print(
        f"load average (1, 5, 15 min): {machine['load_average_start']} at start, "
        f"{machine['load_average_end']} at end (this benchmark adds up to one per core)"
    )

    goals = []
    for runner in sok_runners:
        find_row = next(r for r in rows if r["op"] == "find" and r["table"] == runner.label)
        insert_row = next(r for r in rows if r["op"] == "insert" and r["table"] == runner.label)
        goals.append(
            {
                "goal": f"{runner.label} find >= {GOAL_FIND_VS_GATHER:.0%} of dense tf.gather",
                "value": find_row["vs_gather"],
                "target": GOAL_FIND_VS_GATHER,
                "paired": paired[runner.label],
            }
        )
        goals.append(
            {
                "goal": f"{runner.label} insert >= {GOAL_INSERT_VS_MUTABLE:g}x MutableHashTable",
                "value": insert_row["vs_mutable"],
                "target": GOAL_INSERT_VS_MUTABLE,
            }
        )
    print()
    for goal in goals:
        goal["pass"] = goal["value"] >= goal["target"]
        paired_note = f"  (paired: {goal['paired']:.2f}x)" if "paired" in goal else ""
        print(f"{'PASS' if goal['pass'] else 'FAIL'}  {goal['goal']:<52} {goal['value']:.2f}x{paired_note}")

    if args.json:
        result = {
            "benchmark": "storage_cpu",
            "config": {k: v for k, v in vars(args).items() if k != "json"},
            "machine": machine,
            "samples_s": [
                {"table": label, "mode": mode, "op": op, "seconds": v}
                for (label, mode), ops in samples.items()
                for op, v in ops.items()
            ],
            "rows": rows,
            "goals": goals,
            "paired_find_vs_gather": paired,
            "tables": {r.label: r.description for r in sok_runners},
        }
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.json}")
    return 1 if args.check and not all(g["pass"] for g in goals) else 0


if __name__ == "__main__":
    sys.exit(main())
