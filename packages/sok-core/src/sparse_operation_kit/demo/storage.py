"""The storage tour of ``sok demo``: what a table of each backend does, at scale, with timings.

For each var_type: insert ``num_keys`` keys in batches (progress bar), find them again, look up a
mix of old and new keys, then export. The hybrid table is capped at half the keys so the second
half of the inserts evicts, and the evicted rows are counted (``insert_and_evict``).
"""

from __future__ import annotations

import time

import numpy as np

from sparse_operation_kit.demo import next_pow2
from sparse_operation_kit.progress import TqdmCallback
from sparse_operation_kit.storage import Storage, create_storage


def _make(var_type: str, num_keys: int, dim: int) -> Storage:
    if var_type == "hybrid":
        cap = next_pow2(num_keys) // 2
        return create_storage(
            var_type, row_width=dim, initializer="random", init_capacity=min(cap, 1 << 16), max_capacity=cap
        )
    return create_storage(var_type, row_width=dim, initializer="random")


def _rate(n: int, seconds: float) -> str:
    return f"{n / seconds / 1e6:8.2f} M keys/s"


def _best_of(rounds: int, call) -> tuple[float, float]:
    """(best, median) seconds of ``rounds`` calls of ``call(round)``."""
    times = []
    for r in range(rounds):
        start = time.perf_counter()
        call(r)
        times.append(time.perf_counter() - start)
    return min(times), float(np.median(times))


def check_arguments(num_keys: int, dim: int, batch: int, rounds: int = 1) -> None:
    """Raise ValueError unless the tour's sizes are valid (the CLI checks them before training)."""
    if num_keys < 1 or dim < 1 or batch < 1 or rounds < 1:
        raise ValueError(f"keys, dim and batch must be >= 1 (and rounds), got {num_keys}, {dim}, {batch}, {rounds}")


def run_storage_demo(
    num_keys: int = 1 << 20,
    dim: int = 64,
    batch: int = 1 << 18,
    var_types: tuple[str, ...] | list[str] = ("hbm", "hybrid"),
    seed: int = 0,
    rounds: int = 5,
) -> dict:
    """Run the tour and print what happens; returns the measured figures per var_type.

    ``find`` and ``find_or_insert`` are timed over ``rounds`` calls (each of ``num_keys`` keys; the
    new keys of each find_or_insert are new to the table) and the best and the median are printed:
    what ``benchmarks/storage_cpu.py`` reports (best of rounds; its figures are in
    ``benchmarks/README.md``). One call alone says little on a shared machine: each call writes a
    fresh output array (``num_keys * dim`` floats) whose pages the kernel must first supply, and
    other processes take the cores and the memory bandwidth for a while.
    """
    check_arguments(num_keys, dim, batch, rounds)
    rng = np.random.default_rng(seed)
    # Keys spread over the whole int64 range, negative ones included: every value is a valid key.
    keys = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, size=num_keys, dtype=np.int64)
    results = {}
    for var_type in var_types:
        table = _make(var_type, num_keys, dim)
        print(f"\n== var_type {var_type!r} ({table.spec.name} backend), {num_keys:,} keys, dim {dim}")
        evicted = 0
        with TqdmCallback(desc=f"insert {var_type}", unit="key", unit_scale=True) as bar:
            bar.set_size(num_keys)
            start = time.perf_counter()
            for begin in range(0, num_keys, batch):
                chunk = keys[begin : begin + batch]
                values = np.full((chunk.size, dim), 0.5, dtype=np.float32)
                evicted += table.insert_and_evict(chunk, values)[0].size
                bar.relative_update(chunk.size)
            insert_s = time.perf_counter() - start
        sample = rng.permutation(keys)
        found_rates: list[float] = []
        find_best, find_median = _best_of(
            rounds, lambda _, t=table, s=sample, out=found_rates: out.append(float(t.find(s)[1].mean()))
        )
        old = sample[: num_keys // 2]
        mixes = [
            rng.permutation(np.concatenate([old, rng.integers(0, 2**62, size=num_keys - old.size, dtype=np.int64)]))
            for _ in range(rounds)
        ]
        foi_best, foi_median = _best_of(rounds, lambda r, t=table, m=mixes: t.find_or_insert(m[r]))
        with TqdmCallback(desc=f"export {var_type}", unit="slot", unit_scale=True) as bar:
            start = time.perf_counter()
            exported, _, _ = table.export(callback=bar)
            export_s = time.perf_counter() - start
        results[var_type] = {
            "insert_keys_per_s": num_keys / insert_s,
            "find_keys_per_s": num_keys / find_best,
            "find_keys_per_s_median": num_keys / find_median,
            "find_or_insert_keys_per_s": num_keys / foi_best,
            "find_or_insert_keys_per_s_median": num_keys / foi_median,
            "export_rows_per_s": exported.size / export_s,
            "evicted": evicted,
            "hit_rate": found_rates[0],
            "size": table.size(),
        }
        print(f"insert_and_evict  {_rate(num_keys, insert_s)}   evicted {evicted:,} rows (batches of {batch:,})")
        print(
            f"find              {_rate(num_keys, find_best)}   best of {rounds} "
            f"(median {_rate(num_keys, find_median)}); hit rate {found_rates[0]:.1%}"
        )
        print(
            f"find_or_insert    {_rate(num_keys, foi_best)}   best of {rounds} "
            f"(median {_rate(num_keys, foi_median)}); half new keys each"
        )
        print(f"export            {_rate(exported.size, export_s)}   {exported.size:,} rows")
        print(f"table             {table.describe()}")
    print(
        "\nfind and find_or_insert: best of rounds, as benchmarks/storage_cpu.py measures them (its figures and "
        "command: benchmarks/README.md); a single call varies a lot on a shared machine (fresh output pages, "
        "other processes)."
    )
    return results
