"""sok.OptimizerWrapper over tf_keras (Keras 2) optimizers: tf_keras.optimizers.* and .legacy.*.

The oracle is the wrapped tf_keras optimizer itself, applied to a plain ``tf.Variable`` holding the
same rows (as in test_optimizer_wrapper.py, whose data and helpers this module reuses). Every row
is touched at every step there, so tf_keras' dense update and the wrapper's lazy one must agree,
with tf_keras' own formulas (legacy Adagrad and RMSprop place epsilon differently from Keras 3).
"""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
tf_keras = pytest.importorskip("tf_keras")
import sparse_operation_kit as sok  # noqa: E402
from test_optimizer_wrapper import (  # noqa: E402 (helpers and data of the Keras-3 oracle tests)
    IDS,
    INITIAL,
    MODES,
    STEPS,
    VAR_TYPES,
    D,
    V,
    check_learning_rate_change_after_tracing_is_followed,
    check_learning_rate_schedule_is_followed,
    check_untouched_rows_stay_bit_identical,
    compiled,
    exported,
    make_var,
    weighted_square_loss,
)

FLAVORS = {"tf_keras": tf_keras.optimizers, "legacy": tf_keras.optimizers.legacy}


def _configurations(k) -> dict:
    """The settings every flavour is tested with: ``name -> () -> optimizer`` of module ``k``."""
    return {
        "SGD": lambda: k.SGD(learning_rate=0.1),
        "SGD-momentum": lambda: k.SGD(learning_rate=0.1, momentum=0.9),
        "SGD-nesterov": lambda: k.SGD(learning_rate=0.1, momentum=0.9, nesterov=True),
        "Adagrad": lambda: k.Adagrad(learning_rate=0.1),
        "Adagrad-custom": lambda: k.Adagrad(learning_rate=0.2, initial_accumulator_value=0.5, epsilon=1e-3),
        "Adam": lambda: k.Adam(learning_rate=0.05),
        "Adam-epsilon": lambda: k.Adam(learning_rate=0.05, beta_1=0.8, beta_2=0.9, epsilon=0.1),
        "Adam-amsgrad": lambda: k.Adam(learning_rate=0.05, amsgrad=True),
        "Adamax": lambda: k.Adamax(learning_rate=0.05),
        "Adamax-custom": lambda: k.Adamax(learning_rate=0.05, beta_1=0.8, beta_2=0.9, epsilon=0.1),
        "Adadelta": lambda: k.Adadelta(learning_rate=1.0),
        "Adadelta-custom": lambda: k.Adadelta(learning_rate=1.0, rho=0.8, epsilon=1e-3),
        "Ftrl": lambda: k.Ftrl(learning_rate=0.1),
        "Ftrl-regularized": lambda: k.Ftrl(
            learning_rate=0.1,
            learning_rate_power=-0.7,
            initial_accumulator_value=0.2,
            l1_regularization_strength=0.01,
            l2_regularization_strength=0.01,
            l2_shrinkage_regularization_strength=0.01,
            beta=0.1,
        ),
        "RMSprop": lambda: k.RMSprop(learning_rate=0.01),
        "RMSprop-epsilon": lambda: k.RMSprop(learning_rate=0.01, rho=0.8, epsilon=0.1),
        "RMSprop-centered": lambda: k.RMSprop(learning_rate=0.01, centered=True, epsilon=0.1),
        "RMSprop-momentum": lambda: k.RMSprop(learning_rate=0.01, momentum=0.9, epsilon=0.1),
        "RMSprop-momentum-centered": lambda: k.RMSprop(learning_rate=0.01, momentum=0.9, centered=True),
    }


OPTIMIZERS = {f"{flavor}/{name}": make for flavor, k in FLAVORS.items() for name, make in _configurations(k).items()}
OPTIMIZERS["tf_keras/Adam-adaptive-epsilon"] = lambda: tf_keras.optimizers.Adam(
    learning_rate=0.05, epsilon=0.1, adaptive_epsilon=True
)
# Legacy time decay of the learning rate: lr / (1 + decay * step).
OPTIMIZERS["legacy/SGD-decay"] = lambda: tf_keras.optimizers.legacy.SGD(learning_rate=0.1, momentum=0.5, decay=0.3)
OPTIMIZERS["legacy/Adagrad-decay"] = lambda: tf_keras.optimizers.legacy.Adagrad(learning_rate=0.2, decay=0.3)


def train_both(make, var_type: str, mode: str, steps: int = STEPS):
    """``steps`` steps of the wrapper on a DynamicVariable and of ``make()`` on a tf.Variable."""
    v = make_var(var_type, dimension=D, initializer="zeros")
    sok.assign(v, tf.range(V, dtype=tf.int64), INITIAL)
    dense = tf.Variable(INITIAL)
    wrapper, oracle = sok.OptimizerWrapper(make()), make()

    def sok_step():
        with tf.GradientTape() as tape:
            loss = weighted_square_loss(tf.nn.embedding_lookup(v, IDS))
        wrapper.apply_gradients(zip(tape.gradient(loss, [v]), [v]))

    def oracle_step():
        with tf.GradientTape() as tape:
            loss = weighted_square_loss(tf.gather(dense, IDS))
        # Densified, so tf_keras takes its dense path (the TF kernels, for legacy optimizers).
        oracle.apply_gradients([(tf.convert_to_tensor(tape.gradient(loss, dense)), dense)])

    sok_step, oracle_step = compiled(sok_step, mode), compiled(oracle_step, mode)
    for _ in range(steps):
        sok_step()
        oracle_step()
    return v, dense, wrapper


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("var_type", VAR_TYPES)
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_matches_tf_keras_on_a_dense_variable(name, var_type, mode):
    v, dense, wrapper = train_both(OPTIMIZERS[name], var_type, mode)
    keys, values = exported(v)
    assert keys.tolist() == list(range(V))
    assert np.abs(dense.numpy() - INITIAL).max() > 1e-3  # the oracle did move
    np.testing.assert_allclose(values, dense.numpy(), rtol=1e-5, atol=1e-6)
    assert int(wrapper.iterations.numpy()) == STEPS


@pytest.mark.parametrize("name", ["Adagrad-custom", "RMSprop-epsilon"])
def test_legacy_epsilon_placement_is_not_keras_3s(name):
    """The legacy formulas differ from Keras 3's here by more than the tolerance: the test above
    would catch a wrapper that applied Keras 3's formula to a legacy optimizer."""
    _, legacy, _ = train_both(_configurations(tf_keras.optimizers.legacy)[name], "hbm", "eager")
    _, keras3, _ = train_both(_configurations(tf.keras.optimizers)[name], "hbm", "eager")
    assert not np.allclose(legacy.numpy(), keras3.numpy(), rtol=1e-5, atol=1e-6)


# -- lazy updates ------------------------------------------------------------------------------

LAZY = ["SGD-momentum", "Adam", "RMSprop-momentum", "RMSprop"]


@pytest.mark.parametrize("var_type", VAR_TYPES)
@pytest.mark.parametrize("flavor", list(FLAVORS))
@pytest.mark.parametrize("name", LAZY)
def test_rows_not_touched_stay_bit_identical(name, flavor, var_type):
    check_untouched_rows_stay_bit_identical(OPTIMIZERS[f"{flavor}/{name}"](), var_type)


# -- learning rate -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("var_type", VAR_TYPES)
@pytest.mark.parametrize("flavor", list(FLAVORS))
def test_tf_keras_learning_rate_schedule_is_followed(flavor, var_type, mode):
    schedule = tf_keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5)
    check_learning_rate_schedule_is_followed(FLAVORS[flavor].SGD(learning_rate=schedule), var_type, mode)


@pytest.mark.parametrize("flavor", list(FLAVORS))
def test_learning_rate_change_after_tracing_is_followed(flavor):
    # legacy: setting the attribute assigns its hyper variable; tf_keras: its lr variable
    check_learning_rate_change_after_tracing_is_followed(
        FLAVORS[flavor].SGD(learning_rate=0.5), lambda sgd, lr: setattr(sgd, "learning_rate", lr), "hbm"
    )


# -- plain variables go to the tf_keras optimizer ----------------------------------------------


@pytest.mark.parametrize("var_type", VAR_TYPES)
@pytest.mark.parametrize("flavor", list(FLAVORS))
def test_dynamic_and_plain_variables_in_one_call(flavor, var_type):
    v = make_var(var_type, dimension=2, initializer="2")
    w = tf.Variable([[1.0, 1.0]])
    optimizer = FLAVORS[flavor].SGD(learning_rate=0.5)
    opt = sok.OptimizerWrapper(optimizer)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.embedding_lookup(v, tf.constant([5], tf.int64)) * w)
    grads = tape.gradient(loss, [v, w])
    opt.apply_gradients(zip(grads, [v, w]))
    np.testing.assert_allclose(exported(v)[1], [[1.5, 1.5]])  # 2 - 0.5 * w
    np.testing.assert_allclose(w.numpy(), [[0.0, 0.0]])  # 1 - 0.5 * v
    assert int(optimizer.iterations.numpy()) == 1  # w went through the tf_keras optimizer
    assert int(opt.iterations.numpy()) == 1


@pytest.mark.parametrize("flavor", list(FLAVORS))
def test_plain_variable_matches_the_tf_keras_optimizer_alone(flavor):
    make = OPTIMIZERS[f"{flavor}/Adam"]
    wrapped, alone = tf.Variable(INITIAL), tf.Variable(INITIAL)
    opt, oracle = sok.OptimizerWrapper(make()), make()
    grad = tf.constant(np.linspace(-1.0, 1.0, V * D, dtype=np.float32).reshape(V, D))
    for _ in range(3):
        opt.apply_gradients([(grad, wrapped)])
        oracle.apply_gradients([(grad, alone)])
    np.testing.assert_array_equal(wrapped.numpy(), alone.numpy())


def test_slot_names_are_the_same_for_every_flavour():
    """Checkpoints name slots by the wrapper's names: a Keras 3 checkpoint loads under tf_keras."""
    for name in ("SGD-momentum", "Adagrad", "Adam-amsgrad", "Adamax", "Adadelta", "Ftrl", "RMSprop-momentum-centered"):
        names = {
            flavor: sok.OptimizerWrapper(make()).get_slot_names()
            for flavor, make in [
                ("keras", _configurations(tf.keras.optimizers)[name]),
                ("tf_keras", OPTIMIZERS[f"tf_keras/{name}"]),
                ("legacy", OPTIMIZERS[f"legacy/{name}"]),
            ]
        }
        assert names["tf_keras"] == names["keras"] == names["legacy"], name


# -- what is refused ---------------------------------------------------------------------------


@pytest.mark.parametrize("flavor", list(FLAVORS))
@pytest.mark.parametrize("option", ["clipnorm", "clipvalue", "global_clipnorm"])
def test_gradient_clipping_is_refused(option, flavor):
    with pytest.raises(ValueError, match=rf"{option}=1\.5"):
        sok.OptimizerWrapper(FLAVORS[flavor].SGD(learning_rate=0.1, **{option: 1.5}))


@pytest.mark.parametrize(
    "options",
    [{"weight_decay": 0.01}, {"use_ema": True}],
    ids=["weight_decay", "use_ema"],
)
def test_tf_keras_options_that_change_the_update_are_refused(options):
    ((option, value),) = options.items()
    with pytest.raises(ValueError, match=rf"{option}={value!r}"):
        sok.OptimizerWrapper(tf_keras.optimizers.Adam(learning_rate=0.1, **options))


def test_legacy_gradient_transformers_are_refused():
    def halve(grads_and_vars):
        return [(g * 0.5, v) for g, v in grads_and_vars]

    with pytest.raises(ValueError, match="gradient_transformers=.*halve"):
        sok.OptimizerWrapper(tf_keras.optimizers.legacy.SGD(learning_rate=0.1, gradient_transformers=[halve]))


@pytest.mark.parametrize(
    "make",
    [
        lambda: tf_keras.optimizers.Nadam(),
        lambda: tf_keras.optimizers.AdamW(),
        lambda: tf_keras.optimizers.Lion(),
        lambda: tf_keras.optimizers.Adafactor(),
        lambda: tf_keras.optimizers.legacy.Nadam(),
    ],
    ids=["Nadam", "AdamW", "Lion", "Adafactor", "legacy-Nadam"],
)
def test_unsupported_tf_keras_optimizer_lists_the_supported_ones(make):
    optimizer = make()
    with pytest.raises(ValueError, match=type(optimizer).__name__) as info:
        sok.OptimizerWrapper(optimizer)
    for supported in ("SGD", "Adagrad", "Adam", "Adamax", "Adadelta", "Ftrl", "RMSprop", "tf_keras"):
        assert supported in str(info.value)
