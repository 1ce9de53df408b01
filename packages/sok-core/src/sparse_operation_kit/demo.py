"""The storage demo behind ``sok demo``: what a table of each backend does, at scale, with timings.

For each var_type: insert ``num_keys`` keys in batches (progress bar), find them again, look up a
mix of old and new keys, then export. The hybrid table is capped at half the keys so the second
half of the inserts evicts, and the evicted rows are counted (``insert_and_evict``).
"""

from __future__ import annotations

import time

import numpy as np

from sparse_operation_kit.progress import TqdmCallback
from sparse_operation_kit.storage import Storage, create_storage


def _next_pow2(v: int) -> int:
    return 1 << max(0, (v - 1).bit_length())


def _make(var_type: str, num_keys: int, dim: int) -> Storage:
    if var_type == "hybrid":
        cap = _next_pow2(num_keys) // 2
        return create_storage(
            var_type, row_width=dim, initializer="random", init_capacity=min(cap, 1 << 16), max_capacity=cap
        )
    return create_storage(var_type, row_width=dim, initializer="random")


def _rate(n: int, seconds: float) -> str:
    return f"{n / seconds / 1e6:8.2f} M keys/s"


def run_storage_demo(
    num_keys: int = 4 << 20,
    dim: int = 64,
    batch: int = 1 << 18,
    var_types: tuple[str, ...] | list[str] = ("hbm", "hybrid"),
    seed: int = 0,
) -> dict:
    """Run the demo and print what happens; returns the measured figures per var_type."""
    if num_keys < 1 or dim < 1 or batch < 1:
        raise ValueError(f"keys, dim and batch must be >= 1, got {num_keys}, {dim}, {batch}")
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
        sample = keys[rng.integers(0, num_keys, size=min(num_keys, 1 << 20))]
        start = time.perf_counter()
        _, found = table.find(sample)
        find_s = time.perf_counter() - start
        mixed = np.concatenate(
            [sample[: sample.size // 2], rng.integers(0, 2**62, size=sample.size - sample.size // 2, dtype=np.int64)]
        )
        start = time.perf_counter()
        table.find_or_insert(mixed)
        foi_s = time.perf_counter() - start
        with TqdmCallback(desc=f"export {var_type}", unit="slot", unit_scale=True) as bar:
            start = time.perf_counter()
            exported, _, _ = table.export(callback=bar)
            export_s = time.perf_counter() - start
        results[var_type] = {
            "insert_keys_per_s": num_keys / insert_s,
            "find_keys_per_s": sample.size / find_s,
            "find_or_insert_keys_per_s": mixed.size / foi_s,
            "export_rows_per_s": exported.size / export_s,
            "evicted": evicted,
            "hit_rate": float(found.mean()),
            "size": table.size(),
        }
        print(f"insert_and_evict  {_rate(num_keys, insert_s)}   evicted {evicted:,} rows")
        print(f"find              {_rate(sample.size, find_s)}   hit rate {found.mean():.1%}")
        print(f"find_or_insert    {_rate(mixed.size, foi_s)}   (half new keys)")
        print(f"export            {_rate(exported.size, export_s)}   {exported.size:,} rows")
        print(f"table             {table.describe()}")
    return results
