"""Worker of test_checkpoint_multiprocess.py, run under horovodrun (Gloo, CPU).

``dump CKPT OUT``
    Builds a distributed and a localized static table (localized on the last rank), two distributed
    dynamic tables (hbm, hybrid) and a localized dynamic one (hbm, on the last rank), each rank
    filling the keys it owns with rows that are a function of the key, trains one Adagrad step on
    every table (the static ones through the wrapped Keras optimizer), dumps everything to CKPT, and
    rank 0 writes the global contents (weights and accumulators, gathered from every rank) to
    OUT/expected.npz.

``load CKPT EXPECTED OUT DUMP2``
    Loads CKPT into fresh tables (localized ones on the last rank) and a fresh wrapper, checks that
    each rank holds exactly the rows it owns under this world size with the values of EXPECTED,
    dumps them again to DUMP2, loads the dynamic tables again into empty tables that are filled
    while the files are read (weights only, and attached to a wrapper beforehand), checks those
    too, and writes OUT/result-<rank>.json (``{"errors": [...]}``).

Every rank exits 0 when its checks pass and 1 otherwise.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import sparse_operation_kit as sok  # noqa: E402
import tensorflow as tf  # noqa: E402
from harness import print_stacks_before_timeout  # noqa: E402
from sparse_operation_kit.checkpoint import format as fmt  # noqa: E402

DIM = 4
STATIC_ROWS = 11  # not a multiple of 2 or 3: shards of unequal size
DYNAMIC = {"dyn_hbm": ("hbm", None), "dyn_hybrid": ("hybrid", None), "dyn_local": ("hbm", "localized")}
OPTIONS = {"hbm": {}, "hybrid": {"init_capacity": 1024, "max_capacity": 1 << 16}}
# Keys filled before training, and the global training batch (with duplicates and new keys 50, 51).
KEYS = np.array(list(range(20)) + [2**40, 2**40 + 1, 1_000_003, 7_777_777_777], np.int64)
BATCH = np.array([0, 1, 2, 3, 3, 5, 8, 13, 2**40, 1_000_003, 50, 51, 51], np.int64)


def static_table(offset: float) -> np.ndarray:
    return (np.arange(STATIC_ROWS * DIM, dtype=np.float32).reshape(STATIC_ROWS, DIM) + offset) / 3


def key_rows(keys: np.ndarray) -> np.ndarray:
    """A row per key, a function of the key alone."""
    k = (keys % 1009).astype(np.float32)[:, None]
    return np.sin(k + np.arange(DIM, dtype=np.float32)) / 2


def owned(keys: np.ndarray, mode: str | None, rank: int, n: int) -> np.ndarray:
    if mode == "localized":
        return np.full(keys.shape, rank == n - 1)
    return keys % n == rank


def dynamic_tables(n: int) -> dict:
    return {
        name: sok.DynamicVariable(
            dimension=DIM,
            var_type=var_type,
            name=name,
            initializer="0.5",
            mode=None if mode is None else f"localized:{n - 1}",
            **OPTIONS[var_type],
        )
        for name, (var_type, mode) in DYNAMIC.items()
    }


def static_tables(values: dict[str, np.ndarray], n: int) -> dict:
    return {
        "dist": sok.Variable(values["dist"], dtype=tf.float32, name="dist"),
        "local": sok.Variable(values["local"], dtype=tf.float32, mode=f"localized:{n - 1}", name="local"),
    }


def static_keys(var, name: str, rank: int, n: int) -> np.ndarray:
    """The global row ids of this rank's rows of a static table."""
    local = np.arange(var.shape[0], dtype=np.int64)
    return local if name == "local" else local * n + rank


def static_gradient(var, name: str, rank: int, n: int) -> tf.Tensor:
    """A gradient that is a function of the global row id (so any world size can check it)."""
    keys = static_keys(var, name, rank, n)
    return tf.constant(np.repeat(((keys % 5) + 1).astype(np.float32)[:, None] / 10, DIM, axis=1))


def local_state(var, wrapper) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    keys, rows = (t.numpy() for t in sok.export(var))
    slot_keys, slot = (t.numpy() for t in wrapper.get_slot(var, "accumulator"))
    order, slot_order = np.argsort(keys), np.argsort(slot_keys)
    assert np.array_equal(keys[order], slot_keys[slot_order])
    return keys[order], rows[order], slot[slot_order]


def dump(ckpt: str, out: str) -> list[str]:
    rank, n = hvd.rank(), hvd.size()
    statics = static_tables({"dist": static_table(0), "local": static_table(100)}, n)
    dynamics = dynamic_tables(n)
    for name, var in dynamics.items():
        mine = KEYS[owned(KEYS, DYNAMIC[name][1], rank, n)]
        sok.assign(var, tf.constant(mine), key_rows(mine))
    wrapper = sok.OptimizerWrapper(tf.keras.optimizers.Adagrad(learning_rate=0.1))
    with tf.GradientTape() as tape:
        losses = []
        for name, var in dynamics.items():
            ids = BATCH[owned(BATCH, DYNAMIC[name][1], rank, n)]
            emb = tf.nn.embedding_lookup(var, tf.constant(ids))
            weight = tf.constant(((ids % 7) + 1).astype(np.float32)[:, None])  # a function of the key
            losses.append(tf.reduce_sum(weight * tf.square(emb - 0.3)))
        loss = tf.add_n(losses)
    variables = list(dynamics.values())
    wrapper.apply_gradients(zip(tape.gradient(loss, variables), variables))
    # The static tables train through the wrapped Keras optimizer (their state lives there).
    wrapper.apply_gradients([(static_gradient(var, name, rank, n), var) for name, var in statics.items()])

    expected = {}
    for name, var in statics.items():
        keys = static_keys(var, name, rank, n)
        accumulator = wrapper.static_slots(var)["accumulator"].numpy()
        expected[f"{name}/keys"] = hvd.allgather(tf.constant(keys)).numpy()
        expected[f"{name}/weights"] = hvd.allgather(tf.constant(var.numpy())).numpy()
        expected[f"{name}/accumulator"] = hvd.allgather(tf.constant(accumulator)).numpy()
    for name, var in dynamics.items():
        keys, rows, accumulator = local_state(var, wrapper)
        expected[f"{name}/keys"] = hvd.allgather(tf.constant(keys)).numpy()
        expected[f"{name}/weights"] = hvd.allgather(tf.constant(rows.reshape(-1, DIM))).numpy()
        expected[f"{name}/accumulator"] = hvd.allgather(tf.constant(accumulator.reshape(-1, DIM))).numpy()
    sok.dump(ckpt, [statics["dist"], statics["local"], *variables], wrapper)
    if rank == 0:
        np.savez(os.path.join(out, "expected.npz"), **expected)
    return []


def load(ckpt: str, expected_path: str, out: str, dump2: str) -> list[str]:
    rank, n = hvd.rank(), hvd.size()
    expected = dict(np.load(expected_path))
    zeros = np.zeros((STATIC_ROWS, DIM), np.float32)
    statics = static_tables({"dist": zeros, "local": zeros}, n)
    dynamics = dynamic_tables(n)
    wrapper = sok.OptimizerWrapper(tf.keras.optimizers.Adagrad(learning_rate=0.1))
    wrapper.optimizer.build(list(statics.values()))  # Keras 3 optimizers are built with all their variables
    sok.load(ckpt, [*dynamics.values(), statics["local"], statics["dist"]], wrapper)

    errors = []

    def check(what: str, got: np.ndarray, want: np.ndarray) -> None:
        if got.shape != want.shape or not np.array_equal(got, want):
            errors.append(f"rank {rank}: {what}: got {got.tolist()}, expected {want.tolist()}")

    for name, var in statics.items():
        all_keys = expected[f"{name}/keys"]
        order = np.argsort(all_keys)
        want = static_keys(var, name, rank, n)
        check(f"{name} weights", var.numpy(), expected[f"{name}/weights"][order][want])
        accumulator = wrapper.static_slots(var)["accumulator"].numpy()
        check(f"{name} accumulator", accumulator, expected[f"{name}/accumulator"][order][want])
    if int(wrapper.optimizer.iterations.numpy()) != 1:
        errors.append(f"rank {rank}: optimizer.iterations is {int(wrapper.optimizer.iterations.numpy())}, expected 1")
    if int(wrapper.iterations.numpy()) != 1:
        errors.append(f"rank {rank}: wrapper.iterations is {int(wrapper.iterations.numpy())}, expected 1")

    def check_dynamic(what: str, name: str, var, wrapper) -> None:
        """This rank's rows of a dynamic table (and its accumulator, with ``wrapper``), by key."""
        if wrapper is None:
            keys, rows = (t.numpy() for t in sok.export(var))
            by_key = np.argsort(keys)
            keys, rows = keys[by_key], rows[by_key]
        else:
            keys, rows, accumulator = local_state(var, wrapper)
        all_keys = expected[f"{name}/keys"]
        mine = owned(all_keys, DYNAMIC[name][1], rank, n)
        order = np.argsort(all_keys[mine])
        check(f"{what} {name} keys", keys, all_keys[mine][order])
        check(f"{what} {name} weights", rows, expected[f"{name}/weights"][mine][order])
        if wrapper is not None:
            check(f"{what} {name} accumulator", accumulator, expected[f"{name}/accumulator"][mine][order])

    for name, var in dynamics.items():  # staged (the fresh wrapper widens them)
        check_dynamic("staged", name, var, wrapper)
    sok.dump(dump2, [statics["dist"], statics["local"], *dynamics.values()], wrapper)

    # The same dynamic tables filled while the files are read (empty, with the columns of every
    # file they load), in chunks of 3 rows (6 keys) so each rank keeps a part of most chunks:
    # weights only, and with a wrapper that already owns them (as after a first training step).
    fmt.READ_CHUNK = 3 * DIM * 4 + 5
    plain = dynamic_tables(n)
    sok.load(ckpt, list(plain.values()))
    owner = sok.OptimizerWrapper(tf.keras.optimizers.Adagrad(learning_rate=0.1))
    attached = dynamic_tables(n)
    for var in attached.values():
        owner.attach(var)
    sok.load(ckpt, list(attached.values()), owner)
    for name in DYNAMIC:
        check_dynamic("filled while reading", name, plain[name], None)
        check_dynamic("filled while reading", name, attached[name], owner)
    return errors


def main(argv: list[str]) -> int:
    print_stacks_before_timeout()
    hvd.init()
    sok.init()
    phase = argv[1]
    if phase == "dump":
        errors = dump(argv[2], argv[3])
        out = argv[3]
    else:
        errors = load(argv[2], argv[3], argv[4], argv[5])
        out = argv[4]
    with open(os.path.join(out, f"result-{hvd.rank()}.json"), "w") as f:
        json.dump({"rank": hvd.rank(), "size": hvd.size(), "errors": errors}, f)
    for error in errors:
        print(error, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
