"""The storage demo behind ``sok demo``: what a table of each backend does, at scale, with timings.

For each var_type: insert ``num_keys`` keys in batches (progress bar), find them again, look up a
mix of old and new keys, then export. The hybrid table is capped at half the keys so the second
half of the inserts evicts, and the evicted rows are counted (``insert_and_evict``).
"""

from __future__ import annotations

import os
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
    """Train a small click model with two distributed tables and one dynamic table, per var_type.

    Three features of power-law ids (1 to 8 per sample) are looked up in one ``sok.lookup_sparse``
    call: "user" and "item" are ``sok.Variable`` tables (row ``i`` on rank ``i % n``), "query" is a
    ``sok.DynamicVariable`` of the var_type. Launched under ``horovodrun`` the ranks train one model
    together (each rank its own batch); otherwise one process trains it. The target is a fixed random
    function of the ids, so the loss can go down. Lookup, backward and the updates (Keras Adagrad on
    the static tables, ``sok.OptimizerWrapper(Adagrad)`` on the dynamic one, Adam on the dense
    layer) run in one tf.function. Rank 0 prints.
    """
    import tensorflow as tf

    from sparse_operation_kit import communication
    from sparse_operation_kit.distributed_variable import Variable
    from sparse_operation_kit.dynamic_variable import DynamicVariable
    from sparse_operation_kit.lookup import lookup_sparse
    from sparse_operation_kit.optimizer import OptimizerWrapper

    if steps < 1 or batch < 1 or dim < 1 or vocabulary < 2:
        raise ValueError(
            f"steps, batch and dim must be >= 1 and vocabulary >= 2, got {steps}, {batch}, {dim}, {vocabulary}"
        )
    if "HOROVOD_RANK" in os.environ and communication._tool is None:
        communication.init("horovod")
    rank, ranks = communication.rank(), communication.num_ranks()
    say = print if rank == 0 else (lambda *args, **kwargs: None)
    rng = np.random.default_rng(seed + 1000 * rank)  # each rank its own batches
    static_rows = min(vocabulary, 1 << 16)

    def feature(rows: int) -> tuple[list, np.ndarray]:
        lengths = rng.integers(1, 9, size=(steps, batch))
        ids = np.minimum(rng.zipf(1.2, size=int(lengths.sum())), rows) - 1
        return np.split(ids, np.cumsum(lengths.ravel())[:-1]), lengths

    user, user_len = feature(static_rows)
    item, item_len = feature(static_rows)
    query, query_len = feature(vocabulary)
    # Labels: a fixed function of the first id of each feature.
    first = np.array([[u[0] % 7, i[0] % 5, q[0] % 3] for u, i, q in zip(user, item, query)])
    labels = (first[:, 0] < 3).astype(np.float32) * 0.5 + (first[:, 1] < 2) * 0.3 + (first[:, 2] == 0) * 0.2
    labels = labels.reshape(steps, batch, 1).astype(np.float32)

    def ragged(parts: list, lengths: np.ndarray, step: int, scatter: bool = False) -> tf.RaggedTensor:
        values = np.concatenate(parts[step * batch : (step + 1) * batch]).astype(np.int64)
        if scatter:  # dynamic keys spread over the int64 range
            values = (values.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)).view(np.int64)
        return tf.RaggedTensor.from_row_lengths(values, lengths[step])

    results = {}
    for var_type in var_types:
        init = tf.keras.initializers.RandomUniform(-0.05, 0.05, seed=seed)  # the same tables on every rank
        tables = [
            Variable(shape=[static_rows, dim], initializer=init, dtype=tf.float32, name=f"user_{var_type}"),
            Variable(shape=[static_rows, dim], initializer=init, dtype=tf.float32, name=f"item_{var_type}"),
        ]
        options = {"init_capacity": 1 << 16, "max_capacity": 1 << 22} if var_type == "hybrid" else {}
        dynamic = DynamicVariable(dim, var_type=var_type, initializer="random", name=f"query_{var_type}", **options)
        dense = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=seed))
        dense.build((None, 3 * dim))
        static_opt = tf.keras.optimizers.Adagrad(learning_rate=0.1)
        sparse_opt = OptimizerWrapper(tf.keras.optimizers.Adagrad(learning_rate=0.1))
        dense_opt = tf.keras.optimizers.Adam(learning_rate=0.01)

        @tf.function
        def train_step(
            u,
            i,
            q,
            y,
            tables=tables,
            dynamic=dynamic,
            dense=dense,
            static_opt=static_opt,
            sparse_opt=sparse_opt,
            dense_opt=dense_opt,
        ):
            with tf.GradientTape() as tape:
                pooled = lookup_sparse(tables + [dynamic], [u, i, q], combiners=["mean"] * 3)
                loss = tf.reduce_mean(tf.square(dense(tf.concat(pooled, axis=1)) - y))
            grads = tape.gradient(loss, tables + [dynamic] + dense.trainable_variables)
            static_opt.apply_gradients(zip(grads[:2], tables))
            sparse_opt.apply_gradients([(grads[2], dynamic)])
            dense_opt.apply_gradients(zip(grads[3:], dense.trainable_variables))
            return loss

        def inputs(step: int) -> tuple:
            return (
                ragged(user, user_len, step),
                ragged(item, item_len, step),
                ragged(query, query_len, step, scatter=True),
                tf.constant(labels[step]),
            )

        say(
            f"\n== training on {ranks} rank(s): 2 distributed tables + 1 dynamic table of var_type {var_type!r}, "
            f"{steps} steps of {batch} samples per rank, dim {dim}"
        )
        losses = []
        train_step(*inputs(0))  # trace once, outside the timing
        with TqdmCallback(desc=f"train {var_type}", unit="step", disable=rank != 0) as bar:
            bar.set_size(steps)
            start = time.perf_counter()
            for step in range(steps):
                losses.append(float(train_step(*inputs(step))))
                bar.relative_update(1)
            seconds = time.perf_counter() - start
        window = max(1, min(10, steps // 4))
        first, last = float(np.mean(losses[:window])), float(np.mean(losses[-window:]))
        results[var_type] = {
            "steps_per_s": steps / seconds,
            "first_loss": first,
            "last_loss": last,
            "dynamic_rows": int(dynamic.size.numpy()[0]),
        }
        say(
            f"loss {first:.4f} -> {last:.4f}   {steps / seconds:6.1f} steps/s   "
            f"{steps * batch * ranks / seconds / 1e3:8.1f} k samples/s over {ranks} rank(s)   "
            f"{results[var_type]['dynamic_rows']:,} dynamic rows on rank 0"
        )
    return results
