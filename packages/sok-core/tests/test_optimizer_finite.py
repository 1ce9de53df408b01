"""sok.OptimizerWrapper(check_finite=True): NaN and Inf gradients raise, naming the variable, before
any variable of the call changes; finite gradients train exactly as without the check.

The oracle of "unchanged" is the state read before the failing call (embedding rows, optimizer
slots, step counters); the oracle of the finite path is the wrapped Keras optimizer on a plain
``tf.Variable`` (as in test_optimizer_wrapper.py) and the same wrapper without the check.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
import sparse_operation_kit as sok  # noqa: E402

VAR_TYPES = ["hbm", "hybrid"]
OPTIONS = {"hbm": {}, "hybrid": {"init_capacity": 1024, "max_capacity": 1 << 16}}
MODES = ["eager", "function"]
K = tf.keras.optimizers
#: Adagrad runs natively on CPU tables (SokSparseApply), Adam through TensorFlow ops: both paths.
OPTIMIZERS = {"Adagrad": lambda: K.Adagrad(learning_rate=0.1), "Adam": lambda: K.Adam(learning_rate=0.05)}

V, D = 6, 4
INITIAL = np.random.default_rng(0).uniform(-1.0, 1.0, (V, D)).astype(np.float32)
KEYS = tf.constant([0, 2, 3, 0, 5], tf.int64)  # 0 twice
GRADS = np.random.default_rng(1).normal(size=(5, D)).astype(np.float32)


def sorted_rows(var) -> tuple[np.ndarray, np.ndarray]:
    keys, values = sok.export(var)
    order = np.argsort(keys.numpy(), kind="stable")
    return keys.numpy()[order], values.numpy()[order]


def sorted_slots(wrapper, var) -> dict[str, np.ndarray]:
    out = {}
    for name in wrapper.get_slot_names():
        keys, values = wrapper.get_slot(var, name)
        out[name] = values.numpy()[np.argsort(keys.numpy(), kind="stable")]
    return out


class Model:
    """A dynamic table, a static sok.Variable and the wrapper over both; ``step`` applies one
    gradient to each (IndexedSlices over KEYS), eagerly or as a tf.function."""

    def __init__(self, var_type: str, optimizer: str, mode: str, check_finite: bool = True) -> None:
        self.dynamic = sok.DynamicVariable(
            dimension=D, var_type=var_type, initializer="zeros", name="dyn", **OPTIONS[var_type]
        )
        sok.assign(self.dynamic, tf.range(V, dtype=tf.int64), INITIAL)
        self.static = sok.Variable(INITIAL, dtype=tf.float32, name="static")
        self.wrapper = sok.OptimizerWrapper(OPTIMIZERS[optimizer](), check_finite=check_finite)

        def step(dynamic_grad, static_grad):
            self.wrapper.apply_gradients(
                [
                    (tf.IndexedSlices(static_grad, KEYS, tf.constant([V, D], tf.int64)), self.static),
                    (tf.IndexedSlices(dynamic_grad, KEYS), self.dynamic),
                ]
            )

        self.step = tf.function(step) if mode == "function" else step

    def state(self) -> dict[str, np.ndarray]:
        keys, rows = sorted_rows(self.dynamic)
        out = {"keys": keys, "rows": rows, "static": self.static.numpy()}
        out.update({f"dynamic {k}": v for k, v in sorted_slots(self.wrapper, self.dynamic).items()})
        for name, slot in self.wrapper.static_slots(self.static).items():
            out[f"static {name}"] = slot.numpy()
        out["iterations"] = self.wrapper.iterations.numpy()
        out["keras iterations"] = self.wrapper.optimizer.iterations.numpy()
        return out


def poisoned(value: float) -> np.ndarray:
    grads = GRADS.copy()
    grads[3, 1] = value  # key 0's second occurrence
    return grads


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
@pytest.mark.parametrize("var_type", VAR_TYPES)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("where", ["dynamic", "static"])
def test_non_finite_gradient_raises_naming_the_variable_and_changes_nothing(where, bad, var_type, optimizer, mode):
    model = Model(var_type, optimizer, mode)
    model.step(GRADS, GRADS)  # a finite step first: optimizer state exists and has moved
    before = model.state()
    dynamic, static = (poisoned(bad), GRADS) if where == "dynamic" else (GRADS, poisoned(bad))
    name = (model.dynamic if where == "dynamic" else model.static).name
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"gradient of {re.escape(name)} is not finite") as e:
        model.step(dynamic, static)
    assert ("NaN" if np.isnan(bad) else "Inf") in str(e.value)
    after = model.state()
    assert after.keys() == before.keys()
    for key in before:
        np.testing.assert_array_equal(after[key], before[key], err_msg=key)
    model.step(GRADS, GRADS)  # the wrapper still trains after the refused call
    assert int(model.wrapper.iterations.numpy()) == int(before["iterations"]) + 1


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_finite_gradients_train_as_without_the_check_and_as_keras(var_type, optimizer, mode):
    checked = Model(var_type, optimizer, mode, check_finite=True)
    unchecked = Model(var_type, optimizer, mode, check_finite=False)
    dense, keras = tf.Variable(INITIAL), OPTIMIZERS[optimizer]()
    # The static table's oracle: Keras given the same IndexedSlices (its own sparse path).
    sparse, sparse_keras = tf.Variable(INITIAL), OPTIMIZERS[optimizer]()
    rng = np.random.default_rng(2)
    for _ in range(4):
        grads = rng.normal(size=(5, D)).astype(np.float32)
        checked.step(grads, grads)
        unchecked.step(grads, grads)
        # Densified (duplicate keys summed) as in test_optimizer_wrapper.py.
        keras.apply_gradients([(tf.math.unsorted_segment_sum(grads, KEYS, V), dense)])
        sparse_keras.apply_gradients([(tf.IndexedSlices(tf.constant(grads), KEYS, tf.constant([V, D])), sparse)])
    with_check, without_check = checked.state(), unchecked.state()
    for key in without_check:
        np.testing.assert_array_equal(with_check[key], without_check[key], err_msg=key)
    keys, rows = sorted_rows(checked.dynamic)
    assert keys.tolist() == list(range(V))
    assert np.abs(dense.numpy() - INITIAL).max() > 1e-3  # the oracle did move
    np.testing.assert_allclose(rows, dense.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(checked.static.numpy(), sparse.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("var_type", VAR_TYPES)
def test_without_the_check_a_nan_gradient_reaches_the_table(var_type):
    # The default, as plain Keras: documents what check_finite guards against.
    model = Model(var_type, "Adagrad", "eager", check_finite=False)
    model.step(poisoned(np.nan), GRADS)
    _, rows = sorted_rows(model.dynamic)
    assert np.isnan(rows[0]).any()
    assert not np.isnan(rows[1]).any()  # key 1 had no gradient


def test_check_finite_must_be_a_bool():
    with pytest.raises(TypeError, match=r"check_finite must be True or False, got 'yes'"):
        sok.OptimizerWrapper(K.SGD(0.1), check_finite="yes")
    assert sok.OptimizerWrapper(K.SGD(0.1), check_finite=True).check_finite
    assert not sok.OptimizerWrapper(K.SGD(0.1)).check_finite
