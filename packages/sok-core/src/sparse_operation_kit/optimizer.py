"""``sok.OptimizerWrapper``: lazy, row-wise updates of dynamic variables with a Keras optimizer's rule.

The wrapper reads the hyper-parameters (and learning-rate schedule) of the Keras optimizer it wraps
and applies the same formula as Keras to the rows a gradient touches, and only to them. Optimizer
state lives in the same storage row as the embedding (``[embedding | slot 1 | slot 2 ...]``), so
eviction, export and checkpoints never separate a key's weight from its state. Duplicate keys in a
gradient are summed first. Everything runs as TensorFlow ops: eager, or inside ``tf.function``.

Variables that are not dynamic (``tf.Variable``, Keras variables) are passed to the wrapped
optimizer unchanged.

Example::

    opt = sok.OptimizerWrapper(tf.keras.optimizers.Adagrad(learning_rate=0.1))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.embedding_lookup(v, ids))
    opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import tensorflow as tf
from tensorflow.python.framework import indexed_slices as indexed_slices_lib

from sparse_operation_kit import initializers as inits
from sparse_operation_kit import tf_ops
from sparse_operation_kit.dynamic_variable import DynamicVariable
from sparse_operation_kit.storage import create_storage

logger = logging.getLogger(__name__)

__all__ = ["OptimizerWrapper", "SGD", "filter_variables"]

Tensor = tf.Tensor
Update = Callable[[Tensor, dict, Tensor, Tensor, Tensor], tuple[Tensor, dict]]


@dataclass(frozen=True)
class Rule:
    """One optimizer's row-wise update.

    Args:
        name: the optimizer's name in SOK checkpoints (``"Adagrad"``).
        slots: ``(slot name, initial value)`` per state column block, in row order.
        update: ``update(w, slots, g, lr, step) -> (w, slots)`` on ``[n, dim]`` tensors.
    """

    name: str
    slots: tuple[tuple[str, float], ...]
    update: Update


def _hyper(optimizer: Any, name: str) -> float:
    value = getattr(optimizer, name)
    return float(value.numpy()) if hasattr(value, "numpy") else float(value)


def _sgd(opt: Any) -> Rule:
    momentum, nesterov = _hyper(opt, "momentum"), bool(opt.nesterov)
    if momentum == 0:
        return Rule("SGD", (), lambda w, s, g, lr, step: (w - g * lr, s))

    def update(w, s, g, lr, step):
        m = s["momentum"] * momentum - g * lr
        w = w + (m * momentum - g * lr if nesterov else m)
        return w, {"momentum": m}

    return Rule("SGD", (("momentum", 0.0),), update)


def _adagrad(opt: Any) -> Rule:
    eps = _hyper(opt, "epsilon")

    def update(w, s, g, lr, step):
        acc = s["accumulator"] + tf.square(g)
        return w - lr * g / tf.sqrt(acc + eps), {"accumulator": acc}

    return Rule("Adagrad", (("accumulator", _hyper(opt, "initial_accumulator_value")),), update)


def _adam(opt: Any) -> Rule:
    b1, b2, eps, amsgrad = _hyper(opt, "beta_1"), _hyper(opt, "beta_2"), _hyper(opt, "epsilon"), bool(opt.amsgrad)

    def update(w, s, g, lr, step):
        alpha = lr * tf.sqrt(1 - tf.pow(b2, step)) / (1 - tf.pow(b1, step))
        m = s["m"] + (g - s["m"]) * (1 - b1)
        v = s["v"] + (tf.square(g) - s["v"]) * (1 - b2)
        out = {"m": m, "v": v}
        if amsgrad:
            v = out["vhat"] = tf.maximum(s["vhat"], v)
        return w - m * alpha / (tf.sqrt(v) + eps), out

    slots = (("m", 0.0), ("v", 0.0)) + ((("vhat", 0.0),) if amsgrad else ())
    return Rule("Adam", slots, update)


def _adamax(opt: Any) -> Rule:
    b1, b2, eps = _hyper(opt, "beta_1"), _hyper(opt, "beta_2"), _hyper(opt, "epsilon")

    def update(w, s, g, lr, step):
        m = s["m"] + (g - s["m"]) * (1 - b1)
        u = tf.maximum(b2 * s["u"], tf.abs(g))
        return w - lr * m / ((1 - tf.pow(b1, step)) * (u + eps)), {"m": m, "u": u}

    return Rule("Adamax", (("m", 0.0), ("u", 0.0)), update)


def _adadelta(opt: Any) -> Rule:
    rho, eps = _hyper(opt, "rho"), _hyper(opt, "epsilon")

    def update(w, s, g, lr, step):
        acc_grad = rho * s["accum_grad"] + (1 - rho) * tf.square(g)
        delta = -(tf.sqrt(s["accum_var"] + eps) * g) / tf.sqrt(acc_grad + eps)
        acc_var = rho * s["accum_var"] + (1 - rho) * tf.square(delta)
        return w + lr * delta, {"accum_grad": acc_grad, "accum_var": acc_var}

    return Rule("Adadelta", (("accum_grad", 0.0), ("accum_var", 0.0)), update)


def _ftrl(opt: Any) -> Rule:
    power = _hyper(opt, "learning_rate_power")
    l1, l2 = _hyper(opt, "l1_regularization_strength"), _hyper(opt, "l2_regularization_strength")
    shrinkage, beta = _hyper(opt, "l2_shrinkage_regularization_strength"), _hyper(opt, "beta")

    def update(w, s, g, lr, step):
        accum, linear = s["accumulator"], s["linear"]
        adjusted_l2 = l2 + beta / (2.0 * lr)
        new_accum = accum + tf.square(g)
        linear = linear + (g + 2 * shrinkage * w) - (tf.pow(new_accum, -power) - tf.pow(accum, -power)) / lr * w
        quadratic = tf.pow(new_accum, -power) / lr + 2 * adjusted_l2
        w = (tf.clip_by_value(linear, -l1, l1) - linear) / quadratic
        return w, {"accumulator": new_accum, "linear": linear}

    return Rule("Ftrl", (("accumulator", _hyper(opt, "initial_accumulator_value")), ("linear", 0.0)), update)


def _rmsprop(opt: Any) -> Rule:
    rho, momentum, eps, centered = _hyper(opt, "rho"), _hyper(opt, "momentum"), _hyper(opt, "epsilon"), opt.centered

    def update(w, s, g, lr, step):
        out = {"velocity": rho * s["velocity"] + (1 - rho) * tf.square(g)}
        if centered:
            out["average_gradient"] = rho * s["average_gradient"] + (1 - rho) * g
            denominator = out["velocity"] - tf.square(out["average_gradient"]) + eps
        else:
            denominator = out["velocity"] + eps
        increment = lr * g / tf.sqrt(denominator)
        if momentum > 0:
            out["momentum"] = momentum * s["momentum"] + increment
            return w - out["momentum"], out
        return w - increment, out

    slots = (("velocity", 0.0),) + ((("momentum", 0.0),) if momentum > 0 else ())
    slots += (("average_gradient", 0.0),) if centered else ()
    return Rule("RMSprop", slots, update)


#: Keras optimizer class name → its row-wise rule. The one list of supported optimizers.
RULES: dict[str, Callable[[Any], Rule]] = {
    "SGD": _sgd,
    "Adagrad": _adagrad,
    "Adam": _adam,
    "Adamax": _adamax,
    "Adadelta": _adadelta,
    "Ftrl": _ftrl,
    "RMSprop": _rmsprop,
}

# Options of Keras optimizers that change the update beyond the rule; refused for dynamic rows.
_UNSUPPORTED_OPTIONS = (
    "weight_decay",
    "clipnorm",
    "clipvalue",
    "global_clipnorm",
    "use_ema",
    "loss_scale_factor",
    "gradient_accumulation_steps",
)


def _rule_for(optimizer: Any) -> Rule:
    for klass in type(optimizer).__mro__:
        if klass.__name__ in RULES:
            return RULES[klass.__name__](optimizer)
    raise ValueError(
        f"optimizer {type(optimizer).__name__} is not supported by sok.OptimizerWrapper; valid: Keras "
        f"{', '.join(sorted(RULES))} (tf.keras.optimizers.*)"
    )


def filter_variables(variables: Iterable[Any]) -> tuple[list, list]:
    """Split variables into SOK variables (dynamic and static SOK tables) and the rest, order kept.

    Example::

        sok_vars, dense_vars = sok.filter_variables(model.trainable_variables)
    """
    sok_vars, other = [], []
    for v in variables:
        (sok_vars if isinstance(v, DynamicVariable) or getattr(v, "is_sok_variable", False) else other).append(v)
    return sok_vars, other


class OptimizerWrapper:
    """Applies a Keras optimizer's update rule to ``sok.DynamicVariable`` rows, lazily.

    Args:
        optimizer: a Keras 3 optimizer (``tf.keras.optimizers.SGD``, ``Adagrad``, ``Adam`` (applied
            as LazyAdam: only touched rows decay), ``Adamax``, ``Adadelta``, ``Ftrl``, ``RMSprop``).
            Its learning rate (or schedule) and hyper-parameters are read at each step; the
            step counter is the wrapper's own (:attr:`iterations`).
    """

    def __init__(self, optimizer: Any) -> None:
        self._optimizer = optimizer
        self._rule = _rule_for(optimizer)
        for option in _UNSUPPORTED_OPTIONS:
            if getattr(optimizer, option, None):
                raise NotImplementedError(
                    f"{type(optimizer).__name__}({option}={getattr(optimizer, option)!r}) is not supported for "
                    f"dynamic variables; create the optimizer without {option}"
                )
        self._iterations = tf.Variable(0, dtype=tf.int64, trainable=False, name="sok_optimizer_iterations")
        self._variables: dict[int, DynamicVariable] = {}

    @property
    def optimizer(self) -> Any:
        """The wrapped Keras optimizer."""
        return self._optimizer

    @property
    def iterations(self) -> tf.Variable:
        """Steps applied to dynamic variables so far."""
        return self._iterations

    @property
    def lr(self) -> Any:
        return self._optimizer.learning_rate

    @property
    def name(self) -> str:
        """The optimizer's name in SOK checkpoints (``"Adagrad"``)."""
        return self._rule.name

    def get_slot_names(self) -> list[str]:
        return [name for name, _ in self._rule.slots]

    def _learning_rate(self) -> Tensor:
        lr = getattr(self._optimizer, "_learning_rate", None)
        if isinstance(lr, tf.keras.optimizers.schedules.LearningRateSchedule):
            return tf.cast(lr(self._iterations), tf.float32)
        return tf.cast(tf.convert_to_tensor(self._optimizer.learning_rate), tf.float32)

    def _attach(self, var: DynamicVariable) -> None:
        """Give the variable's rows this optimizer's state columns (once, before the first update)."""
        if id(var) in self._variables:
            return
        owner = getattr(var, "_sok_optimizer", None)
        if owner is not None and owner is not self:
            raise ValueError(
                f"{var.name} is already updated by another sok.OptimizerWrapper ({owner.name}); its optimizer "
                f"state lives in its rows, so one wrapper per variable"
            )
        dim, old = var.dimension, var.table_ref.storage
        width = dim * (1 + len(self._rule.slots))
        initializers = [var.embedding_initializer] + [
            inits.constant(value, columns=((i + 1) * dim, (i + 2) * dim))
            for i, (_, value) in enumerate(self._rule.slots)
        ]
        if width != old.row_width:
            wide = create_storage(
                var.backend_type,
                row_width=width,
                key_dtype=old.key_dtype.name,
                initializer=initializers,
                **var.config_dict,
            )
            keys, values, scores = old.export(columns=(0, dim))
            if keys.size:  # scores too: widening is no write (eviction order, incremental dumps)
                wide.import_batch(keys, values, scores, columns=(0, dim))
            logger.debug("widened %s to %d columns for %s (%d rows copied)", var.name, width, self.name, keys.size)
            var.table_ref.swap(wide, initializers)
        var._sok_optimizer = self
        self._variables[id(var)] = var

    def _apply_dynamic(self, grad: Any, var: DynamicVariable, lr: Tensor, step: Tensor) -> None:
        if not isinstance(grad, indexed_slices_lib.IndexedSlices):
            raise TypeError(
                f"the gradient of {var.name} must be tf.IndexedSlices (from a lookup), got {type(grad).__name__}"
            )
        dim = var.dimension
        width = dim * (1 + len(self._rule.slots))
        keys = tf.reshape(var._keys(grad.indices), [-1])
        values = tf.reshape(tf.cast(grad.values, tf.float32), [-1, dim])
        lib = tf_ops.library()
        unique, summed = lib.sok_unique_sum(keys, values)
        rows = lib.sok_find_or_insert(*var.table_inputs, unique, col_begin=0, col_end=width)
        slots = {name: rows[:, (i + 1) * dim : (i + 2) * dim] for i, (name, _) in enumerate(self._rule.slots)}
        new_w, new_slots = self._rule.update(rows[:, :dim], slots, summed, lr, step)
        new_rows = tf.concat([new_w] + [new_slots[name] for name, _ in self._rule.slots], axis=1)
        lib.sok_insert_or_assign(*var.table_inputs, unique, new_rows, col_begin=0, col_end=width)

    def apply_gradients(self, grads_and_vars: Iterable[tuple[Any, Any]], *args: Any, **kwargs: Any) -> None:
        """Update dynamic variables row-wise; pass every other pair to the wrapped optimizer."""
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        dynamic = [(g, v) for g, v in pairs if isinstance(v, DynamicVariable)]
        others = [(g, v) for g, v in pairs if not isinstance(v, DynamicVariable)]
        if len({id(v) for _, v in dynamic}) != len(dynamic):
            raise ValueError("a variable appears twice in one apply_gradients call; sum its gradients first")
        if others:
            self._optimizer.apply_gradients(others, *args, **kwargs)
        if not dynamic:
            return
        for _, v in dynamic:
            self._attach(v)
        lr = self._learning_rate()
        step = tf.cast(self._iterations + 1, tf.float32)
        for g, v in dynamic:
            self._apply_dynamic(g, v, lr, step)
        self._iterations.assign_add(1)

    def get_slot(self, var: DynamicVariable, slot_name: str) -> tuple[Tensor, Tensor]:
        """``(keys, values)`` of one optimizer slot of the variable's local shard."""
        names = self.get_slot_names()
        if slot_name not in names:
            raise ValueError(f"{self.name} has no slot {slot_name!r}; valid: {names}")
        if id(var) not in self._variables:
            raise ValueError(f"{var.name} has no {self.name} state yet: apply a gradient to it first")
        i = names.index(slot_name) + 1
        keys, values, _ = tf_ops.library().sok_export(
            *var.table_inputs,
            tf.constant(0, tf.uint64),
            Tkeys=var.key_type,
            col_begin=i * var.dimension,
            col_end=(i + 1) * var.dimension,
        )
        return keys, values


def SGD(lr: float) -> OptimizerWrapper:  # noqa: N802 (SOK's name)
    """Plain SGD for dynamic variables: ``sok.SGD(0.1)``."""
    return OptimizerWrapper(tf.keras.optimizers.SGD(learning_rate=lr))
