"""``sok.RowWiseAdagrad``: Adagrad with one accumulator per embedding row (FBGEMM's row-wise Adagrad).

Keras' Adagrad keeps one accumulator per element: as much memory again as the table. Row-wise
Adagrad keeps one float per row, the running sum of the mean squared gradient of that row, and
scales the whole row's step by it (TorchRec / FBGEMM ``EXACT_ROWWISE_ADAGRAD``, their default for
embedding tables)::

    acc[i] += mean_j(g[i, j] ** 2)
    w[i]   -= lr * g[i] / (sqrt(acc[i]) + epsilon)

with the gradients of repeated ids summed first. A table of dimension ``dim`` then needs ``dim``
times less optimizer memory. It is a Keras 3 optimizer: give it to ``sok.OptimizerWrapper`` for
SOK's tables (``sok.DynamicVariable`` rows keep the accumulator as one column beside the
embedding; ``sok.Variable`` shards get a ``[rows, 1]`` accumulator), or use it alone on any
variable. A variable of rank 2 or more is updated per row (its first axis, the mean over the
others); below that, element-wise, as Adagrad with epsilon after the square root. A variable of
float16 or bfloat16 (``sok.Variable(dtype=tf.bfloat16)``) gets float32 accumulators and its step
in float32, the row stored rounded to nearest even (as SOK's fused kernels do).

Example::

    opt = sok.OptimizerWrapper(sok.RowWiseAdagrad(learning_rate=0.01))
    opt.apply_gradients(zip(grads, tables))
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

__all__ = ["RowWiseAdagrad"]


def row_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The accumulator's shape for a variable of ``shape``: ``[rows, 1, ...]`` from rank 2 on.

    Example::

        >>> row_shape((1000, 64)), row_shape((64,))
        ((1000, 1), (64,))
    """
    return tuple(shape) if len(shape) < 2 else (shape[0],) + (1,) * (len(shape) - 1)


def state_dtype(dtype: tf.DType) -> tf.DType:
    """The dtype of the accumulators and of the step's arithmetic for a variable of ``dtype``:
    float32 for half-width floats, else ``dtype``."""
    return tf.float32 if dtype in (tf.float16, tf.bfloat16) else dtype


def _gatherable(variable: Any) -> Any:
    """What ``tf.gather`` reads rows of without copying the whole variable: a Keras variable's
    TensorFlow variable, or the (TensorFlow) variable itself."""
    return variable.value if isinstance(variable, keras.Variable) else variable


def _row_mean_square(g: tf.Tensor) -> tf.Tensor:
    """Each row's mean of ``g ** 2`` over every axis but the first (``g ** 2`` below rank 2)."""
    rank = g.shape.rank
    if rank is not None and rank < 2:
        return tf.square(g)
    return tf.reduce_mean(tf.square(g), axis=list(range(1, rank)), keepdims=True)


@keras.saving.register_keras_serializable(package="sok")
class RowWiseAdagrad(keras.optimizers.Adagrad):
    """Adagrad with one accumulator per row (see the module docstring for the rule).

    Args:
        learning_rate: a float, a ``keras.optimizers.schedules.LearningRateSchedule`` or a
            callable, as Keras' optimizers take.
        initial_accumulator_value: the accumulators' starting value, >= 0.
        epsilon: added to the square root of the accumulator, >= 0.
        **kwargs: Keras optimizer options (``name``, ...). ``sok.OptimizerWrapper`` refuses the
            ones its row-wise rule cannot honour (clipping, weight decay, EMA, ...), as for the
            other optimizers.

    Raises:
        ValueError: ``initial_accumulator_value`` or ``epsilon`` is negative.

    Example::

        opt = sok.RowWiseAdagrad(learning_rate=0.05, epsilon=1e-8)
        opt.apply_gradients(zip(grads, variables))
    """

    def __init__(
        self,
        learning_rate: Any = 0.001,
        initial_accumulator_value: float = 0.1,
        epsilon: float = 1e-7,
        name: str = "row_wise_adagrad",
        **kwargs: Any,
    ) -> None:
        for what, value in (("initial_accumulator_value", initial_accumulator_value), ("epsilon", epsilon)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
                raise ValueError(f"RowWiseAdagrad {what} must be a number >= 0, got {value!r}")
        super().__init__(
            learning_rate=learning_rate,
            initial_accumulator_value=initial_accumulator_value,
            epsilon=epsilon,
            name=name,
            **kwargs,
        )

    def build(self, var_list: list[Any]) -> None:
        if self.built:
            return
        keras.optimizers.Optimizer.build(self, var_list)
        initializer = keras.initializers.Constant(self.initial_accumulator_value)
        self._accumulators = [
            self.add_variable(
                shape=row_shape(tuple(var.shape)),
                initializer=initializer,
                dtype=state_dtype(tf.as_dtype(var.dtype)),
                name=f"{var.name.split(':')[0].replace('/', '_')}_accumulator",
            )
            for var in var_list
        ]

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        """One step of ``variable`` (its rows of an ``IndexedSlices`` gradient only, repeated ids summed),
        in :func:`state_dtype`'s arithmetic."""
        dtype = tf.as_dtype(variable.dtype)
        compute = state_dtype(dtype)
        lr = tf.cast(learning_rate, compute)
        accumulator = self._accumulators[self._get_variable_index(variable)]
        if isinstance(gradient, tf.IndexedSlices):
            ids, positions = tf.unique(gradient.indices)
            summed = tf.math.unsorted_segment_sum(tf.cast(gradient.values, compute), positions, tf.size(ids))
            # the accumulator's rows of the step only (a sparse read, no copy of the whole variable)
            rows = tf.gather(_gatherable(accumulator), ids) + _row_mean_square(summed)
            self.assign(accumulator, tf.IndexedSlices(rows, ids))
            step = lr * summed / (tf.sqrt(rows) + self.epsilon)
            if compute == dtype:
                self.assign_sub(variable, tf.IndexedSlices(step, ids))
            else:  # the row in float32, stored rounded
                current = tf.cast(tf.gather(_gatherable(variable), ids), compute)
                self.assign(variable, tf.IndexedSlices(tf.cast(current - step, dtype), ids))
            return
        gradient = tf.cast(gradient, compute)
        self.assign_add(accumulator, _row_mean_square(gradient))
        step = lr * gradient / (tf.sqrt(tf.convert_to_tensor(accumulator)) + self.epsilon)
        if compute == dtype:
            self.assign_sub(variable, step)
        else:
            self.assign(variable, tf.cast(tf.cast(tf.convert_to_tensor(variable), compute) - step, dtype))
