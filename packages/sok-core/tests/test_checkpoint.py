"""sok.dump / sok.load, incremental_model_dump and ``sok ckpt`` in one process. Reference §1.10, §1.11.

* Round trips of dynamic tables (det "hbm", hkv "hybrid") with every OptimizerWrapper rule: weights
  and state are equal by key after a load into fresh variables and a fresh wrapper, the step count
  is restored, and one more training step gives what it gives without the checkpoint.
* Static distributed and localized tables; det -> hkv -> det.
* A checkpoint in NVIDIA SOK's own layout (written here, byte by byte from §1.10) loads.
* Corrupt or mismatched files raise CheckpointError naming the file and leave the variables as
  they were; a dump that fails half-way leaves the previous checkpoint in place.
* incremental_model_dump; ``sok ckpt inspect`` (``sok ckpt convert``: sok-hps's tests).

Resharding across world sizes is in test_checkpoint_multiprocess.py.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import struct
import time

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
import sparse_operation_kit as sok  # noqa: E402
from sparse_operation_kit.checkpoint import collective as ckpt  # noqa: E402
from sparse_operation_kit.checkpoint import directory as ckdir  # noqa: E402
from sparse_operation_kit.checkpoint import format as fmt  # noqa: E402
from sparse_operation_kit.checkpoint.inspect import inspect as ckpt_inspect  # noqa: E402
from sparse_operation_kit.cli import main as cli_main  # noqa: E402

K = tf.keras.optimizers
VAR_TYPES = ["hbm", "hybrid"]
OPTIONS = {"hbm": {}, "hybrid": {"init_capacity": 1024, "max_capacity": 1 << 16}}
DIM = 4
V = 8  # keys 0..V-1 are assigned before training
INITIAL = np.random.default_rng(0).uniform(-1.0, 1.0, (V, DIM)).astype(np.float32)
# Three steps: duplicates, keys untouched until step 3 (6, 7) and a key never assigned (100).
STEP_IDS = [[0, 1, 2, 3, 0], [2, 3, 4, 5, 5, 1], [1, 4, 6, 7, 100, 4]]

OPTIMIZERS = {
    "SGD": lambda: K.SGD(learning_rate=0.1),
    "SGD-momentum": lambda: K.SGD(learning_rate=0.1, momentum=0.9),
    "Adagrad": lambda: K.Adagrad(learning_rate=0.1),
    "Adam": lambda: K.Adam(learning_rate=0.05),
    "Adamax": lambda: K.Adamax(learning_rate=0.05),
    "Adadelta": lambda: K.Adadelta(learning_rate=1.0),
    "Ftrl": lambda: K.Ftrl(learning_rate=0.1),
    "RMSprop": lambda: K.RMSprop(learning_rate=0.01, momentum=0.9, centered=True),
}


# -- helpers ----------------------------------------------------------------------------------
def make_var(var_type: str, name: str = "emb", dimension: int = DIM, **kwargs) -> sok.DynamicVariable:
    kwargs.setdefault("initializer", "0.5")
    return sok.DynamicVariable(dimension=dimension, var_type=var_type, name=name, **OPTIONS[var_type], **kwargs)


def filled_var(var_type: str, name: str = "emb", **kwargs) -> sok.DynamicVariable:
    v = make_var(var_type, name, **kwargs)
    sok.assign(v, tf.range(V, dtype=v.key_type), INITIAL)
    return v


def by_key(keys, values) -> tuple[np.ndarray, np.ndarray]:
    keys, values = np.asarray(keys), np.asarray(values)
    order = np.argsort(keys, kind="stable")
    return keys[order], values[order]


def weights(var) -> tuple[np.ndarray, np.ndarray]:
    return by_key(*sok.export(var))


def state(var, wrapper=None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Weights and every slot of the variable, sorted by key."""
    out = {"weights": weights(var)}
    if wrapper is not None:
        for slot in wrapper.get_slot_names():
            out[slot] = by_key(*(t.numpy() for t in wrapper.get_slot(var, slot)))
    return out


def assert_state_equal(got: dict, expected: dict) -> None:
    assert got.keys() == expected.keys()
    for name in expected:
        np.testing.assert_array_equal(got[name][0], expected[name][0], err_msg=f"{name}: keys")
        np.testing.assert_array_equal(got[name][1], expected[name][1], err_msg=f"{name}: values")


def train_step(var, wrapper, ids) -> None:
    ids = tf.constant(ids, var.key_type)
    w = tf.reshape(tf.linspace(0.5, 1.5, tf.size(ids)), [-1, 1])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * tf.square(tf.nn.embedding_lookup(var, ids) - 0.3))
    wrapper.apply_gradients(zip(tape.gradient(loss, [var]), [var]))


def files(path) -> dict[str, bytes]:
    out = {}
    for name in sorted(os.listdir(path)):
        with open(os.path.join(path, name), "rb") as f:
            out[name] = f.read()
    return out


def siblings(path) -> list[str]:
    """Entries beside the checkpoint directory (staging leftovers would show up here)."""
    return sorted(os.listdir(os.path.dirname(os.path.abspath(path))))


# -- dynamic round trips with every optimizer -------------------------------------------------
@pytest.mark.parametrize("var_type", VAR_TYPES)
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_dynamic_round_trip_with_optimizer_state_continues_training(tmp_path, name, var_type):
    v, wrapper = filled_var(var_type), sok.OptimizerWrapper(OPTIMIZERS[name]())
    for ids in STEP_IDS[:2]:
        train_step(v, wrapper, ids)
    saved = state(v, wrapper)
    sok.dump(str(tmp_path / "ckpt"), v, wrapper)

    train_step(v, wrapper, STEP_IDS[2])  # the run without a checkpoint
    expected = state(v, wrapper)

    fresh, fresh_wrapper = make_var(var_type), sok.OptimizerWrapper(OPTIMIZERS[name]())
    sok.load(str(tmp_path / "ckpt"), fresh, fresh_wrapper)
    assert_state_equal(state(fresh, fresh_wrapper), saved)
    assert int(fresh_wrapper.iterations.numpy()) == 2

    train_step(fresh, fresh_wrapper, STEP_IDS[2])  # the run that resumed from the checkpoint
    assert_state_equal(state(fresh, fresh_wrapper), expected)
    assert int(fresh_wrapper.iterations.numpy()) == 3


def test_slot_files_follow_nvidia_naming(tmp_path):
    v, wrapper = filled_var("hbm", name="table1"), sok.OptimizerWrapper(K.Ftrl(learning_rate=0.1))
    train_step(v, wrapper, STEP_IDS[0])
    sok.dump(str(tmp_path), [v], [wrapper])  # a one-element optimizer list is accepted
    assert sorted(os.listdir(tmp_path)) == [
        "manifest.json",
        "table1_0-Ftrl-accumulator",
        "table1_0-Ftrl-linear",
        "table1_0-key",
        "table1_0-weight",
    ]
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["optimizer"] == "Ftrl" and manifest["step"] == 1 and manifest["world_size"] == 1
    entry = manifest["tables"]["table1_0"]
    assert entry["rows"] == V and entry["dim"] == DIM and entry["slots"] == ["accumulator", "linear"]
    # Headers (§1.10): 256 spaces, big-endian type, 32-byte right-justified slot name, dtype index.
    raw = (tmp_path / "table1_0-Ftrl-linear").read_bytes()
    assert raw[:256] == b" " * 256
    assert struct.unpack(">I", raw[256:260])[0] == fmt.FILE_STATE
    assert raw[260:292] == b"linear".rjust(32)
    assert struct.unpack(">I", raw[292:296])[0] == fmt.DTYPE_INDEX["float32"]
    assert len(raw) == 296 + 4 * V * DIM
    key_raw = (tmp_path / "table1_0-key").read_bytes()
    assert struct.unpack(">I", key_raw[256:260])[0] == fmt.FILE_KEY
    assert struct.unpack(">I", key_raw[292:296])[0] == fmt.DTYPE_INDEX["int64"]
    np.testing.assert_array_equal(np.sort(np.frombuffer(key_raw[296:], "<i8")), np.arange(V))  # table order


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_load_without_optimizer_restores_weights_only(tmp_path, var_type):
    v, wrapper = filled_var(var_type), sok.OptimizerWrapper(K.Adagrad(learning_rate=0.1))
    train_step(v, wrapper, STEP_IDS[0])
    sok.dump(str(tmp_path), v, wrapper)
    fresh = make_var(var_type)
    sok.load(str(tmp_path), fresh)
    assert_state_equal(state(fresh), state(v))


@pytest.mark.parametrize("key_type", ["int32", "uint64"])
@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_dynamic_round_trip_other_key_types(tmp_path, var_type, key_type):
    v = make_var(var_type, key_type=key_type)
    keys = np.array([0, 7, 3, 2**31 - 1] if key_type == "int32" else [0, 7, 3, 2**63 + 5, 2**64 - 1], key_type)
    values = np.random.default_rng(1).standard_normal((keys.size, DIM)).astype(np.float32)
    sok.assign(v, tf.constant(keys), values)
    sok.dump(str(tmp_path), v)
    assert fmt.read_header(str(tmp_path / "emb_0-key")).dtype == key_type
    fresh = make_var(var_type, key_type=key_type)
    sok.load(str(tmp_path), fresh)
    assert_state_equal(state(fresh), state(v))


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_empty_dynamic_table_round_trip(tmp_path, var_type):
    v = make_var(var_type)
    sok.dump(str(tmp_path), v)
    fresh = filled_var(var_type)
    sok.load(str(tmp_path), fresh)  # nothing to assign: the fresh rows stay
    assert_state_equal(state(fresh), {"weights": (np.arange(V), INITIAL)})


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_load_keeps_rows_of_keys_the_checkpoint_lacks(tmp_path, var_type):
    sok.dump(str(tmp_path), filled_var(var_type))
    live = make_var(var_type)
    sok.assign(live, tf.constant([6, 7, 100, 101], tf.int64), np.full((4, DIM), 9.0, np.float32))
    sok.load(str(tmp_path), live)
    expected_keys = np.array(list(range(V)) + [100, 101])
    expected_rows = np.concatenate([INITIAL, np.full((2, DIM), 9.0, np.float32)])
    assert_state_equal(state(live), {"weights": (expected_keys, expected_rows)})


def test_det_to_hkv_to_det(tmp_path):
    det, wrapper = filled_var("hbm"), sok.OptimizerWrapper(K.Adam(learning_rate=0.05))
    for ids in STEP_IDS[:2]:
        train_step(det, wrapper, ids)
    saved = state(det, wrapper)
    sok.dump(str(tmp_path / "a"), det, wrapper)

    hkv, hkv_wrapper = make_var("hybrid"), sok.OptimizerWrapper(K.Adam(learning_rate=0.05))
    sok.load(str(tmp_path / "a"), hkv, hkv_wrapper)
    assert_state_equal(state(hkv, hkv_wrapper), saved)
    sok.dump(str(tmp_path / "b"), hkv, hkv_wrapper)

    back, back_wrapper = make_var("hbm"), sok.OptimizerWrapper(K.Adam(learning_rate=0.05))
    sok.load(str(tmp_path / "b"), back, back_wrapper)
    assert_state_equal(state(back, back_wrapper), saved)
    assert int(back_wrapper.iterations.numpy()) == 2
    # The two checkpoints hold the same rows (each in its writer's table order).
    assert sorted(files(tmp_path / "a")) == sorted(files(tmp_path / "b"))


# -- static tables ----------------------------------------------------------------------------
STATIC_ROWS = 10


def static_values(dim: int = DIM, offset: float = 0.0) -> np.ndarray:
    return (np.arange(STATIC_ROWS * dim, dtype=np.float32).reshape(STATIC_ROWS, dim) + offset) / 7


@pytest.mark.parametrize("mode", [None, "localized:0"])
def test_static_round_trip(tmp_path, mode):
    v = sok.Variable(static_values(), dtype=tf.float32, mode=mode, name="static")
    sok.dump(str(tmp_path), v)
    keys = fmt.payload(fmt.read_header(str(tmp_path / "static_0-key")))
    np.testing.assert_array_equal(keys, np.arange(STATIC_ROWS))
    fresh = sok.Variable(np.zeros((STATIC_ROWS, DIM)), dtype=tf.float32, mode=mode, name="static")
    sok.load(str(tmp_path), fresh)
    np.testing.assert_array_equal(fresh.numpy(), static_values())


def test_static_and_dynamic_in_one_checkpoint_with_optimizer(tmp_path):
    static = sok.Variable(static_values(), dtype=tf.float32, name="static")
    localized = sok.Variable(static_values(offset=1), dtype=tf.float32, mode="localized:0", name="local")
    dyn, wrapper = filled_var("hybrid", name="dyn"), sok.OptimizerWrapper(K.Adagrad(learning_rate=0.1))
    train_step(dyn, wrapper, STEP_IDS[0])
    sok.dump(str(tmp_path), [static, dyn, localized], wrapper)
    fresh_static = sok.Variable(np.zeros((STATIC_ROWS, DIM)), dtype=tf.float32, name="static")
    fresh_local = sok.Variable(np.zeros((STATIC_ROWS, DIM)), dtype=tf.float32, mode="localized:0", name="local")
    fresh_dyn, fresh_wrapper = make_var("hybrid", name="dyn"), sok.OptimizerWrapper(K.Adagrad(learning_rate=0.1))
    sok.load(str(tmp_path), [fresh_local, fresh_dyn, fresh_static], fresh_wrapper)  # any order
    np.testing.assert_array_equal(fresh_static.numpy(), static_values())
    np.testing.assert_array_equal(fresh_local.numpy(), static_values(offset=1))
    assert_state_equal(state(fresh_dyn, fresh_wrapper), state(dyn, wrapper))


def static_train_step(var, wrapper, ids) -> None:
    ids = tf.constant([i % STATIC_ROWS for i in ids], tf.int64)
    w = tf.reshape(tf.linspace(0.5, 1.5, tf.size(ids)), [-1, 1])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * tf.square(tf.gather(var, ids) - 0.3))
    wrapper.apply_gradients(zip(tape.gradient(loss, [var]), [var]))


def static_state(var, wrapper) -> dict[str, np.ndarray]:
    out = {"weights": var.numpy()}
    out.update({name: slot.numpy() for name, slot in wrapper.static_slots(var).items()})
    return out


@pytest.mark.parametrize("mode", [None, "localized:0"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_static_round_trip_with_keras_optimizer_state_continues_training(tmp_path, name, mode):
    v = sok.Variable(static_values(), dtype=tf.float32, mode=mode, name="static")
    wrapper = sok.OptimizerWrapper(OPTIMIZERS[name]())
    for ids in STEP_IDS[:2]:
        static_train_step(v, wrapper, ids)
    saved = static_state(v, wrapper)
    assert set(saved) == {"weights", *wrapper.get_slot_names()}
    sok.dump(str(tmp_path / "ckpt"), v, wrapper)
    assert json.loads((tmp_path / "ckpt" / "manifest.json").read_text())["tables"]["static_0"]["slots"] == (
        wrapper.get_slot_names()
    )
    static_train_step(v, wrapper, STEP_IDS[2])  # the run without a checkpoint
    expected = static_state(v, wrapper)

    fresh = sok.Variable(np.zeros((STATIC_ROWS, DIM)), dtype=tf.float32, mode=mode, name="static")
    fresh_wrapper = sok.OptimizerWrapper(OPTIMIZERS[name]())
    fresh_wrapper.optimizer.build([fresh])
    sok.load(str(tmp_path / "ckpt"), fresh, fresh_wrapper)
    for key, value in saved.items():
        np.testing.assert_array_equal(static_state(fresh, fresh_wrapper)[key], value, err_msg=key)
    assert int(fresh_wrapper.optimizer.iterations.numpy()) == 2
    static_train_step(fresh, fresh_wrapper, STEP_IDS[2])  # the run that resumed from the checkpoint
    for key, value in expected.items():
        np.testing.assert_allclose(static_state(fresh, fresh_wrapper)[key], value, rtol=1e-6, err_msg=key)


def test_static_state_into_an_unbuilt_optimizer_is_refused_and_nothing_changes(tmp_path):
    v = sok.Variable(static_values(), dtype=tf.float32, name="static")
    wrapper = sok.OptimizerWrapper(K.Adam(learning_rate=0.05))
    static_train_step(v, wrapper, STEP_IDS[0])
    sok.dump(str(tmp_path), v, wrapper)
    fresh = sok.Variable(np.full((STATIC_ROWS, DIM), 7.0), dtype=tf.float32, name="static")
    with pytest.raises(ValueError, match="no state for it yet.*optimizer.build"):
        sok.load(str(tmp_path), fresh, sok.OptimizerWrapper(K.Adam(learning_rate=0.05)))
    np.testing.assert_array_equal(fresh.numpy(), np.full((STATIC_ROWS, DIM), 7.0))
    sok.load(str(tmp_path), fresh)  # without the optimizer: weights only
    np.testing.assert_array_equal(fresh.numpy(), v.numpy())


def test_static_state_of_a_tf_keras_legacy_optimizer_round_trips(tmp_path):
    tf_keras = pytest.importorskip("tf_keras")
    v = sok.Variable(static_values(), dtype=tf.float32, name="static")
    wrapper = sok.OptimizerWrapper(tf_keras.optimizers.legacy.Adam(learning_rate=0.05))
    static_train_step(v, wrapper, STEP_IDS[0])
    saved = static_state(v, wrapper)
    assert set(saved) == {"weights", "m", "v"}
    sok.dump(str(tmp_path), v, wrapper)
    fresh = sok.Variable(np.zeros((STATIC_ROWS, DIM)), dtype=tf.float32, name="static")
    fresh_wrapper = sok.OptimizerWrapper(tf_keras.optimizers.legacy.Adam(learning_rate=0.05))
    sok.load(str(tmp_path), fresh, fresh_wrapper)  # legacy slots are made on demand
    for key, value in saved.items():
        np.testing.assert_array_equal(static_state(fresh, fresh_wrapper)[key], value, err_msg=key)


def test_static_wrong_row_count_is_refused(tmp_path):
    sok.dump(str(tmp_path), sok.Variable(static_values(), dtype=tf.float32, name="static"))
    other = sok.Variable(np.ones((STATIC_ROWS + 1, DIM)), dtype=tf.float32, name="static")
    with pytest.raises(fmt.CheckpointError, match="static_0-key.*rows"):
        sok.load(str(tmp_path), other)
    np.testing.assert_array_equal(other.numpy(), np.ones((STATIC_ROWS + 1, DIM)))


def test_argument_errors(tmp_path):
    v = filled_var("hbm")
    with pytest.raises(TypeError, match="OptimizerWrapper or a Keras optimizer"):
        sok.dump(str(tmp_path / "x"), v, "adagrad")
    with pytest.raises(TypeError, match="sok.Variable"):
        sok.dump(str(tmp_path / "x"), tf.Variable([[1.0]]))
    with pytest.raises(ValueError, match="same checkpoint name"):
        sok.dump(str(tmp_path / "x"), [v, make_var("hbm")])
    with pytest.raises(fmt.CheckpointError, match="no checkpoint directory"):
        sok.load(str(tmp_path / "missing"), v)
    assert not (tmp_path / "x").exists()


# -- NVIDIA SOK's own files (§1.10), written here byte by byte ----------------------------------
def nvidia_file(path, file_type: int, dtype_index: int, payload: np.ndarray, slot: str = "") -> None:
    head = (
        " ".rjust(256, " ").encode()
        + struct.pack(">I", file_type)
        + slot.rjust(32, " ").encode()
        + struct.pack(">I", dtype_index)
    )
    with open(path, "wb") as f:
        f.write(head)
        payload.tofile(f)  # raw numpy.tofile: native (little-endian) order


def nvidia_table(path, table: str, keys: np.ndarray, rows: np.ndarray, slots: dict | None = None, opt: str = ""):
    """One table as NVIDIA SOK writes it: key, weight and state files; no manifest."""
    key_index = {np.dtype("int64"): 1, np.dtype("uint64"): 3}[keys.dtype]
    nvidia_file(os.path.join(path, f"{table}-key"), 0, key_index, keys)
    nvidia_file(os.path.join(path, f"{table}-weight"), 1, 5, rows.astype(np.float32))
    for slot, values in (slots or {}).items():
        nvidia_file(os.path.join(path, f"{table}-{opt}-{slot}"), 2, 5, values.astype(np.float32), slot)


@pytest.mark.parametrize("key_dtype", ["int64", "uint64"])
@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_nvidia_sok_checkpoint_loads(tmp_path, var_type, key_dtype):
    rng = np.random.default_rng(2)
    # Two ranks, one round: [rank 0's keys ascending][rank 1's keys ascending] (§1.10 step 4).
    keys = np.array([0, 2, 10, 2**40, 1, 3, 11], key_dtype)
    rows = rng.standard_normal((keys.size, DIM)).astype(np.float32)
    accumulator = rng.uniform(0.1, 2.0, (keys.size, DIM)).astype(np.float32)
    nvidia_table(str(tmp_path), "sok_dynamic_Variable_0_0", keys, rows, {"accumulator": accumulator}, "Adagrad")
    assert not (tmp_path / "manifest.json").exists()

    v = make_var(var_type, name="sok_dynamic_Variable_0")
    wrapper = sok.OptimizerWrapper(K.Adagrad(learning_rate=0.1))
    sok.load(str(tmp_path), v, wrapper)
    order = np.argsort(keys.astype(np.int64))
    expected_keys = keys.astype(np.int64)[order]
    assert_state_equal(
        state(v, wrapper),
        {"weights": (expected_keys, rows[order]), "accumulator": (expected_keys, accumulator[order])},
    )
    assert int(wrapper.iterations.numpy()) == 0  # NVIDIA SOK records no step

    # And without the optimizer, the state file is ignored.
    plain = make_var(var_type, name="sok_dynamic_Variable_0")
    sok.load(str(tmp_path), plain)
    assert_state_equal(state(plain), {"weights": (expected_keys, rows[order])})


def test_nvidia_sok_static_checkpoints_load(tmp_path):
    """Distributed static from 2 GPUs (int64 keys j*2+g, rank blocks) and localized static (uint64
    keys arange), both loaded into one process."""
    table = static_values()
    order = np.concatenate([np.arange(0, STATIC_ROWS, 2), np.arange(1, STATIC_ROWS, 2)])
    nvidia_table(str(tmp_path), "dist_0", order.astype(np.int64), table[order])
    nvidia_table(str(tmp_path), "local_0", np.arange(STATIC_ROWS, dtype=np.uint64), table + 1)
    dist = sok.Variable(np.zeros((STATIC_ROWS, DIM)), dtype=tf.float32, name="dist")
    local = sok.Variable(np.zeros((STATIC_ROWS, DIM)), dtype=tf.float32, mode="localized:0", name="local")
    sok.load(str(tmp_path), [dist, local])
    np.testing.assert_array_equal(dist.numpy(), table)
    np.testing.assert_array_equal(local.numpy(), table + 1)


def test_nvidia_sok_adamax_checkpoint_loads(tmp_path):
    keys = np.array([1, 2, 3], np.int64)
    rows = np.ones((3, DIM), np.float32)
    m, u = np.full((3, DIM), 0.25, np.float32), np.full((3, DIM), 0.75, np.float32)
    nvidia_table(str(tmp_path), "emb_0", keys, rows, {"m": m, "v": u}, "Adam")  # as NVIDIA SOK writes Adamax
    v, wrapper = make_var("hbm"), sok.OptimizerWrapper(K.Adamax(learning_rate=0.05))
    sok.load(str(tmp_path), v, wrapper)
    assert_state_equal(state(v, wrapper), {"weights": (keys, rows), "m": (keys, m), "u": (keys, u)})


# -- corrupt and mismatched checkpoints -----------------------------------------------------------
def corrupt_setup(tmp_path, var_type):
    """A checkpoint of two tables ("good", "bad") with Adagrad state, and live variables with
    *other* contents to load into, plus their snapshot."""
    good, bad = filled_var(var_type, name="good"), filled_var(var_type, name="bad")
    wrapper = sok.OptimizerWrapper(K.Adagrad(learning_rate=0.1))
    for ids in STEP_IDS[:2]:
        train_step(good, wrapper, ids)
        train_step(bad, wrapper, ids)
    path = str(tmp_path / "ckpt")
    sok.dump(path, [good, bad], wrapper)

    live_good, live_bad = filled_var(var_type, name="good"), filled_var(var_type, name="bad")
    live_wrapper = sok.OptimizerWrapper(K.Adagrad(learning_rate=0.3))
    train_step(live_good, live_wrapper, STEP_IDS[2])
    train_step(live_bad, live_wrapper, STEP_IDS[2])
    snapshot = [state(live_good, live_wrapper), state(live_bad, live_wrapper), int(live_wrapper.iterations.numpy())]
    return path, [live_good, live_bad], live_wrapper, snapshot


def assert_untouched(variables, wrapper, snapshot) -> None:
    assert_state_equal(state(variables[0], wrapper), snapshot[0])
    assert_state_equal(state(variables[1], wrapper), snapshot[1])
    assert int(wrapper.iterations.numpy()) == snapshot[2]


def truncate(path, nbytes: int) -> None:
    os.truncate(path, os.path.getsize(path) - nbytes)


CORRUPTIONS = {
    # name: (what to do to the checkpoint directory, regex the error must match)
    "truncated-weight-partial-float": (lambda p: truncate(f"{p}/bad_0-weight", 3), r"bad_0-weight.*truncated"),
    "truncated-weight-whole-row": (lambda p: truncate(f"{p}/bad_0-weight", 4 * DIM), r"bad_0-weight.*truncated"),
    "truncated-into-header": (
        lambda p: truncate(f"{p}/bad_0-key", os.path.getsize(f"{p}/bad_0-key") - 100),
        r"bad_0-key.*truncated",
    ),
    "flipped-weight-byte": (lambda p: flip_byte(f"{p}/bad_0-weight", 296 + 17), r"bad_0-weight.*checksum"),
    "flipped-slot-byte": (lambda p: flip_byte(f"{p}/bad_0-Adagrad-accumulator", 300), r"accumulator.*checksum"),
    "flipped-key-byte": (lambda p: flip_byte(f"{p}/bad_0-key", 296), r"bad_0-key.*checksum"),
    "deleted-slot-file": (lambda p: os.remove(f"{p}/bad_0-Adagrad-accumulator"), r"bad_0-Adagrad-accumulator.*missing"),
    "deleted-key-file": (lambda p: os.remove(f"{p}/bad_0-key"), r"bad_0-key.*missing"),
    "bad-manifest-json": (lambda p: open(f"{p}/manifest.json", "w").write("{"), r"manifest.json.*JSON"),
    "corrupt-header": (lambda p: overwrite(f"{p}/bad_0-weight", 256, struct.pack(">I", 9)), r"bad_0-weight.*header"),
}


def flip_byte(path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x40]))


def overwrite(path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


@pytest.mark.parametrize("var_type", VAR_TYPES)
@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_corrupt_checkpoint_is_refused_and_variables_untouched(tmp_path, corruption, var_type):
    path, variables, wrapper, snapshot = corrupt_setup(tmp_path, var_type)
    damage, message = CORRUPTIONS[corruption]
    damage(path)
    with pytest.raises(fmt.CheckpointError, match=message):
        sok.load(path, variables, wrapper)
    assert_untouched(variables, wrapper, snapshot)


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_corrupt_checkpoint_into_empty_variables_leaves_them_untouched(tmp_path, corruption):
    path = corrupt_setup(tmp_path, "hbm")[0]
    damage, message = CORRUPTIONS[corruption]
    damage(path)
    fresh, wrapper = [make_var("hbm", name="good"), make_var("hbm", name="bad")], sok.OptimizerWrapper(K.Adagrad())
    tables = [v.storage for v in fresh]
    with pytest.raises(fmt.CheckpointError, match=message):
        sok.load(path, fresh, wrapper)
    assert [v.storage for v in fresh] == tables and all(t.size() == 0 for t in tables)
    assert all(v.optimizer_wrapper is None for v in fresh)
    assert int(wrapper.iterations.numpy()) == 0


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_wrong_dimension_is_refused_and_variables_untouched(tmp_path, var_type):
    path, variables, wrapper, snapshot = corrupt_setup(tmp_path, var_type)
    wide = make_var(var_type, name="bad", dimension=DIM * 2)
    sok.assign(wide, tf.range(3, dtype=tf.int64), np.ones((3, DIM * 2), np.float32))
    with pytest.raises(fmt.CheckpointError, match=rf"bad_0-weight.*width {DIM}.*dimension {DIM * 2}"):
        sok.load(path, [variables[0], wide], wrapper)
    assert_state_equal(state(variables[0], wrapper), snapshot[0])
    assert_state_equal(state(wide), {"weights": (np.arange(3), np.ones((3, DIM * 2), np.float32))})
    assert int(wrapper.iterations.numpy()) == snapshot[2]


def test_wrong_optimizer_is_refused_and_variables_untouched(tmp_path):
    path, variables, wrapper, snapshot = corrupt_setup(tmp_path, "hbm")
    fresh, adam = make_var("hbm", name="good"), sok.OptimizerWrapper(K.Adam(learning_rate=0.05))
    with pytest.raises(fmt.CheckpointError, match=r"good_0-Adam-m.*missing"):
        sok.load(path, fresh, adam)
    assert fresh.storage.size() == 0
    assert int(adam.iterations.numpy()) == 0


def test_static_corruption_leaves_variable_untouched(tmp_path):
    sok.dump(str(tmp_path), sok.Variable(static_values(), dtype=tf.float32, name="static"))
    flip_byte(str(tmp_path / "static_0-weight"), 400)
    live = sok.Variable(np.full((STATIC_ROWS, DIM), 3.0), dtype=tf.float32, name="static")
    with pytest.raises(fmt.CheckpointError, match="static_0-weight.*checksum"):
        sok.load(str(tmp_path), live)
    np.testing.assert_array_equal(live.numpy(), np.full((STATIC_ROWS, DIM), 3.0))


def test_checkpoint_with_an_untrained_table_loads_with_its_optimizer(tmp_path):
    trained, untrained = filled_var("hbm", name="trained"), filled_var("hbm", name="untrained")
    wrapper = sok.OptimizerWrapper(K.Adagrad(learning_rate=0.1))
    train_step(trained, wrapper, STEP_IDS[0])
    sok.dump(str(tmp_path), [trained, untrained], wrapper)
    fresh = [make_var("hbm", name="trained"), make_var("hbm", name="untrained")]
    fresh_wrapper = sok.OptimizerWrapper(K.Adagrad(learning_rate=0.1))
    sok.load(str(tmp_path), fresh, fresh_wrapper)
    assert_state_equal(state(fresh[0], fresh_wrapper), state(trained, wrapper))
    assert_state_equal(state(fresh[1]), state(untrained))


# -- a dump that dies half-way --------------------------------------------------------------------
class Killed(Exception):
    pass


def failing_after(real, calls_before_failure: int):
    count = {"n": 0}

    def fake(*args, **kwargs):
        count["n"] += 1
        if count["n"] > calls_before_failure:
            raise Killed("simulated crash")
        return real(*args, **kwargs)

    return fake


def interrupted_dump_setup(tmp_path):
    v, wrapper = filled_var("hybrid"), sok.OptimizerWrapper(K.Adagrad(learning_rate=0.1))
    train_step(v, wrapper, STEP_IDS[0])
    path = str(tmp_path / "ckpt")
    sok.dump(path, v, wrapper)
    before_files, before_state = files(path), state(v, wrapper)
    before_siblings = siblings(path)
    train_step(v, wrapper, STEP_IDS[1])  # the next dump would write different contents
    return path, v, wrapper, before_files, before_state, before_siblings


def assert_previous_checkpoint_intact(path, before_files, before_state, before_siblings) -> None:
    assert files(path) == before_files
    assert siblings(path) == before_siblings  # no staging directory left behind
    fresh, fresh_wrapper = make_var("hybrid"), sok.OptimizerWrapper(K.Adagrad(learning_rate=0.1))
    sok.load(path, fresh, fresh_wrapper)
    assert_state_equal(state(fresh, fresh_wrapper), before_state)
    assert int(fresh_wrapper.iterations.numpy()) == 1


def failing_once(real, call_number: int):
    count = {"n": 0}

    def fake(*args, **kwargs):
        count["n"] += 1
        if count["n"] == call_number:
            raise Killed("simulated failure")
        return real(*args, **kwargs)

    return fake


@pytest.mark.parametrize("where", ["write_manifest", "fsync", "exchange", "second-rename"])
def test_interrupted_dump_keeps_previous_checkpoint(tmp_path, monkeypatch, where):
    path, v, wrapper, before_files, before_state, before_siblings = interrupted_dump_setup(tmp_path)
    if where == "write_manifest":
        monkeypatch.setattr(fmt, "write_manifest", failing_after(fmt.write_manifest, 0))
    elif where == "fsync":
        monkeypatch.setattr(os, "fsync", failing_after(os.fsync, 1))  # the second file of the table
    elif where == "exchange":
        monkeypatch.setattr(ckdir, "_exchange", failing_after(ckdir._exchange, 0))
    else:  # a file system without the exchange: two renames, the second fails and the first is undone
        monkeypatch.setattr(ckdir, "_exchange", lambda a, b: False)
        monkeypatch.setattr(os, "rename", failing_once(os.rename, 2))
    with pytest.raises(Killed):
        sok.dump(path, v, wrapper)
    monkeypatch.undo()
    assert_previous_checkpoint_intact(path, before_files, before_state, before_siblings)
    sok.dump(path, v, wrapper)  # and the next dump works
    assert files(path) != before_files


def test_dump_interrupted_between_renames_never_resurrects_and_next_dump_cleans_up(tmp_path, monkeypatch):
    """Where the file system cannot exchange two directories, the swap takes two renames; a SIGKILL
    between them (simulated: every later rename fails and the process cleans nothing up) leaves no
    checkpoint at the path. Nothing puts one back by itself (the user may have deleted it on purpose):
    load names the leftovers, and the next dump deletes them."""
    path, v, wrapper, before_files, before_state, before_siblings = interrupted_dump_setup(tmp_path)
    monkeypatch.setattr(ckdir, "_exchange", lambda a, b: False)
    monkeypatch.setattr(os, "rename", failing_after(os.rename, 1))
    monkeypatch.setattr(ckdir.Staging, "close", lambda self: os.close(self._lock))  # a dead process's lock is gone
    with pytest.raises(Killed):
        sok.dump(path, v, wrapper)
    monkeypatch.undo()
    assert not os.path.exists(path)
    left = ckdir.leftovers(path)
    assert len(left) == 2 and all(ckdir.is_complete(p) for p in left)  # the old and the new checkpoint
    with pytest.raises(fmt.CheckpointError, match=r"no checkpoint directory.*interrupted dumps.*rename it"):
        sok.load(path, make_var("hybrid"), sok.OptimizerWrapper(K.Adagrad(learning_rate=0.1)))
    with pytest.raises(fmt.CheckpointError, match="no checkpoint directory"):
        ckpt_inspect(path)
    assert not os.path.exists(path) and ckdir.leftovers(path) == left  # nothing moved
    sok.dump(path, v, wrapper)
    assert ckdir.leftovers(path) == [] and siblings(path) == before_siblings
    assert files(path) != before_files


# -- empty dynamic tables, filled while the files are read --------------------------------------------
STREAM_ROWS = 50
# READ_CHUNK forced small and not a whole number of rows: 3 weight rows (6 keys) per chunk, so a
# file of STREAM_ROWS rows comes in 17 chunks, the last one partial.
SMALL_CHUNK = 3 * DIM * 4 + 5
CHUNK_SIZES = [3] * (STREAM_ROWS // 3) + [STREAM_ROWS % 3]


def streaming_checkpoint(tmp_path, var_type, names=("emb",)):
    """A checkpoint of tables of STREAM_ROWS trained rows with Adam state (two slot files), and the
    state of each table it holds."""
    rng = np.random.default_rng(3)
    wrapper, sources = sok.OptimizerWrapper(K.Adam(learning_rate=0.05)), []
    for name in names:
        v = make_var(var_type, name)
        keys = rng.choice(1 << 40, STREAM_ROWS, replace=False).astype(np.int64)
        sok.assign(v, tf.constant(keys), rng.standard_normal((STREAM_ROWS, DIM)).astype(np.float32))
        train_step(v, wrapper, keys[::2])
        sources.append(v)
    path = str(tmp_path / "ckpt")
    sok.dump(path, sources, wrapper)
    return path, [state(v, wrapper) for v in sources]


def empty_var(var_type, name="emb", attached=False):
    """A fresh variable and, with ``attached``, a fresh Adam wrapper that already owns it (its rows
    have the slot columns, as after a first training step)."""
    v = make_var(var_type, name)
    wrapper = sok.OptimizerWrapper(K.Adam(learning_rate=0.05)) if attached else None
    if attached:
        wrapper.attach(v)
    return v, wrapper


def spy_streams(monkeypatch) -> list[tuple[str, list[int]]]:
    """Record each file streamed by sok.load and the sizes of the chunks it handed over."""
    calls, real = [], fmt.stream_payload

    def spy(info, rows, consume, *args, **kwargs):
        sizes: list[int] = []
        calls.append((os.path.basename(info.path), sizes))

        def counting(first, block):
            assert first == sum(sizes)  # in file order, no row skipped
            sizes.append(block.shape[0])
            consume(first, block)

        real(info, rows, counting, *args, **kwargs)

    monkeypatch.setattr(fmt, "stream_payload", spy)
    return calls


def weights_only(saved: dict) -> dict:
    return {"weights": saved["weights"]}


@pytest.mark.parametrize("attached", [False, True], ids=["weights-only", "attached"])
@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_fill_while_reading_loads_what_the_staged_path_loads(tmp_path, monkeypatch, var_type, attached):
    path, (saved,) = streaming_checkpoint(tmp_path, var_type)
    monkeypatch.setattr(fmt, "READ_CHUNK", SMALL_CHUNK)
    calls = spy_streams(monkeypatch)
    fresh, wrapper = empty_var(var_type, attached=attached)
    sok.load(path, fresh, wrapper)
    slot_files = ["emb_0-Adam-m", "emb_0-Adam-v"] if attached else []
    assert calls == [(name, CHUNK_SIZES) for name in ["emb_0-weight", *slot_files]]
    got = state(fresh, wrapper)

    staged, staged_wrapper = empty_var(var_type, attached=attached)
    monkeypatch.setattr(ckpt, "_fills_while_reading", lambda *args: False)
    sok.load(path, staged, staged_wrapper)
    assert len(calls) == 1 + len(slot_files)  # no more streams: the staged path
    assert_state_equal(got, state(staged, staged_wrapper))
    assert_state_equal(got, saved if attached else weights_only(saved))
    if attached:
        assert int(wrapper.iterations.numpy()) == 1  # the step recorded in the manifest


def truncate_while_read(monkeypatch, path: str) -> None:
    """Cut a whole row off the file ``path`` after its header was checked, just before it is streamed."""
    real = fmt.stream_payload

    def cut(info, *args, **kwargs):
        if info.path == path:
            truncate(info.path, 4 * DIM)
        return real(info, *args, **kwargs)

    monkeypatch.setattr(fmt, "stream_payload", cut)


FILL_CORRUPTIONS = {
    # name: (damage(checkpoint path, monkeypatch), regex the error must match, needs slot files)
    "flipped-weight-byte": (
        lambda p, m: flip_byte(f"{p}/emb_0-weight", 296 + 4 * DIM * STREAM_ROWS // 2 + 1),
        r"emb_0-weight.*checksum",
        False,
    ),
    "flipped-slot-byte": (
        lambda p, m: flip_byte(f"{p}/emb_0-Adam-v", 296 + 4 * DIM * STREAM_ROWS // 2 + 1),
        r"emb_0-Adam-v.*checksum",
        True,
    ),
    "truncated-weight-while-read": (
        lambda p, m: truncate_while_read(m, f"{p}/emb_0-weight"),
        r"emb_0-weight.*truncated",
        False,
    ),
    "truncated-slot-while-read": (
        lambda p, m: truncate_while_read(m, f"{p}/emb_0-Adam-m"),
        r"emb_0-Adam-m.*truncated",
        True,
    ),
}


@pytest.mark.parametrize("var_type", VAR_TYPES)
@pytest.mark.parametrize("corruption", list(FILL_CORRUPTIONS))
def test_corrupt_file_while_filling_leaves_the_table_empty_and_usable(tmp_path, monkeypatch, corruption, var_type):
    path, (saved,) = streaming_checkpoint(tmp_path, var_type)
    good = str(tmp_path / "good")
    shutil.copytree(path, good)
    monkeypatch.setattr(fmt, "READ_CHUNK", SMALL_CHUNK)
    damage, message, attached = FILL_CORRUPTIONS[corruption]
    damage(path, monkeypatch)
    fresh, wrapper = empty_var(var_type, attached=attached)
    table = fresh.storage
    with pytest.raises(fmt.CheckpointError, match=message):
        sok.load(path, fresh, wrapper)
    assert fresh.storage is table and table.size() == 0
    if attached:
        assert int(wrapper.iterations.numpy()) == 0
    sok.load(good, fresh, wrapper)  # and a good checkpoint loads into it
    assert_state_equal(state(fresh, wrapper), saved if attached else weights_only(saved))


@pytest.mark.parametrize("error", [Killed, KeyboardInterrupt])
@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_insert_error_while_filling_propagates_and_leaves_the_table_empty(tmp_path, monkeypatch, var_type, error):
    path, (saved,) = streaming_checkpoint(tmp_path, var_type)
    monkeypatch.setattr(fmt, "READ_CHUNK", SMALL_CHUNK)
    fresh, _ = empty_var(var_type)
    real = fresh.storage.insert_or_assign
    count = {"n": 0}

    def failing(*args, **kwargs):
        count["n"] += 1
        if count["n"] > 4:
            raise error("simulated failure")
        return real(*args, **kwargs)

    monkeypatch.setattr(fresh.storage, "insert_or_assign", failing)
    with pytest.raises(error):
        sok.load(path, fresh)
    assert count["n"] == 5  # no chunk was inserted after the failure
    assert fresh.storage.size() == 0
    monkeypatch.undo()
    sok.load(path, fresh)
    assert_state_equal(state(fresh), weights_only(saved))


@pytest.mark.parametrize("second", ["empty", "holding-rows"])
@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_corrupt_second_table_clears_the_first_table_filled_while_reading(tmp_path, monkeypatch, var_type, second):
    path, _ = streaming_checkpoint(tmp_path, var_type, names=("first", "second"))
    monkeypatch.setattr(fmt, "READ_CHUNK", SMALL_CHUNK)
    flip_byte(f"{path}/second_0-weight", 296 + 4 * DIM * STREAM_ROWS // 2 + 1)
    calls = spy_streams(monkeypatch)
    first = make_var(var_type, "first")
    other = filled_var(var_type, "second") if second == "holding-rows" else make_var(var_type, "second")
    before = state(other)
    with pytest.raises(fmt.CheckpointError, match=r"second_0-weight.*checksum"):
        sok.load(path, [first, other])
    assert calls[0] == ("first_0-weight", CHUNK_SIZES)  # the first table was filled, then cleared
    assert first.storage.size() == 0
    assert_state_equal(state(other), before)  # empty (cleared too), or its rows untouched


def test_tables_that_hold_rows_or_need_optimizer_columns_are_staged(tmp_path, monkeypatch):
    path, _ = streaming_checkpoint(tmp_path, "hbm")
    calls = spy_streams(monkeypatch)
    sok.load(path, filled_var("hbm"))  # holds rows
    sok.load(path, make_var("hbm"), sok.OptimizerWrapper(K.Adam(learning_rate=0.05)))  # to be widened
    assert calls == []
    sok.load(path, make_var("hbm"), sok.OptimizerWrapper(K.Adam(learning_rate=0.05)))
    assert calls == []
    sok.load(path, make_var("hbm"))  # empty, weights only: filled while reading
    assert [name for name, _ in calls] == ["emb_0-weight"]


# -- incremental_model_dump (§1.11) ---------------------------------------------------------------
def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def pause() -> None:
    time.sleep(0.005)


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_incremental_dump_returns_rows_written_after_threshold(var_type):
    v, wrapper = make_var(var_type), sok.OptimizerWrapper(K.Adagrad(learning_rate=0.1))
    sok.assign(v, tf.range(V, dtype=tf.int64), INITIAL)  # phase 0: keys 0..7, and a first step
    train_step(v, wrapper, [0])  # (it gives the rows their optimizer columns; see the next test)
    pause()
    t1 = now()
    pause()
    train_step(v, wrapper, [1, 2, 2, 20])  # phase 1: trains 1, 2 and inserts 20
    pause()
    t2 = now()
    pause()
    sok.assign(v, tf.constant([5, 30], tf.int64), np.full((2, DIM), 9.0, np.float32))  # phase 2
    pause()
    t3 = now()

    all_keys, all_rows = weights(v)
    for threshold, expected in [(t1, [1, 2, 5, 20, 30]), (t2, [5, 30]), (t3, [])]:
        keys_list, values_list = sok.incremental_model_dump(v, threshold)
        assert len(keys_list) == len(values_list) == 1
        keys, values = by_key(keys_list[0], values_list[0])
        np.testing.assert_array_equal(keys, expected)
        assert values.shape == (len(expected), DIM)
        np.testing.assert_array_equal(values, all_rows[np.searchsorted(all_keys, keys)])
    keys_list, _ = sok.incremental_model_dump(v, dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc))
    np.testing.assert_array_equal(np.sort(keys_list[0]), all_keys)  # every row


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_incremental_dump_after_first_optimizer_step_has_only_trained_keys(var_type):
    v = filled_var(var_type)
    pause()
    t1 = now()
    pause()
    train_step(v, sok.OptimizerWrapper(K.Adagrad(learning_rate=0.1)), [1, 2])
    keys_list, _ = sok.incremental_model_dump(v, t1)
    np.testing.assert_array_equal(np.sort(keys_list[0]), [1, 2])


def test_incremental_dump_several_variables_and_thresholds():
    det, hkv = make_var("hbm", name="a"), make_var("hybrid", name="b")
    sok.assign(det, tf.constant([1, 2], tf.int64), np.ones((2, DIM), np.float32))
    pause()
    t1 = now()
    pause()
    sok.assign(hkv, tf.constant([3, 4], tf.int64), np.ones((2, DIM), np.float32))
    sok.assign(det, tf.constant([5], tf.int64), np.ones((1, DIM), np.float32))
    pause()
    t2 = now()
    pause()
    sok.assign(hkv, tf.constant([6], tf.int64), np.ones((1, DIM), np.float32))

    keys_list, values_list = sok.incremental_model_dump([det, hkv], [t1, t2])
    assert [sorted(k.tolist()) for k in keys_list] == [[5], [6]]
    assert [v.shape for v in values_list] == [(1, DIM), (1, DIM)]
    keys_list, _ = sok.incremental_model_dump([det, hkv], [t1])  # one threshold for all
    assert [sorted(k.tolist()) for k in keys_list] == [[5], [3, 4, 6]]
    keys_list, _ = sok.incremental_model_dump([det, hkv], t2)
    assert [sorted(k.tolist()) for k in keys_list] == [[], [6]]


def test_incremental_dump_argument_errors():
    det = make_var("hbm")
    static = sok.Variable(static_values(), dtype=tf.float32, name="static")
    with pytest.raises(TypeError, match="variable 1 is a .*DynamicVariable"):
        sok.incremental_model_dump([det, static], now())
    with pytest.raises(TypeError, match="DynamicVariable"):
        sok.incremental_model_dump(tf.Variable([[1.0]]), now())
    with pytest.raises(ValueError, match="time_threshold has 3 entries"):
        sok.incremental_model_dump([det, make_var("hybrid", name="b")], [now()] * 3)
    with pytest.raises(TypeError, match="datetime"):
        sok.incremental_model_dump(det, 12345)
    with pytest.raises(ValueError, match="sess"):
        sok.incremental_model_dump(det, now(), sess=object())


# -- the sok ckpt command ---------------------------------------------------------------------------
def cli_checkpoint(tmp_path):
    dyn, wrapper = filled_var("hybrid", name="dyn"), sok.OptimizerWrapper(K.Adagrad(learning_rate=0.1))
    train_step(dyn, wrapper, STEP_IDS[0])
    static = sok.Variable(static_values(), dtype=tf.float32, name="static")
    path = str(tmp_path / "ckpt")
    sok.dump(path, [dyn, static], wrapper)
    return path, dyn, static


def test_cli_inspect(tmp_path, capsys):
    path, dyn, static = cli_checkpoint(tmp_path)
    assert cli_main(["ckpt", "inspect", path, "--json"]) == 0
    out = capsys.readouterr().out
    assert "written by 1 rank(s), optimizer Adagrad, step 1" in out
    assert f"dyn_0: {V} rows x {DIM} (int64 keys); state dyn_0-Adagrad-accumulator" in out
    assert f"static_0: {STATIC_ROWS:,} rows x {DIM} (int64 keys)" in out
    assert "checksums: verified" in out
    info = json.loads(out[out.index("{") :])
    assert info["tables"]["dyn_0"] == {
        "rows": V,
        "dim": DIM,
        "key_dtype": "int64",
        "dtype": "float32",
        "state_files": ["dyn_0-Adagrad-accumulator"],
    }
    assert info == json.loads(json.dumps(ckpt_inspect(path), default=str))

    flip_byte(os.path.join(path, "static_0-weight"), 320)
    assert cli_main(["ckpt", "inspect", path]) == 2
    err = capsys.readouterr().err
    assert "CheckpointError" in err and "static_0-weight" in err and "checksum" in err
    assert cli_main(["ckpt", "inspect", path, "--no-verify"]) == 0
    assert "checksums: not checked" in capsys.readouterr().out


def test_cli_inspect_nvidia_checkpoint_and_missing_path(tmp_path, capsys):
    nvidia_table(str(tmp_path), "emb_0", np.arange(3, dtype=np.uint64), np.ones((3, 2), np.float32))
    assert cli_main(["ckpt", "inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "no manifest: NVIDIA SOK layout" in out and "emb_0: 3 rows x 2 (uint64 keys)" in out
    assert cli_main(["ckpt", "inspect", str(tmp_path / "nothing")]) == 2
    assert "no checkpoint directory" in capsys.readouterr().err


def test_dumped_manifest_is_the_schemas_json(tmp_path):
    """manifest.json is checkpoint.format.Manifest's JSON, field for field and byte for byte."""
    path, _, _ = cli_checkpoint(tmp_path)
    raw = (tmp_path / "ckpt" / fmt.MANIFEST).read_bytes()
    manifest = fmt.read_manifest(path)
    assert manifest.to_json().encode() == raw
    assert set(json.loads(raw)) == {"format_version", "world_size", "optimizer", "step", "optimizer_step", "tables"}
    assert (manifest.world_size, manifest.optimizer, manifest.step) == (1, "Adagrad", 1)
    assert manifest.tables["dyn_0"].slots == ["accumulator"] and manifest.tables["static_0"].kind == "static"
    assert set(manifest.tables["dyn_0"].crc32) == {"dyn_0-key", "dyn_0-weight", "dyn_0-Adagrad-accumulator"}
