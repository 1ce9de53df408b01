"""What NVIDIA's own dump/load scripts expect of optimizers and checkpoints. Reference §1.3, §1.9, §1.10.

* Optimizer state of dynamic variables, seen through the wrapped tf_keras legacy optimizer as NVIDIA
  SOK exposes it: ``optimizer.get_slot_names()``, ``optimizer._slots[var._unique_id]`` and
  ``optimizer.get_slot(var, name)``, which ``sok.export`` / ``sok.assign`` read and write (a
  ``DynamicSlot``: the slot's columns of the variable's rows). Oracles: the same legacy optimizer on
  a dense ``tf.Variable`` (its slot names, its slot values after the same step), and the wrapper's
  own ``get_slot``.
* The wrapped optimizer keeps working for dense variables (``variables()``, tf.train.Checkpoint).
* Unnamed DynamicVariables are named ``sok_dynamic_Variable_<n>`` (counted apart from static ones)
  and dump side by side.
* ``sok.dump`` / ``sok.load`` take the Keras optimizer itself: the files equal those written with the
  wrapper; static tables' state round-trips; state with no wrapper to hold it is refused.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
tf_keras = pytest.importorskip("tf_keras")
import sparse_operation_kit as sok  # noqa: E402
from sparse_operation_kit.slot_view import DynamicSlot  # noqa: E402

L = tf_keras.optimizers.legacy
DIM = 3
IDS = [5, 1, 9, 2**40]  # distinct: the dense oracle sums nothing
INITIAL = 0.25

#: NVIDIA's dump/load scripts' optimizers (tf_keras legacy), plus RMSprop's three slot layouts.
LEGACY = {
    "SGD": lambda: L.SGD(learning_rate=0.1),
    "SGD-momentum": lambda: L.SGD(learning_rate=0.1, momentum=0.9),
    "Adamax": lambda: L.Adamax(learning_rate=0.1, beta_1=0.9, beta_2=0.999),
    "Adadelta": lambda: L.Adadelta(learning_rate=1.0),
    "Adagrad": lambda: L.Adagrad(learning_rate=0.1),
    "Ftrl": lambda: L.Ftrl(learning_rate=0.1),
    "Adam": lambda: L.Adam(learning_rate=0.1),
    "RMSprop": lambda: L.RMSprop(learning_rate=0.1),
    "RMSprop-centered-momentum": lambda: L.RMSprop(learning_rate=0.1, momentum=0.9, centered=True),
}


def legacy_slot_names(make) -> list[str]:
    """The oracle: the slot names the legacy optimizer gives itself for a dense variable."""
    opt = make()
    opt._create_slots([tf.Variable(tf.zeros([2, DIM]))])
    return opt.get_slot_names()


def loss_of(rows: tf.Tensor) -> tf.Tensor:
    w = tf.reshape(tf.linspace(0.5, 2.0, tf.shape(rows)[0]), [-1, 1])
    return tf.reduce_sum(w * tf.square(rows - 0.3))


def dynamic_step(var, wrapper, ids=IDS) -> None:
    with tf.GradientTape() as tape:
        loss = loss_of(tf.nn.embedding_lookup(var, tf.constant(ids, tf.int64)))
    wrapper.apply_gradients(zip(tape.gradient(loss, [var]), [var]))


def trained(name: str, var_name: str | None = None):
    """A fresh legacy optimizer, its wrapper and a dynamic variable it updated once."""
    opt = LEGACY[name]()
    wrapper = sok.OptimizerWrapper(opt)
    v = sok.DynamicVariable(dimension=DIM, initializer=str(INITIAL), name=var_name)
    dynamic_step(v, wrapper)
    return opt, wrapper, v


def by_key(keys, values) -> tuple[np.ndarray, np.ndarray]:
    keys, values = np.asarray(keys), np.asarray(values)
    order = np.argsort(keys)
    return keys[order], values[order]


# -- 1. optimizer state of dynamic variables through the wrapped optimizer ------------------------


@pytest.mark.parametrize("name", list(LEGACY))
def test_wrapped_legacy_optimizer_lists_its_own_slot_names_once_wrapped(name):
    opt = LEGACY[name]()
    sok.OptimizerWrapper(opt)
    assert opt.get_slot_names() == legacy_slot_names(LEGACY[name])


@pytest.mark.parametrize("name", list(LEGACY))
def test_slots_of_the_wrapped_optimizer_hold_the_dynamic_variable_after_a_step(name):
    opt, _, v = trained(name)
    slots = opt._slots.get(v._unique_id)
    assert slots is not None
    assert sorted(slots) == sorted(legacy_slot_names(LEGACY[name]))
    assert all(isinstance(slot, DynamicSlot) and slot.variable is v for slot in slots.values())


@pytest.mark.parametrize("name", [n for n in LEGACY if n != "SGD"])
def test_get_slot_of_the_wrapped_optimizer_exports_what_a_dense_variable_gets(name):
    opt, _, v = trained(name)
    dense = tf.Variable(tf.fill([len(IDS), DIM], INITIAL))
    oracle = LEGACY[name]()
    with tf.GradientTape() as tape:
        loss = loss_of(tf.gather(dense, tf.range(len(IDS))))
    oracle.apply_gradients(zip(tape.gradient(loss, [dense]), [dense]))
    order = np.argsort(IDS)
    for slot_name in opt.get_slot_names():
        keys, values = sok.export(opt.get_slot(v, slot_name))
        keys, values = by_key(keys.numpy(), values.numpy())
        np.testing.assert_array_equal(keys, np.sort(IDS))
        expected = oracle.get_slot(dense, slot_name).numpy()[order]
        np.testing.assert_allclose(values, expected, rtol=1e-5, atol=1e-6, err_msg=slot_name)
    keys, weights = by_key(*(t.numpy() for t in sok.export(v)))
    np.testing.assert_allclose(weights, dense.numpy()[order], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["Adamax", "Ftrl", "RMSprop-centered-momentum"])
def test_get_slot_of_the_wrapped_optimizer_is_the_wrappers_slot_under_the_legacy_name(name):
    opt, wrapper, v = trained(name)
    for ours, legacy in zip(wrapper.get_slot_names(), opt.get_slot_names()):
        expected = by_key(*(t.numpy() for t in wrapper.get_slot(v, ours)))
        got = by_key(*(t.numpy() for t in sok.export(opt.get_slot(v, legacy))))
        np.testing.assert_array_equal(got[0], expected[0])
        np.testing.assert_array_equal(got[1], expected[1])
        assert wrapper.slot_view(v, ours) is opt.get_slot(v, legacy)


def test_sgd_without_momentum_has_an_empty_slot_entry():
    opt, wrapper, v = trained("SGD")
    assert opt._slots.get(v._unique_id) == {}
    assert opt.get_slot_names() == wrapper.get_slot_names() == []


def test_assign_to_a_slot_writes_only_its_columns():
    opt, _, v = trained("Ftrl")
    weights = by_key(*(t.numpy() for t in sok.export(v)))
    linear = by_key(*(t.numpy() for t in sok.export(opt.get_slot(v, "linear"))))
    accumulator = opt.get_slot(v, "accumulator")
    keys, _ = sok.export(accumulator)
    new = np.arange(keys.shape[0] * DIM, dtype=np.float32).reshape(-1, DIM)
    assert sok.assign(accumulator, keys, new) is accumulator
    got = by_key(*(t.numpy() for t in sok.export(accumulator)))
    np.testing.assert_array_equal(got[1], by_key(keys.numpy(), new)[1])
    for before, after in [(weights, sok.export(v)), (linear, sok.export(opt.get_slot(v, "linear")))]:
        after = by_key(*(t.numpy() for t in after))
        np.testing.assert_array_equal(after[0], before[0])
        np.testing.assert_array_equal(after[1], before[1])


def test_assign_to_a_slot_checks_the_width():
    opt, _, v = trained("Adagrad")
    with pytest.raises(ValueError, match=rf"shape \[N, {DIM}\]"):
        sok.assign(opt.get_slot(v, "accumulator"), tf.constant([1], tf.int64), tf.zeros([1, DIM + 1]))


def test_export_of_something_else_names_what_it_takes():
    with pytest.raises(TypeError, match="DynamicVariable or one of its optimizer slots.*got ResourceVariable"):
        sok.export(tf.Variable([[1.0]]))


@pytest.mark.parametrize("make", [lambda: tf.keras.optimizers.Adam(0.1), lambda: tf_keras.optimizers.Adam(0.1)])
def test_slot_view_of_the_other_flavours_is_the_wrappers_slot(make):
    wrapper = sok.OptimizerWrapper(make())
    v = sok.DynamicVariable(dimension=DIM, initializer=str(INITIAL))
    dynamic_step(v, wrapper)
    assert set(wrapper._slots[v._unique_id]) == {"m", "v"}
    for name in ("m", "v"):
        expected = by_key(*(t.numpy() for t in wrapper.get_slot(v, name)))
        got = by_key(*(t.numpy() for t in sok.export(wrapper.slot_view(v, name))))
        np.testing.assert_array_equal(got[1], expected[1])


def test_slot_view_of_an_unknown_slot_names_the_valid_ones():
    _, wrapper, v = trained("Adamax")
    with pytest.raises(ValueError, match=r"no slot 'w'; valid: \['m', 'u', 'v'\]"):
        wrapper.slot_view(v, "w")


def test_the_wrapped_optimizer_still_trains_and_checkpoints_dense_variables(tmp_path):
    opt, wrapper, v = trained("Adagrad")
    oracle = L.Adagrad(learning_rate=0.1)
    dense, dense_oracle = tf.Variable([[1.0, 2.0]]), tf.Variable([[1.0, 2.0]])
    for var, optimizer in [(dense, wrapper), (dense_oracle, oracle)]:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(var))
        optimizer.apply_gradients(zip(tape.gradient(loss, [var]), [var]))
    np.testing.assert_array_equal(dense.numpy(), dense_oracle.numpy())
    assert [w.shape for w in opt.variables()] == [w.shape for w in oracle.variables()]
    saved = opt.get_slot(dense, "accumulator").numpy()
    path = tf.train.Checkpoint(optimizer=opt, dense=dense).save(str(tmp_path / "ckpt"))
    opt.get_slot(dense, "accumulator").assign(tf.zeros_like(saved))
    tf.train.Checkpoint(optimizer=opt, dense=dense).restore(path).assert_consumed()
    np.testing.assert_array_equal(opt.get_slot(dense, "accumulator").numpy(), saved)


def test_tf_checkpoint_of_a_dynamic_slot_points_to_sok_dump(tmp_path):
    opt, _, v = trained("Adagrad")
    with pytest.raises(NotImplementedError, match="sok.dump"):
        tf.train.Checkpoint(optimizer=opt, table=v).save(str(tmp_path / "ckpt"))


# -- 2. names of unnamed DynamicVariables ---------------------------------------------------------


def test_unnamed_dynamic_variables_are_numbered_apart_from_static_ones():
    first = sok.DynamicVariable(dimension=DIM)
    sok.Variable(np.zeros((2, DIM), np.float32))
    second = sok.DynamicVariable(dimension=DIM)
    n = int(re.fullmatch(r"sok_dynamic_Variable_(\d+):0", first.name).group(1))
    assert second.name == f"sok_dynamic_Variable_{n + 1}:0"
    assert sok.DynamicVariable(dimension=DIM, name="table").name == "table:0"
    assert sok.DynamicVariable(dimension=DIM).name == f"sok_dynamic_Variable_{n + 2}:0"


def test_two_unnamed_dynamic_variables_dump_and_load_side_by_side(tmp_path):
    variables = [sok.DynamicVariable(dimension=DIM, initializer=str(i)) for i in (1, 2)]
    for v in variables:
        tf.nn.embedding_lookup(v, tf.constant([3, 4], tf.int64))
    sok.dump(str(tmp_path / "ckpt"), variables)
    for v in variables:
        table = v.name.replace(":", "_")
        assert os.path.exists(tmp_path / "ckpt" / f"{table}-key")
    fresh = [sok.DynamicVariable(dimension=DIM, name=v.name.split(":")[0]) for v in variables]
    sok.load(str(tmp_path / "ckpt"), fresh)
    for v, f in zip(variables, fresh):
        np.testing.assert_array_equal(by_key(*sok.export(f))[1], by_key(*sok.export(v))[1])


# -- 3. sok.dump / sok.load given the Keras optimizer ---------------------------------------------


def files_of(path) -> dict[str, bytes]:
    return {name: (path / name).read_bytes() for name in sorted(os.listdir(path)) if name != "manifest.json"}


@pytest.mark.parametrize(
    "make",
    [lambda: L.Adamax(0.1), lambda: tf_keras.optimizers.Adagrad(0.1), lambda: tf.keras.optimizers.Ftrl(0.1)],
    ids=["tf_keras legacy", "tf_keras", "Keras 3"],
)
def test_dump_with_the_keras_optimizer_writes_what_its_wrapper_writes(tmp_path, make):
    opt = make()
    wrapper = sok.OptimizerWrapper(opt)
    v = sok.DynamicVariable(dimension=DIM, initializer=str(INITIAL), name="dyn")
    for _ in range(2):
        dynamic_step(v, wrapper)
    sok.dump(str(tmp_path / "by_wrapper"), v, wrapper)
    sok.dump(str(tmp_path / "by_optimizer"), [v], [opt])
    assert files_of(tmp_path / "by_optimizer") == files_of(tmp_path / "by_wrapper")
    manifests = [json.loads((tmp_path / d / "manifest.json").read_text()) for d in ("by_wrapper", "by_optimizer")]
    assert manifests[1]["step"] == manifests[0]["step"] == 2
    assert manifests[1]["tables"]["dyn_0"]["slots"] == wrapper.get_slot_names() != []


def test_load_with_the_keras_optimizer_restores_the_wrappers_state_and_step(tmp_path):
    opt, wrapper, v = trained("Adadelta", var_name="dyn")
    saved = {name: by_key(*(t.numpy() for t in wrapper.get_slot(v, name))) for name in wrapper.get_slot_names()}
    sok.dump(str(tmp_path / "ckpt"), v, opt)
    dynamic_step(v, wrapper, ids=[7, 8])
    fresh_opt = LEGACY["Adadelta"]()
    fresh_wrapper = sok.OptimizerWrapper(fresh_opt)
    fresh = sok.DynamicVariable(dimension=DIM, initializer="0", name="dyn")
    sok.load(str(tmp_path / "ckpt"), fresh, fresh_opt)
    assert int(fresh_wrapper.iterations.numpy()) == 1
    for name, (keys, values) in saved.items():
        got = by_key(*(t.numpy() for t in sok.export(fresh_wrapper.slot_view(fresh, name))))
        np.testing.assert_array_equal(got[0], keys)
        np.testing.assert_array_equal(got[1], values)
    assert fresh_opt._slots[fresh._unique_id] == fresh_wrapper._slot_views[fresh._unique_id]


@pytest.mark.parametrize("make", [lambda: L.Adagrad(0.1), lambda: tf.keras.optimizers.Adam(0.1)], ids=["legacy", "3"])
def test_static_table_state_round_trips_with_a_keras_optimizer_no_wrapper_wraps(tmp_path, make):
    opt = make()
    v = sok.Variable(np.full((6, DIM), INITIAL, np.float32), name="static")
    with tf.GradientTape() as tape:
        loss = loss_of(tf.gather(v, tf.constant([0, 2, 3])))
    opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
    slots = sok.OptimizerWrapper.for_static_state(opt).static_slots(v)
    assert slots, "the optimizer holds state of the static table"
    saved = {name: slot.numpy() for name, slot in slots.items()}
    weights = v.numpy()
    sok.dump(str(tmp_path / "ckpt"), v, opt)
    manifest = json.loads((tmp_path / "ckpt" / "manifest.json").read_text())
    assert manifest["step"] is None and manifest["optimizer_step"] == 1
    v.assign(np.zeros_like(weights))
    for slot in slots.values():
        slot.assign(tf.zeros_like(slot))
    sok.load(str(tmp_path / "ckpt"), v, opt)
    np.testing.assert_array_equal(v.numpy(), weights)
    for name, slot in slots.items():
        np.testing.assert_array_equal(slot.numpy(), saved[name], err_msg=name)


def test_load_of_dynamic_state_with_an_optimizer_no_wrapper_wraps_is_refused(tmp_path):
    opt, wrapper, v = trained("Adagrad", var_name="dyn")
    sok.dump(str(tmp_path / "ckpt"), v, wrapper)
    fresh = sok.DynamicVariable(dimension=DIM, initializer="0", name="dyn")
    with pytest.raises(ValueError, match="none wraps Adagrad; create it first"):
        sok.load(str(tmp_path / "ckpt"), fresh, L.Adagrad(0.1))
    assert int(fresh.size[0]) == 0


def test_dump_of_variables_of_two_wrappers_of_one_optimizer_is_refused(tmp_path):
    opt = L.Adagrad(0.1)
    variables = []
    for name in ("a", "b"):
        variables.append(sok.DynamicVariable(dimension=DIM, name=name))
        dynamic_step(variables[-1], sok.OptimizerWrapper(opt))
    with pytest.raises(ValueError, match="2 different sok.OptimizerWrappers of Adagrad"):
        sok.dump(str(tmp_path / "ckpt"), variables, opt)
    assert not os.path.exists(tmp_path / "ckpt")


def test_dump_with_something_else_than_an_optimizer_names_what_it_takes(tmp_path):
    v = sok.DynamicVariable(dimension=DIM, name="dyn")
    with pytest.raises(TypeError, match="sok.OptimizerWrapper or a Keras optimizer.*got str 'adam'"):
        sok.dump(str(tmp_path / "ckpt"), v, "adam")
