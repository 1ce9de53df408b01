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


def run_training_demo(
    steps: int = 200,
    batch: int = 4096,
    dim: int = 16,
    vocabulary: int = 1 << 20,
    var_types: tuple[str, ...] | list[str] = ("hbm", "hybrid"),
    seed: int = 0,
) -> dict:
    """Train a small click model on a DynamicVariable per var_type; print the loss and steps/s.

    Ids follow a power law over ``vocabulary`` keys; the target is a fixed random function of the
    ids, so the loss can go down. Lookup, backward and the Adagrad update run in one tf.function.
    """
    import tensorflow as tf

    from sparse_operation_kit.dynamic_variable import DynamicVariable
    from sparse_operation_kit.optimizer import OptimizerWrapper

    if steps < 1 or batch < 1 or dim < 1 or vocabulary < 2:
        raise ValueError(
            f"steps, batch and dim must be >= 1 and vocabulary >= 2, got {steps}, {batch}, {dim}, {vocabulary}"
        )
    rng = np.random.default_rng(seed)
    hotness = 8
    # Power-law ids (Zipf-like) scattered over the int64 range by a multiplicative hash.
    ranks = np.minimum(rng.zipf(1.2, size=(steps, batch, hotness)), vocabulary) - 1
    ids = (ranks.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)).view(np.int64)
    labels = ((ranks % 7) < 3).mean(axis=2, keepdims=True).astype(np.float32)
    results = {}
    for var_type in var_types:
        tf.random.set_seed(seed)
        options = {"init_capacity": 1 << 16, "max_capacity": 1 << 22} if var_type == "hybrid" else {}
        table = DynamicVariable(dim, var_type=var_type, initializer="random", **options)
        dense = tf.keras.layers.Dense(1)
        dense.build((None, dim))
        sparse_opt = OptimizerWrapper(tf.keras.optimizers.Adagrad(learning_rate=0.1))
        dense_opt = tf.keras.optimizers.Adam(learning_rate=0.01)

        @tf.function
        def train_step(batch_ids, batch_labels, table=table, dense=dense, sparse_opt=sparse_opt, dense_opt=dense_opt):
            with tf.GradientTape() as tape:
                pooled = tf.reduce_mean(tf.nn.embedding_lookup(table, batch_ids), axis=1)
                loss = tf.reduce_mean(tf.square(dense(pooled) - batch_labels))
            grads = tape.gradient(loss, [table] + dense.trainable_variables)
            sparse_opt.apply_gradients([(grads[0], table)])
            dense_opt.apply_gradients(zip(grads[1:], dense.trainable_variables, strict=True))
            return loss

        print(f"\n== training on var_type {var_type!r}: {steps} steps of {batch} samples x {hotness} ids, dim {dim}")
        losses = []
        with TqdmCallback(desc=f"train {var_type}", unit="step") as bar:
            bar.set_size(steps)
            train_step(tf.constant(ids[0]), tf.constant(labels[0]))  # trace once, outside the timing
            start = time.perf_counter()
            for step in range(steps):
                losses.append(float(train_step(tf.constant(ids[step]), tf.constant(labels[step]))))
                bar.relative_update(1)
            seconds = time.perf_counter() - start
        first, last = float(np.mean(losses[:10])), float(np.mean(losses[-10:]))
        results[var_type] = {
            "steps_per_s": steps / seconds,
            "first_loss": first,
            "last_loss": last,
            "rows": int(table.size.numpy()[0]),
        }
        print(
            f"loss {first:.4f} -> {last:.4f}   {steps / seconds:6.1f} steps/s   "
            f"{steps * batch / seconds / 1e3:8.1f} k samples/s   {results[var_type]['rows']:,} rows"
        )
    return results
