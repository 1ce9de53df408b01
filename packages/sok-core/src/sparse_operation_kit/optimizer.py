"""``sok.OptimizerWrapper``: lazy, row-wise updates of dynamic variables with a Keras optimizer's rule.

The wrapper reads the hyper-parameters (and learning-rate schedule) of the Keras optimizer it wraps
and applies the same formula as that optimizer to the rows a gradient touches, and only to them.
Three flavours of Keras optimizers are accepted: Keras 3 (``tf.keras.optimizers.*``), tf_keras
(``tf_keras.optimizers.*``) and tf_keras' legacy ones (``tf_keras.optimizers.legacy.*``); each is
updated with its own formulas (:class:`Flavor`). Optimizer state lives in the same storage row as
the embedding (``[embedding | slot 1 | slot 2 ...]``), so eviction, export and checkpoints never
separate a key's weight from its state. Duplicate keys in a gradient are summed first. Everything
runs as TensorFlow ops: eager, or inside ``tf.function``.

Variables that are not dynamic (``tf.Variable``, Keras variables, ``sok.Variable`` shards) are
passed to the wrapped optimizer, which updates them with its own step and state; for Keras 3's
Adagrad, a ``sok.Variable`` shard's step touches only the rows of its gradient
(:class:`OptimizerWrapper`, "Static tables").

Example::

    opt = sok.OptimizerWrapper(tf.keras.optimizers.Adagrad(learning_rate=0.1))
    # or sok.OptimizerWrapper(tf_keras.optimizers.legacy.Adagrad(learning_rate=0.1))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.embedding_lookup(v, ids))
    opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
"""

from __future__ import annotations

import contextlib
import enum
import importlib
import itertools
import logging
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import indexed_slices as indexed_slices_lib

from sparse_operation_kit import communication, tf_ops
from sparse_operation_kit import initializers as inits
from sparse_operation_kit.dtypes import VALUE_DTYPE
from sparse_operation_kit.dynamic_variable import DynamicVariable, distinct_index_of, export
from sparse_operation_kit.lookup import exchange
from sparse_operation_kit.row_layout import RowLayout
from sparse_operation_kit.row_wise_adagrad import RowWiseAdagrad
from sparse_operation_kit.slot_view import DynamicSlot
from sparse_operation_kit.storage import MAX_ROW_WIDTH, create_storage

logger = logging.getLogger(__name__)

__all__ = [
    "DynamicSlot",
    "Flavor",
    "OptimizerWrapper",
    "SGD",
    "UnsupportedOptionError",
    "filter_variables",
    "is_keras_optimizer",
    "wrappers_of",
]

Tensor = tf.Tensor
Update = Callable[[Tensor, dict, Tensor, Tensor, Tensor], tuple[Tensor, dict]]


class UnsupportedOptionError(NotImplementedError, ValueError):
    """An optimizer option the row-wise rule cannot honour (``clipnorm``, ``weight_decay``, ...).

    Both a ``ValueError`` (a setting the wrapper refuses) and a ``NotImplementedError`` (what it
    raised first), so either ``except`` catches it.
    """


class Flavor(enum.Enum):
    """The Keras an optimizer comes from: where it keeps its settings and which formulas it uses.

    The rules below are written once, with Keras 3's formulas; the few places where the other
    flavours compute differently are parameters of the rules:

    * ``TF_KERAS``: Adam's ``adaptive_epsilon``; RMSprop multiplies by ``rsqrt``.
    * ``TF_KERAS_LEGACY`` (``OptimizerV2``: hyper-parameters in ``_hyper``, read with
      ``_get_hyper``; updates by TensorFlow's ``ResourceApply*`` kernels): Adagrad adds epsilon
      after the square root (``ResourceApplyAdagradV2``), so does RMSprop without momentum (with
      momentum, ``ResourceApply(Centered)RMSProp`` adds it inside, as Keras 3); the learning rate
      also decays by ``decay`` (``lr / (1 + decay * step)``).
    """

    KERAS = "Keras 3"
    TF_KERAS = "tf_keras"
    TF_KERAS_LEGACY = "tf_keras legacy"

    @classmethod
    def of(cls, optimizer: Any) -> Flavor:
        modules = [klass.__module__ for klass in type(optimizer).__mro__]
        if any(m.startswith("tf_keras.") and ".legacy." in m for m in modules):
            return cls.TF_KERAS_LEGACY
        if any(m.startswith("tf_keras.") for m in modules):
            return cls.TF_KERAS
        return cls.KERAS


# Settings tf_keras' legacy optimizers keep in private attributes (neither hyper nor public).
_LEGACY_ATTRIBUTES = {
    "initial_accumulator_value": "_initial_accumulator_value",
    "l2_shrinkage_regularization_strength": "_l2_shrinkage_regularization_strength",
}


class Settings:
    """The hyper-parameters and learning rate of a Keras optimizer of any :class:`Flavor`.

    ``settings("epsilon")`` is a Python float, read once (when the rule is made);
    :meth:`learning_rate` is a tensor, read at every step.
    """

    def __init__(self, optimizer: Any) -> None:
        self.optimizer = optimizer
        self.flavor = Flavor.of(optimizer)
        self.legacy = self.flavor is Flavor.TF_KERAS_LEGACY
        if self.legacy and hasattr(optimizer, "_create_hypers"):
            with tf.init_scope():  # hyper variables, made eagerly now rather than in a traced step
                optimizer._create_hypers()

    def _read(self, name: str) -> Any:
        opt = self.optimizer
        if self.legacy:
            if name in opt._hyper:
                return opt._get_hyper(name)
            name = _LEGACY_ATTRIBUTES.get(name, name)
        return getattr(opt, name)

    def __call__(self, name: str) -> float:
        value = self._read(name)
        return float(value.numpy()) if hasattr(value, "numpy") else float(value)

    def flag(self, name: str, default: bool | None = None) -> bool:
        if default is not None and not hasattr(self.optimizer, name):
            return default
        return bool(self._read(name))

    def _schedule_type(self) -> type:
        keras = importlib.import_module("keras" if self.flavor is Flavor.KERAS else "tf_keras")
        return keras.optimizers.schedules.LearningRateSchedule

    def learning_rate(self, iterations: tf.Variable) -> Tensor:
        """The learning rate of the step after ``iterations`` steps, as the optimizer computes it."""
        opt = self.optimizer
        lr = self._read("learning_rate") if self.legacy else getattr(opt, "_learning_rate", None)
        if isinstance(lr, self._schedule_type()):
            # The step each flavour passes: the int64 counter; legacy casts it to the float dtype.
            lr = lr(tf.cast(iterations, tf.float32) if self.legacy else iterations)
        elif not self.legacy:
            lr = opt.learning_rate
        lr = tf.cast(tf.convert_to_tensor(lr), tf.float32)
        decay = float(getattr(opt, "_initial_decay", 0.0)) if self.legacy else 0.0
        if decay > 0:
            lr = lr / (1.0 + decay * tf.cast(iterations, tf.float32))
        return lr


@dataclass(frozen=True)
class Rule:
    """One optimizer's row-wise update.

    Args:
        name: the optimizer's name in SOK checkpoints (``"Adagrad"``).
        slots: ``(slot name, initial value)`` per state column block, in row order. The same for
            every flavour, so checkpoints move between them.
        update: ``update(w, slots, g, lr, step) -> (w, slots)`` on ``[n, dim]`` tensors (a slot of
            ``per_row`` on ``[n, 1]``).
        native: ``(rule, hyper-parameters)`` of the same update in the op library's
            ``SokSparseApply`` (one op per step on CPU tables), or None where only ``update`` has it.
        per_row: the slots that hold one float per row instead of one per column.
    """

    name: str
    slots: tuple[tuple[str, float], ...]
    update: Update
    native: tuple[str, tuple[float, ...]] | None = None
    per_row: tuple[str, ...] = ()

    def layout(self, dim: int) -> RowLayout:
        """Where a row of dimension ``dim`` keeps the embedding and this rule's slots."""
        names = tuple(name for name, _ in self.slots)
        return RowLayout(dim, names, tuple(1 if name in self.per_row else dim for name in names))


def _sgd(h: Settings) -> Rule:
    momentum, nesterov = h("momentum"), h.flag("nesterov")
    if momentum == 0:
        return Rule("SGD", (), lambda w, s, g, lr, step: (w - g * lr, s), native=("sgd", ()))

    def update(w, s, g, lr, step):
        m = s["momentum"] * momentum - g * lr
        w = w + (m * momentum - g * lr if nesterov else m)
        return w, {"momentum": m}

    return Rule("SGD", (("momentum", 0.0),), update, native=("momentum", (momentum, float(nesterov))))


def _adagrad(h: Settings) -> Rule:
    eps, eps_after_sqrt = h("epsilon"), h.legacy

    def update(w, s, g, lr, step):
        acc = s["accumulator"] + tf.square(g)
        denominator = tf.sqrt(acc) + eps if eps_after_sqrt else tf.sqrt(acc + eps)
        return w - lr * g / denominator, {"accumulator": acc}

    native = ("adagrad", (eps, float(eps_after_sqrt)))
    return Rule("Adagrad", (("accumulator", h("initial_accumulator_value")),), update, native=native)


def _row_wise_adagrad(h: Settings) -> Rule:
    eps = h("epsilon")

    def update(w, s, g, lr, step):
        acc = s["accumulator"] + tf.reduce_mean(tf.square(g), axis=-1, keepdims=True)
        return w - lr * g / (tf.sqrt(acc) + eps), {"accumulator": acc}

    slots = (("accumulator", h("initial_accumulator_value")),)
    return Rule("RowWiseAdagrad", slots, update, native=("rowwise_adagrad", (eps,)), per_row=("accumulator",))


def _adam(h: Settings) -> Rule:
    b1, b2, eps, amsgrad = h("beta_1"), h("beta_2"), h("epsilon"), h.flag("amsgrad")
    adaptive_epsilon = h.flag("adaptive_epsilon", default=False)  # tf_keras only

    def update(w, s, g, lr, step):
        alpha = lr * tf.sqrt(1 - tf.pow(b2, step)) / (1 - tf.pow(b1, step))
        eps_hat = eps * tf.sqrt(1 - tf.pow(b2, step)) if adaptive_epsilon else eps
        m = s["m"] + (g - s["m"]) * (1 - b1)
        v = s["v"] + (tf.square(g) - s["v"]) * (1 - b2)
        out = {"m": m, "v": v}
        if amsgrad:
            v = out["vhat"] = tf.maximum(s["vhat"], v)
        return w - m * alpha / (tf.sqrt(v) + eps_hat), out

    slots = (("m", 0.0), ("v", 0.0)) + ((("vhat", 0.0),) if amsgrad else ())
    return Rule("Adam", slots, update)


def _adamax(h: Settings) -> Rule:
    b1, b2, eps = h("beta_1"), h("beta_2"), h("epsilon")

    def update(w, s, g, lr, step):
        m = s["m"] + (g - s["m"]) * (1 - b1)
        u = tf.maximum(b2 * s["u"], tf.abs(g))
        return w - lr * m / ((1 - tf.pow(b1, step)) * (u + eps)), {"m": m, "u": u}

    return Rule("Adamax", (("m", 0.0), ("u", 0.0)), update)


def _adadelta(h: Settings) -> Rule:
    rho, eps = h("rho"), h("epsilon")

    def update(w, s, g, lr, step):
        acc_grad = rho * s["accum_grad"] + (1 - rho) * tf.square(g)
        delta = -(tf.sqrt(s["accum_var"] + eps) * g) / tf.sqrt(acc_grad + eps)
        acc_var = rho * s["accum_var"] + (1 - rho) * tf.square(delta)
        return w + lr * delta, {"accum_grad": acc_grad, "accum_var": acc_var}

    return Rule("Adadelta", (("accum_grad", 0.0), ("accum_var", 0.0)), update)


def _ftrl(h: Settings) -> Rule:
    power = h("learning_rate_power")
    l1, l2 = h("l1_regularization_strength"), h("l2_regularization_strength")
    shrinkage, beta = h("l2_shrinkage_regularization_strength"), h("beta")

    def update(w, s, g, lr, step):
        accum, linear = s["accumulator"], s["linear"]
        adjusted_l2 = l2 + beta / (2.0 * lr)
        new_accum = accum + tf.square(g)
        linear = linear + (g + 2 * shrinkage * w) - (tf.pow(new_accum, -power) - tf.pow(accum, -power)) / lr * w
        quadratic = tf.pow(new_accum, -power) / lr + 2 * adjusted_l2
        w = (tf.clip_by_value(linear, -l1, l1) - linear) / quadratic
        return w, {"accumulator": new_accum, "linear": linear}

    return Rule("Ftrl", (("accumulator", h("initial_accumulator_value")), ("linear", 0.0)), update)


def _rmsprop(h: Settings) -> Rule:
    rho, momentum, eps, centered = h("rho"), h("momentum"), h("epsilon"), h.flag("centered")
    # Legacy RMSprop uses its momentum kernel whenever momentum was given as a tensor or callable.
    has_momentum = momentum > 0 or (h.legacy and h.flag("_momentum"))
    eps_after_sqrt = h.legacy and not has_momentum
    rsqrt = h.flavor is Flavor.TF_KERAS

    def update(w, s, g, lr, step):
        out = {"velocity": rho * s["velocity"] + (1 - rho) * tf.square(g)}
        if centered:
            out["average_gradient"] = rho * s["average_gradient"] + (1 - rho) * g
            denominator = out["velocity"] - tf.square(out["average_gradient"])
        else:
            denominator = out["velocity"]
        if eps_after_sqrt:
            increment = lr * g / (tf.sqrt(denominator) + eps)
        elif rsqrt:
            increment = lr * g * tf.math.rsqrt(denominator + eps)
        else:
            increment = lr * g / tf.sqrt(denominator + eps)
        if has_momentum:
            out["momentum"] = momentum * s["momentum"] + increment
            return w - out["momentum"], out
        return w - increment, out

    slots = (("velocity", 0.0),) + ((("momentum", 0.0),) if has_momentum else ())
    slots += (("average_gradient", 0.0),) if centered else ()
    return Rule("RMSprop", slots, update)


@dataclass(frozen=True)
class OptimizerRecord:
    """Everything SOK knows of one supported Keras optimizer, in one place.

    Args:
        rule: the row-wise rule of an optimizer object's settings (slots, update, native rule).
        keras_slots: per slot, the attribute of a Keras 3 or tf_keras optimizer that holds one
            optimizer variable per dense model variable (indexed like its variable list).
        legacy_slots: per slot, the name a tf_keras legacy optimizer's ``get_slot`` takes (empty for
            SOK's own optimizers, which have no tf_keras legacy flavour).
        natives: the ``SokSparseApply`` rules ``rule`` may give (``Rule.native``'s names); a test
            compares them with the op library's list (``SOK_SPARSE_RULES`` of sparse_rules.h).
        checkpoint_aliases: per slot, other ``(optimizer, slot)`` names of its state file that a
            checkpoint may carry instead: NVIDIA SOK names Adamax files "Adam" (its optimizer-name
            match lets the last substring win), and Keras 2 named Adamax's second slot "v".
    """

    rule: Callable[[Settings], Rule]
    keras_slots: dict[str, str]
    legacy_slots: dict[str, str]
    natives: tuple[str, ...] = ()
    checkpoint_aliases: dict[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)


#: Keras optimizer class name (or SOK's own optimizer's) → its record. The one list of supported optimizers: adding one
#: touches this table (and sparse_rules.h when its rule also runs natively).
OPTIMIZERS: dict[str, OptimizerRecord] = {
    "SGD": OptimizerRecord(_sgd, {"momentum": "momentums"}, {"momentum": "momentum"}, natives=("sgd", "momentum")),
    "Adagrad": OptimizerRecord(
        _adagrad, {"accumulator": "_accumulators"}, {"accumulator": "accumulator"}, natives=("adagrad",)
    ),
    "RowWiseAdagrad": OptimizerRecord(
        _row_wise_adagrad, {"accumulator": "_accumulators"}, {}, natives=("rowwise_adagrad",)
    ),
    "Adam": OptimizerRecord(
        _adam, {"m": "_momentums", "v": "_velocities", "vhat": "_velocity_hats"}, {"m": "m", "v": "v", "vhat": "vhat"}
    ),
    "Adamax": OptimizerRecord(
        _adamax,
        {"m": "_m", "u": "_u"},
        {"m": "m", "u": "v"},
        checkpoint_aliases={"m": (("Adam", "m"),), "u": (("Adamax", "v"), ("Adam", "v"))},
    ),
    "Adadelta": OptimizerRecord(
        _adadelta,
        {"accum_grad": "_accumulated_grads", "accum_var": "_accumulated_delta_vars"},
        {"accum_grad": "accum_grad", "accum_var": "accum_var"},
    ),
    "Ftrl": OptimizerRecord(
        _ftrl,
        {"accumulator": "_accumulators", "linear": "_linears"},
        {"accumulator": "accumulator", "linear": "linear"},
    ),
    "RMSprop": OptimizerRecord(
        _rmsprop,
        {"velocity": "_velocities", "momentum": "_momentums", "average_gradient": "_average_gradients"},
        {"velocity": "rms", "momentum": "momentum", "average_gradient": "mg"},
    ),
}


def checkpoint_aliases(optimizer: str, slot: str) -> tuple[tuple[str, str], ...]:
    """Older ``(optimizer, slot)`` names under which a checkpoint may hold ``optimizer``'s ``slot``
    (a record's ``checkpoint_aliases``); none for an optimizer SOK does not know."""
    record = OPTIMIZERS.get(optimizer)
    return () if record is None else record.checkpoint_aliases.get(slot, ())


# Options of Keras optimizers (any flavour; an attribute a flavour lacks reads as unset) that change
# the update beyond the rule; refused for dynamic rows.
_UNSUPPORTED_OPTIONS = (
    "weight_decay",
    "clipnorm",
    "clipvalue",
    "global_clipnorm",
    "use_ema",
    "loss_scale_factor",
    "gradient_accumulation_steps",
    "gradient_transformers",  # tf_keras legacy
)


def _rule_for(settings: Settings) -> Rule:
    for klass in type(settings.optimizer).__mro__:
        if klass.__name__ in OPTIMIZERS:
            return OPTIMIZERS[klass.__name__].rule(settings)
    optimizer = settings.optimizer
    what = type(optimizer).__name__ if hasattr(optimizer, "apply_gradients") else f"{optimizer!r} (not an optimizer)"
    if "LossScale" in what:
        raise ValueError(
            f"optimizer {what} of {settings.flavor.value} is not supported by sok.OptimizerWrapper: it takes Keras 3's "
            f"keras.optimizers.LossScaleOptimizer (tf.keras.optimizers.LossScaleOptimizer). Wrap the inner optimizer "
            f"instead; for mixed precision use the 'mixed_bfloat16' policy, which needs no loss scaling"
        )
    raise ValueError(
        f"optimizer {what} is not supported by sok.OptimizerWrapper; pass an optimizer object, valid: "
        f"{', '.join(sorted(OPTIMIZERS))} of Keras 3 (tf.keras.optimizers.*), tf_keras (tf_keras.optimizers.*) "
        f"or tf_keras legacy (tf_keras.optimizers.legacy.*)"
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


def _from_sok_gradient(indices: tf.Tensor) -> bool:
    """Whether ``indices`` are, in a graph, an output of SOK's pooled lookup gradient op: rows of the
    shard already checked by that op, so the update need not check them again."""
    return not tf.executing_eagerly() and getattr(getattr(indices, "op", None), "type", None) == "SokPooledLookupGrad"


def _sok_gradient_output(g: Any) -> tuple[tf.Operation, int] | None:
    """``(op, t)`` when ``g`` is, untouched, table ``t``'s gradient from SOK's pooled lookup gradient
    op ``op`` (its rows and indices outputs, in a graph), else None."""
    if not isinstance(g, tf.IndexedSlices) or not _from_sok_gradient(g.indices):
        return None
    op, values = g.indices.op, g.values
    if not isinstance(values, tf.Tensor) or values.op is not op:
        return None
    t = values.value_index
    return (op, t) if g.indices.value_index == op.get_attr("num_tables") + t else None


def _padded(steps: list[tuple[tf.IndexedSlices, tf.Variable, Any]]) -> list[tuple[tf.IndexedSlices, tf.Variable, Any]]:
    """``steps`` with each gradient that is an output of SOK's pooled lookup gradient op, untouched,
    taken instead from one twin of that op with ``padded=True``: a row per id, the distinct ids' rows
    first, then index -1, which the update stops at. The twin's outputs have sizes known before it
    runs, so on a GPU the step reads no count back to the host; the original op, left without
    consumers, is pruned from the step (where nothing else reads the gradients)."""
    twins: dict[str, tf.Operation] = {}
    out = []
    for g, v, lr in steps:
        source = _sok_gradient_output(g)
        if source is None:
            out.append((g, v, lr))
            continue
        op, t = source
        n = op.get_attr("num_tables")
        if op.name not in twins:
            with tf.device(op.device):
                twins[op.name] = (
                    tf_ops.library()
                    .sok_pooled_lookup_grad(
                        grads=list(op.inputs[:n]),
                        ids=list(op.inputs[n : 2 * n]),
                        row_splits=list(op.inputs[2 * n : 3 * n]),
                        weights=list(op.inputs[3 * n :]),
                        combiners=op.get_attr("combiners"),
                        table_rows=op.get_attr("table_rows"),
                        strides=op.get_attr("strides"),
                        offsets=op.get_attr("offsets"),
                        padded=True,
                    )[0][0]
                    .op
                )
        twin = twins[op.name]
        out.append((tf.IndexedSlices(twin.outputs[t], twin.outputs[n + t], g.dense_shape), v, lr))
    return out


def _adagrad_tables(
    optimizer: Any, steps: list[tuple[tf.IndexedSlices, tf.Variable, Any]], row_wise: bool = False
) -> None:
    """Keras 3 ``Adagrad.update_step`` on the rows of ``IndexedSlices`` gradients of ``sok.Variable``
    shards: one ``SokSparseApplyAdagradTables`` op per device and learning rate for all of them
    (``row_wise``: ``sok.RowWiseAdagrad``'s step, for gradients straight from ``sok.lookup_sparse``
    only, whose rows are distinct).

    The op computes what Keras' TensorFlow ops do for such a gradient, in their order: the squared
    gradient added to the accumulator row by row (a repeated row adds twice), then ``lr * g /
    sqrt(acc + eps)`` subtracted from each row with the accumulator after all additions. On the CPU
    the results are Keras' to the bit; on a GPU there is no host round trip (Keras: ``tf.unique`` per
    table) and no copy of whole accumulators (Keras' reads of a sparsely updated variable). Gradients
    straight from SOK's pooled lookup come padded (:func:`_padded`): no round trip for their size
    either."""
    groups: dict[tuple[str, int], list[tuple[tf.IndexedSlices, tf.Variable, Any]]] = {}
    for step in _padded(steps):
        groups.setdefault((step[1].device, id(step[2])), []).append(step)
    epsilon = float(optimizer.epsilon)
    for (device, _), group in groups.items():
        accumulators = [optimizer._accumulators[optimizer._get_variable_index(v)] for _, v, _ in group]
        with tf.device(device):
            tf_ops.library().sok_sparse_apply_adagrad_tables(
                tables=[v.handle for _, v, _ in group],
                accumulators=[a.value.handle for a in accumulators],
                learning_rate=tf.cast(group[0][2], tf.float32),
                indices=[tf.cast(g.indices, tf.int64) for g, _, _ in group],
                grads=[tf.cast(g.values, tf.float32) for g, _, _ in group],
                epsilon=epsilon,
                check_indices=not all(_from_sok_gradient(g.indices) for g, _, _ in group),
                row_wise=row_wise,
                names=[v.name for _, v, _ in group],
            )


#: Every live OptimizerWrapper, so that sok.dump / sok.load given a Keras optimizer find its wrapper.
_WRAPPERS: weakref.WeakSet[OptimizerWrapper] = weakref.WeakSet()


def wrappers_of(optimizer: Any) -> list[OptimizerWrapper]:
    """The live ``sok.OptimizerWrapper`` objects that wrap ``optimizer`` (a Keras optimizer, or the
    ``LossScaleOptimizer`` around one), oldest first."""
    return sorted((w for w in _WRAPPERS if w.wraps(optimizer)), key=lambda w: w._serial)


def _values(grad: Any) -> Tensor:
    """A gradient's values (an ``IndexedSlices``' rows, or the dense gradient itself)."""
    return tf.convert_to_tensor(grad.values if isinstance(grad, indexed_slices_lib.IndexedSlices) else grad)


def _scaled(grad: Any, factor: Tensor) -> Any:
    """``grad`` times ``factor``; an ``IndexedSlices`` keeps its indices tensor, on which a lookup's
    distinct index rides to the optimizer (:func:`distinct_index_of`)."""
    if isinstance(grad, indexed_slices_lib.IndexedSlices):
        values = tf.convert_to_tensor(grad.values)
        return indexed_slices_lib.IndexedSlices(values * tf.cast(factor, values.dtype), grad.indices, grad.dense_shape)
    return grad * tf.cast(factor, grad.dtype)


def _loss_scaled(optimizer: Any) -> tuple[Any, Any]:
    """``(inner optimizer, LossScaleOptimizer or None)``: Keras 3's ``LossScaleOptimizer`` is
    unwrapped (the rule is its inner optimizer's); any other optimizer is its own inner one."""
    if type(optimizer).__name__ == "LossScaleOptimizer" and Flavor.of(optimizer) is Flavor.KERAS:
        return optimizer.inner_optimizer, optimizer
    return optimizer, None


def is_keras_optimizer(optimizer: Any) -> bool:
    """Whether ``optimizer`` is a Keras optimizer object of any :class:`Flavor` (by its classes' modules)."""
    modules = [klass.__module__ for klass in type(optimizer).__mro__]
    keras = any(m.split(".")[0] in ("keras", "tf_keras") for m in modules)
    return keras and hasattr(optimizer, "apply_gradients")


def _var_key(var: Any) -> Any:
    """The key of ``var`` in a tf_keras legacy optimizer's ``_slots`` (its ``_var_key``)."""
    return var._shared_name if getattr(var, "_in_graph_mode", False) else var._unique_id


#: Orders wrappers by creation (wrappers_of).
_serials = itertools.count()


class OptimizerWrapper:
    """Applies a Keras optimizer's update rule to ``sok.DynamicVariable`` rows, lazily.

    Args:
        optimizer: a Keras optimizer: ``SGD``, ``Adagrad``, ``Adam`` (applied as LazyAdam: only
            touched rows decay), ``Adamax``, ``Adadelta``, ``Ftrl`` or ``RMSprop`` of Keras 3
            (``tf.keras.optimizers``), tf_keras (``tf_keras.optimizers``) or tf_keras legacy
            (``tf_keras.optimizers.legacy``), each updated with its own formulas (:class:`Flavor`);
            or SOK's ``sok.RowWiseAdagrad`` (one accumulator per row: a dynamic variable's rows grow
            by one column, not by its dimension).
            Its learning rate (or schedule, and legacy ``decay``) is read at each step, its other
            hyper-parameters when the wrapper is made; the step counter is the wrapper's own
            (:attr:`iterations`).
            Keras 3's ``LossScaleOptimizer`` around one of them is taken too (mixed precision with
            ``mixed_float16``): see "Loss scaling" below.
        check_finite: check every gradient of an :meth:`apply_gradients` call for NaN and Inf
            before any of them is applied (dynamic and dense variables alike); a non-finite one
            raises ``tf.errors.InvalidArgumentError`` naming its variable, eagerly and inside
            ``tf.function``, and no variable, optimizer state or step counter changes in that
            call. Off by default: as with plain Keras, non-finite gradients then reach the tables.
            The check reads every gradient value once more (one ``tf.debugging.check_numerics``
            per gradient).

    Raises:
        ValueError: the optimizer is not one of those.
        UnsupportedOptionError: (a ``ValueError``) it has an option the row-wise rule cannot
            honour: ``clipnorm``, ``clipvalue``, ``global_clipnorm``, ``weight_decay``, ``use_ema``,
            ``loss_scale_factor``, ``gradient_accumulation_steps``, ``gradient_transformers``.

    Loss scaling: given ``keras.optimizers.LossScaleOptimizer(inner)`` (scale the loss with its
    ``scale_loss``), the wrapper does that optimizer's work for every variable of an
    :meth:`apply_gradients` call: it divides the gradients by the scale the step's loss was scaled
    with, applies them (the dynamic variables' with ``inner``'s rule row-wise, the others with
    ``inner`` itself) only when every gradient of the call is finite (before unscaling, as Keras
    checks; with several ranks, on every rank, so that the ranks keep one scale), and moves the scale
    as Keras does: halved after a non-finite step, doubled after ``dynamic_growth_steps`` finite
    ones. :attr:`optimizer` is ``inner`` (its step counter, learning rate and state of static tables,
    which ``sok.dump`` saves); the scale is the ``LossScaleOptimizer``'s variables (which
    ``tf.train.Checkpoint`` saves). ``check_finite=True`` is refused with it (it raises where the
    scaling skips).

    Optimizer state of dynamic variables: it lives in the variable's rows, beside the embedding.
    Each slot is reachable as a :class:`~sparse_operation_kit.slot_view.DynamicSlot` (a view of
    its columns that ``sok.export`` and ``sok.assign`` accept) from :meth:`slot_view`, and, for a
    tf_keras legacy optimizer, as NVIDIA SOK exposes it: the wrapped optimizer's
    ``get_slot(var, name)`` and ``_slots[var._unique_id][name]`` give the view, under the legacy
    optimizer's slot names (``get_slot_names()``; they are added when the wrapper is made). Those
    views are not optimizer variables: the optimizer's ``variables()`` / ``weights`` do not list
    them, and ``tf.train.Checkpoint`` cannot save them (as the dynamic variable itself: use
    ``sok.dump``). :meth:`get_slot` of the wrapper returns ``(keys, values)`` instead, a copy of
    the slot of the local shard.

    Static tables (``sok.Variable`` shards) and other dense variables are updated by the wrapped
    optimizer itself (its ``apply_gradients``: its step counter, learning rate and state variables,
    which ``static_slots`` and ``sok.dump`` read). One exception, for speed: with Keras 3's ``Adagrad``,
    the steps of the ``sok.Variable`` shards whose gradients are ``tf.IndexedSlices`` are computed for
    the gradients' rows only, by one op for all of them, as Keras' TensorFlow backend computes them (the
    squared gradient added to the optimizer's accumulator, duplicate ids in turn; then ``lr * g /
    sqrt(accumulator + epsilon)`` at each id subtracted from the shard), where Keras' step computes
    ``sqrt(accumulator + epsilon)`` over the whole table: on the CPU the results are bitwise Keras' own
    (on a GPU, where the rows of repeated ids are added with atomics as Keras' scatter kernels do,
    within float rounding of them). They differ only where Keras' sparse division meets a zero or NaN
    ``sqrt(accumulator + epsilon)`` outside the batch (``epsilon=0`` with a zero accumulator, or a NaN
    already there): Keras then also writes to those rows (``0 / 0`` is NaN), the row-wise step leaves
    them as they were. The other optimizers keep Keras' step: Keras 3's SGD without momentum already
    writes only the gradient's rows (it scatter-subtracts ``lr * g``); with momentum, and Adam, Adamax,
    Adadelta, Ftrl, RMSprop, change rows whose gradient is zero.

    What the wrapper relies on of a dynamic variable is the contract in
    :class:`~sparse_operation_kit.dynamic_variable.DynamicVariable`'s docstring (``keys_of``, the
    table, ``optimizer_wrapper``, :func:`~sparse_operation_kit.dynamic_variable.distinct_index_of`
    for a gradient's indices). What ``sok.dump`` / ``sok.load`` rely on of the wrapper:
    :attr:`name`, :meth:`get_slot_names` (the slots' order in the rows), :meth:`attach`,
    :meth:`static_slots`, :attr:`iterations`, :attr:`optimizer` and :attr:`static_only`; of a
    variable, its ``optimizer_wrapper``.

    Example (stop at the first non-finite gradient, with the tables as they were)::

        opt = sok.OptimizerWrapper(tf.keras.optimizers.Adam(0.01), check_finite=True)
        try:
            opt.apply_gradients(zip(grads, variables))
        except tf.errors.InvalidArgumentError as error:
            # "... the gradient of sok_dynamic_Variable:0 is not finite ... : Tensor had NaN values"
            ...
    """

    def __init__(self, optimizer: Any, check_finite: bool = False) -> None:
        if not isinstance(check_finite, (bool, np.bool_)):
            raise TypeError(f"check_finite must be True or False, got {check_finite!r}")
        optimizer, self._loss_scale = _loss_scaled(optimizer)
        if check_finite and self._loss_scale is not None:
            raise ValueError(
                "check_finite=True with a LossScaleOptimizer: the loss scaling skips the steps whose gradients "
                "are not finite, where check_finite would raise; pass check_finite=False"
            )
        self._check_finite = bool(check_finite)
        self._optimizer = optimizer
        self._settings = Settings(optimizer)
        self._rule = _rule_for(self._settings)
        for option in _UNSUPPORTED_OPTIONS:
            value = getattr(optimizer, option, None)
            if value:
                raise UnsupportedOptionError(
                    f"{self._settings.flavor.value} {type(optimizer).__name__}({option}={value!r}) is not supported "
                    f"for dynamic variables; create the optimizer without {option}"
                )
        self._iterations = tf.Variable(0, dtype=tf.int64, trainable=False, name="sok_optimizer_iterations")
        self._variables: dict[int, DynamicVariable] = {}
        self._slot_views: dict[Any, dict[str, DynamicSlot]] = {}
        self._static_only = False
        self._serial = next(_serials)
        if self._settings.legacy:  # NVIDIA SOK's wrapper makes the optimizer list its slot names at once
            names = optimizer._slot_names
            names.extend(name for name in self._exposed_slot_names() if name not in names)
        _WRAPPERS.add(self)

    @classmethod
    def for_static_state(cls, optimizer: Any) -> OptimizerWrapper:
        """A wrapper that only names and finds ``optimizer``'s state of static (dense) tables, for
        ``sok.dump`` / ``sok.load`` given a Keras optimizer that no ``OptimizerWrapper`` wraps: it
        updates nothing, has no step counter (:attr:`iterations` is None), is not found by
        :func:`wrappers_of`, and takes no dynamic variable's state.

        Raises:
            ValueError: the optimizer is not one the wrapper supports (:class:`OptimizerWrapper`).
        """
        wrapper = cls.__new__(cls)
        wrapper._check_finite = False
        wrapper._optimizer, wrapper._loss_scale = _loss_scaled(optimizer)
        optimizer = wrapper._optimizer
        wrapper._settings = Settings(optimizer)
        wrapper._rule = _rule_for(wrapper._settings)
        wrapper._iterations = None
        wrapper._variables = {}
        wrapper._slot_views = {}
        wrapper._static_only = True
        wrapper._serial = next(_serials)
        return wrapper

    @property
    def static_only(self) -> bool:
        """True for a :meth:`for_static_state` wrapper (it holds no dynamic variable's state)."""
        return self._static_only

    @property
    def optimizer(self) -> Any:
        """The wrapped Keras optimizer (a ``LossScaleOptimizer``'s inner one)."""
        return self._optimizer

    @property
    def loss_scale_optimizer(self) -> Any:
        """The ``LossScaleOptimizer`` given to the wrapper, or None."""
        return self._loss_scale

    def wraps(self, optimizer: Any) -> bool:
        """Whether ``optimizer`` is the one this wrapper was given (or, with loss scaling, its inner one)."""
        return optimizer is self._optimizer or (self._loss_scale is not None and optimizer is self._loss_scale)

    @property
    def check_finite(self) -> bool:
        """Whether :meth:`apply_gradients` refuses NaN and Inf gradients (see the class docstring)."""
        return self._check_finite

    @property
    def iterations(self) -> tf.Variable | None:
        """Steps applied to dynamic variables so far (None for a :meth:`for_static_state` wrapper)."""
        return self._iterations

    @property
    def lr(self) -> Any:
        return self._optimizer.learning_rate

    @property
    def name(self) -> str:
        """The optimizer's name in SOK checkpoints (``"Adagrad"``)."""
        return self._rule.name

    def get_slot_names(self) -> list[str]:
        """This wrapper's slot names, the same for every flavour (checkpoints use them): ``["m", "u"]``
        for Adamax, whose tf_keras legacy optimizer names them ``["m", "v"]``."""
        return [name for name, _ in self._rule.slots]

    def row_layout(self, dim: int) -> RowLayout:
        """Where the embedding and this wrapper's slots sit in the rows of a dynamic variable of
        dimension ``dim`` once attached (and the row widths of its checkpoint files).

        Example::

            sok.OptimizerWrapper(sok.RowWiseAdagrad(0.1)).row_layout(8).parts   # ((0, 8), (8, 9))
        """
        return self._rule.layout(dim)

    def _exposed_slot_names(self) -> list[str]:
        """The slot names the wrapped optimizer uses: tf_keras legacy ones for a legacy optimizer
        (its record's ``legacy_slots``), else this wrapper's."""
        if self._settings.legacy:
            return [OPTIMIZERS[self._rule.name].legacy_slots[name] for name, _ in self._rule.slots]
        return self.get_slot_names()

    def static_slots(self, var: Any, create: bool = False) -> dict[str, Any]:
        """The wrapped optimizer's state of a dense (static) variable that it updates, by this
        wrapper's slot names (so checkpoints name them as for dynamic variables); ``{}`` when the
        optimizer holds no state for it. ``create``: tf_keras legacy optimizers make the slots now
        (Keras 3 and tf_keras optimizers are built with all their variables at once: build them first).

        Example::

            state = wrapper.static_slots(table)      # {"m": <tf.Variable>, "v": <tf.Variable>}
        """
        names = self.get_slot_names()
        if not names:
            return {}
        optimizer, kind = self._optimizer, self._rule.name
        if self._settings.legacy:
            if create:
                optimizer._create_all_weights([var])
            try:
                return {name: optimizer.get_slot(var, OPTIMIZERS[kind].legacy_slots[name]) for name in names}
            except KeyError:
                return {}
        try:
            if hasattr(optimizer, "_get_variable_index"):  # Keras 3
                index = optimizer._get_variable_index(var)
            else:  # tf_keras
                index = optimizer._index_dict[optimizer._var_key(var)]
        except (KeyError, ValueError, AttributeError):
            return {}
        return {name: getattr(optimizer, OPTIMIZERS[kind].keras_slots[name])[index] for name in names}

    def attach(self, var: DynamicVariable) -> None:
        """Give ``var``'s rows this wrapper's state columns and bind the variable to this wrapper
        (its ``optimizer_wrapper``), once: :meth:`apply_gradients` calls it before a variable's
        first update, ``sok.load`` before it writes state columns. Each slot is then reachable as
        a :class:`DynamicSlot` (:meth:`slot_view`). Calling it again for the same variable does
        nothing.

        Raises:
            ValueError: this is a :meth:`for_static_state` wrapper; another wrapper is bound to
                ``var``; or the rows would be too wide for the embedding and its state.

        Example::

            wrapper.attach(v)                         # v's rows: [embedding | accumulator]
            assert v.optimizer_wrapper is wrapper
        """
        if id(var) in self._variables:
            return
        if self._static_only:
            raise ValueError(
                f"{var.name} is a sok.DynamicVariable, and no sok.OptimizerWrapper wraps "
                f"{type(self._optimizer).__name__} {self._optimizer!r}: its state of dynamic variables lives in "
                f"the wrapper; create the wrapper first (sok.OptimizerWrapper(optimizer)) and pass it or the "
                f"optimizer"
            )
        owner = var.optimizer_wrapper
        if owner is not None and owner is not self:
            raise ValueError(
                f"{var.name} is already updated by another sok.OptimizerWrapper ({owner.name}); its optimizer "
                f"state lives in its rows, so one wrapper per variable"
            )
        dim, old, layout = var.dimension, var.table_ref.storage, self.row_layout(var.dimension)
        width = layout.width
        if width > MAX_ROW_WIDTH:
            per_row = len(self._rule.per_row)  # slots of one float, the others as wide as the embedding
            widest = (MAX_ROW_WIDTH - per_row) // (1 + len(self._rule.slots) - per_row)
            raise ValueError(
                f"{var.name} (dimension {dim:,}) is too wide for {self.name}: its rows would hold the embedding "
                f"and {len(self._rule.slots)} state slot(s), {width:,} floats, beyond the {MAX_ROW_WIDTH:,} a "
                f"storage row takes; use a dimension of at most {widest:,} with this optimizer"
            )
        initializers = [var.embedding_initializer] + [
            inits.constant(value, columns=layout.columns(name)) for name, value in self._rule.slots
        ]
        if width != old.row_width:
            wide = create_storage(
                var.backend_type,
                row_width=width,
                key_dtype=old.key_dtype.name,
                initializer=initializers,
                device=old.device,
                name=var.name,
                **var.config_dict,
            )
            keys, values, scores = old.export(columns=layout.embedding)
            if keys.size:  # scores too: widening is no write (eviction order, incremental dumps)
                wide.import_batch(keys, values, scores, columns=layout.embedding)
            logger.debug("widened %s to %d columns for %s (%d rows copied)", var.name, width, self.name, keys.size)
            var.table_ref.swap(wide, initializers)
        var.bind_optimizer_wrapper(self)
        self._variables[id(var)] = var
        self._register_slots(var)

    def _register_slots(self, var: DynamicVariable) -> None:
        """One :class:`DynamicSlot` per slot of ``var``, in :attr:`_slots` under the wrapped
        optimizer's slot names; for a tf_keras legacy optimizer also in its own ``_slots`` (keyed
        as it keys its variables' slots), so that its ``get_slot(var, name)`` returns them. An
        optimizer without slots gets an empty entry, as NVIDIA SOK gives it."""
        layout = self.row_layout(var.dimension)
        views = {
            exposed: DynamicSlot(var, exposed, layout.columns(i))
            for i, exposed in enumerate(self._exposed_slot_names())
        }
        key = _var_key(var)
        self._slot_views[key] = views
        if self._settings.legacy:
            self._optimizer._slots.setdefault(key, {}).update(views)

    @staticmethod
    def _checked_gradient(grad: Any, var: DynamicVariable) -> indexed_slices_lib.IndexedSlices:
        """``grad`` with its width checked against the variable's dimension: a ValueError where the
        shapes are known now, an ``InvalidArgumentError`` (with the same message) where they are
        known only when the step runs."""
        if not isinstance(grad, indexed_slices_lib.IndexedSlices):
            raise TypeError(
                f"the gradient of {var.name} must be tf.IndexedSlices (from a lookup), got {type(grad).__name__}"
            )
        values, indices = tf.convert_to_tensor(grad.values), tf.convert_to_tensor(grad.indices)
        grad = indexed_slices_lib.IndexedSlices(values, indices, grad.dense_shape)
        dim, shape = var.dimension, values.shape
        message = (
            f"the gradient of {var.name} has values of shape {shape} but the variable has dimension {dim}: "
            f"expected one row of width {dim} per id (shape [n, {dim}]); pass the gradient of a lookup of "
            f"this variable"
        )
        if shape.rank is not None and (shape.rank == 0 or shape[-1] not in (None, dim)):
            raise ValueError(message)
        rows, ids = shape[:-1].num_elements() if shape.rank else None, indices.shape.num_elements()
        if rows is not None and ids is not None and rows != ids:
            raise ValueError(
                f"the gradient of {var.name} has {rows} rows (values of shape {shape}) but {ids} ids "
                f"(indices of shape {indices.shape}); expected one row of width {dim} per id"
            )
        if shape.rank is not None and shape[-1] is not None:
            return grad
        check = tf.debugging.assert_equal(tf.shape(values)[-1], dim, message=message)
        with tf.control_dependencies([check]):
            values = tf.identity(values)
        return indexed_slices_lib.IndexedSlices(values, indices, grad.dense_shape)

    def _finite_checks(self, pairs: list[tuple[Any, Any]]) -> tuple[list[tuple[Any, Any]], list[Tensor]]:
        """Each gradient through ``tf.debugging.check_numerics`` (its message names the variable),
        and the checks, which every update of the call waits for."""
        checked, checks = [], []
        for grad, var in pairs:
            sparse = isinstance(grad, indexed_slices_lib.IndexedSlices)
            values = _values(grad)
            if values.dtype.is_floating:
                values = tf.debugging.check_numerics(
                    values,
                    f"sok.OptimizerWrapper(check_finite=True): the gradient of {var.name} is not finite; "
                    f"no variable was updated by this apply_gradients call (find its source with "
                    f"tf.debugging.enable_check_numerics(); lower the learning rate, clip the gradients "
                    f"or scale the loss)",
                )
                checks.append(values)
            grad = indexed_slices_lib.IndexedSlices(values, grad.indices, grad.dense_shape) if sparse else values
            checked.append((grad, var))
        return checked, checks

    def _apply_dynamic(self, grad: Any, var: DynamicVariable, lr: Tensor, step: Tensor) -> None:
        dim = var.dimension
        layout = self.row_layout(dim)
        lib = tf_ops.library()
        with tf.device(var.table_device):  # every op of the update where the table is
            keys = tf.reshape(var.keys_of(grad.indices), [-1])
            values = tf.reshape(tf.cast(grad.values, tf.float32), [-1, dim])
            if self._rule.native is not None:
                rule, hyper = self._rule.native
                index = distinct_index_of(grad.indices)  # the lookup's, handed over in a graph; else indexed here
                distinct, positions = index if index is not None else lib.sok_unique_index(keys)
                # Either way SOK's own index of the keys: the op need not check the positions again.
                lib.sok_sparse_apply(
                    *var.table_inputs, distinct, positions, values, lr, rule=rule, hyper=list(hyper),
                    positions_checked=True,
                )  # fmt: skip
                return
            unique, summed = lib.sok_unique_sum(keys, values)
            rows = lib.sok_find_or_insert(*var.table_inputs, unique, col_begin=0, col_end=layout.width)
            weights, *states = layout.split(rows)
            new_w, new_slots = self._rule.update(weights, dict(zip(layout.slots, states)), summed, lr, step)
            new_rows = tf.concat([new_w] + [new_slots[name] for name in layout.slots], axis=1)
            lib.sok_insert_or_assign(*var.table_inputs, unique, new_rows, col_begin=0, col_end=layout.width)

    def apply_gradients(self, grads_and_vars: Iterable[tuple[Any, Any]], *args: Any, **kwargs: Any) -> None:
        """Update dynamic variables row-wise; pass every other pair to the wrapped optimizer.

        Every gradient of a dynamic variable is checked (type, width) before anything is updated;
        with ``check_finite``, every gradient is also checked for NaN and Inf first."""
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        # Refused before anything changes, the wrapped optimizer's step counter included.
        seen: set[int] = set()
        for _, v in pairs:
            if id(v) in seen:
                raise ValueError(
                    f"variable {v.name} appears twice in one apply_gradients call; sum its gradients first"
                )
            seen.add(id(v))
        pairs = [(self._checked_gradient(g, v), v) if isinstance(v, DynamicVariable) else (g, v) for g, v in pairs]
        self._check_half_tables([v for _, v in pairs])
        checks: list[Tensor] = []
        if self._check_finite:
            pairs, checks = self._finite_checks(pairs)
        dynamic = [(g, v) for g, v in pairs if isinstance(v, DynamicVariable)]
        others = [(g, v) for g, v in pairs if not isinstance(v, DynamicVariable)]
        for _, v in dynamic:
            self.attach(v)
        if self._loss_scale is not None:
            self._apply_loss_scaled(dynamic, others, *args, **kwargs)
            return
        # Eagerly the checks above have run (or raised); in a graph every update waits for them all.
        with tf.control_dependencies(checks):
            if others:
                with self._row_wise_static_tables():
                    self._optimizer.apply_gradients(others, *args, **kwargs)
            self._apply_dynamic_all(dynamic)

    def _check_half_tables(self, variables: list[Any]) -> None:
        """Refuses ``sok.Variable`` tables of float16 / bfloat16 rows unless the wrapped optimizer is
        ``sok.RowWiseAdagrad`` (float32 accumulators and a float32 step, the row rounded when it is
        stored): Keras' own optimizers keep their state in the variable's dtype and compute in it."""
        if isinstance(self._optimizer, RowWiseAdagrad) and self._settings.flavor is Flavor.KERAS:
            return
        for v in variables:
            if getattr(v, "is_sok_variable", False) and v.dtype.name != VALUE_DTYPE:
                raise ValueError(
                    f"sok.Variable {v.name} has {v.dtype.name} rows, which {type(self._optimizer).__name__} would "
                    f"update in {v.dtype.name} with {v.dtype.name} state; nothing was updated. Tables of float16 or "
                    f"bfloat16 rows are trained by sok.RowWiseAdagrad (float32 accumulators, the step in float32); "
                    f"use it, or make the table float32"
                )

    def _apply_dynamic_all(self, dynamic: list[tuple[Any, DynamicVariable]]) -> None:
        """One step of this wrapper's rule on every dynamic variable of ``dynamic`` (attached already)."""
        if not dynamic:
            return
        lr = self._settings.learning_rate(self._iterations)
        step = tf.cast(self._iterations + 1, tf.float32)
        for g, v in dynamic:
            self._apply_dynamic(g, v, lr, step)
        self._iterations.assign_add(1)

    def _apply_loss_scaled(
        self, dynamic: list[tuple[Any, Any]], others: list[tuple[Any, Any]], *args: Any, **kwargs: Any
    ) -> None:
        """apply_gradients under a LossScaleOptimizer (the class docstring's "Loss scaling"): one
        decision for every variable of the call, on every rank."""
        scaler = self._loss_scale
        if not scaler.built:  # as its own apply builds it: its scale and counter exist from now on
            scaler.build([v for _, v in others])
            scaler.built = True
        scale = tf.identity(scaler.dynamic_scale)  # the scale the loss was scaled with, read before it moves
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(_values(g))) for g, _ in dynamic + others])
        comm = communication.tool()
        if comm.num_ranks() > 1:  # each rank sees its own shards' gradients: the ranks decide together
            bad = exchange.of(comm).allreduce_sum(
                tf.cast(tf.logical_not(finite), tf.int32), name="sok.OptimizerWrapper: finite"
            )
            finite = tf.equal(bad, 0)
        unscaled_dynamic = [(_scaled(g, 1.0 / scale), v) for g, v in dynamic]
        unscaled_others = [(_scaled(g, 1.0 / scale), v) for g, v in others]

        def apply() -> Tensor:
            if unscaled_others:
                self._optimizer.apply_gradients(unscaled_others, *args, **kwargs)
            self._apply_dynamic_all(unscaled_dynamic)
            return self._grow_scale()

        tf.cond(finite, apply, self._shrink_scale)

    def _grow_scale(self) -> Tensor:
        """The LossScaleOptimizer's move of its scale after a finite step."""
        scaler = self._loss_scale
        grow = tf.equal(scaler.step_counter, scaler.dynamic_growth_steps - 1)
        scaler.dynamic_scale.assign(tf.where(grow, scaler.dynamic_scale * 2.0, scaler.dynamic_scale))
        scaler.step_counter.assign(tf.where(grow, tf.zeros_like(scaler.step_counter), scaler.step_counter + 1))
        return tf.constant(True)

    def _shrink_scale(self) -> Tensor:
        """The LossScaleOptimizer's move of its scale after a step with a non-finite gradient."""
        scaler = self._loss_scale
        scaler.step_counter.assign(tf.zeros_like(scaler.step_counter))
        scaler.dynamic_scale.assign(scaler.dynamic_scale * 0.5)
        return tf.constant(False)

    @contextlib.contextmanager
    def _row_wise_static_tables(self) -> Iterator[None]:
        """While the wrapped optimizer applies its step: if it is Keras 3's ``Adagrad`` (its own
        ``update_step``), its steps on ``sok.Variable`` shards with ``IndexedSlices`` gradients are
        collected and made at the end by one op for all of them (:func:`_adagrad_tables`); if it is
        ``sok.RowWiseAdagrad``, so are its steps on the gradients that come straight from
        ``sok.lookup_sparse`` (distinct rows). Every other variable and gradient keeps the
        optimizer's step."""
        optimizer = self._optimizer
        keras_adagrad = importlib.import_module("keras").optimizers.Adagrad
        step_of_class = getattr(type(optimizer), "update_step", None)  # tf_keras' legacy ones have none
        row_wise = step_of_class is RowWiseAdagrad.update_step
        if (
            self._settings.flavor is not Flavor.KERAS
            or not (row_wise or step_of_class is keras_adagrad.update_step)
            or self._loss_scale is not None  # its steps run inside the scaler's cond branch
        ):
            yield
            return
        keras_step = optimizer.update_step
        collected: list[tuple[tf.IndexedSlices, tf.Variable, Any]] = []

        def update_step(gradient: Any, variable: Any, learning_rate: Any) -> None:
            if (
                getattr(variable, "is_sok_variable", False)
                and isinstance(gradient, tf.IndexedSlices)
                and (not row_wise or _sok_gradient_output(gradient) is not None)
            ):
                collected.append((gradient, variable, learning_rate))
                return None
            return keras_step(gradient, variable, learning_rate)

        optimizer.update_step = update_step
        try:
            yield
            if collected:
                _adagrad_tables(optimizer, collected, row_wise)
        finally:
            del optimizer.update_step

    def slot_view(self, var: DynamicVariable, slot_name: str) -> DynamicSlot:
        """One optimizer slot of a dynamic variable this wrapper updates, as a :class:`DynamicSlot`
        that ``sok.export`` / ``sok.assign`` read and write (NVIDIA SOK's slot variable).

        Args:
            var: a ``sok.DynamicVariable`` this wrapper has updated (or loaded state into).
            slot_name: one of :meth:`get_slot_names`, or the wrapped optimizer's name of it (for a
                tf_keras legacy optimizer, e.g. Adamax's ``"v"`` for ``"u"``).

        Example::

            keys, m = sok.export(wrapper.slot_view(v, "m"))
        """
        names, exposed = self.get_slot_names(), self._exposed_slot_names()
        if slot_name not in names and slot_name not in exposed:
            raise ValueError(f"{self.name} has no slot {slot_name!r}; valid: {sorted(set(names) | set(exposed))}")
        if id(var) not in self._variables:
            raise ValueError(f"{var.name} has no {self.name} state yet: apply a gradient to it first")
        if slot_name not in exposed:
            slot_name = exposed[names.index(slot_name)]
        return self._slot_views[_var_key(var)][slot_name]

    @property
    def _slots(self) -> dict:
        """NVIDIA SOK's ``wrapper._slots``: the wrapped tf_keras legacy optimizer's ``_slots`` (its
        dense variables' slots and the :class:`DynamicSlot` views of dynamic ones), or for the other
        flavours the views alone, ``{var._unique_id: {slot name: DynamicSlot}}``."""
        return self._optimizer._slots if self._settings.legacy else self._slot_views

    def _create_slots(self, variables: Iterable[Any]) -> None:
        """NVIDIA SOK's ``wrapper._create_slots(vars)``: give each variable its optimizer state now
        (dynamic ones their state columns; with a tf_keras legacy optimizer, dense ones its slots)."""
        for var in variables:
            if isinstance(var, DynamicVariable):
                self.attach(var)
            elif self._settings.legacy:
                self.static_slots(var, create=True)

    def get_slot(self, var: DynamicVariable, slot_name: str) -> tuple[Tensor, Tensor]:
        """``(keys, values)`` of one optimizer slot of the variable's local shard: a copy.

        Unlike NVIDIA SOK's ``wrapper.get_slot``, which returns the slot variable, this returns its
        contents; :meth:`slot_view` (and the wrapped tf_keras legacy optimizer's ``get_slot``)
        returns the slot itself, for ``sok.export`` / ``sok.assign``."""
        names = self.get_slot_names()
        if slot_name not in names:
            raise ValueError(f"{self.name} has no slot {slot_name!r}; valid: {names}")
        return export(self.slot_view(var, slot_name))


def SGD(lr: float) -> OptimizerWrapper:  # noqa: N802 (SOK's name)
    """Plain SGD for dynamic variables: ``sok.SGD(0.1)``."""
    return OptimizerWrapper(tf.keras.optimizers.SGD(learning_rate=lr))
