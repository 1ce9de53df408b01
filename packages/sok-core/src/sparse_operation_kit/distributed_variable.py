"""``sok.Variable``: static model-parallel tables, one shard per rank.

* ``mode=None`` / ``"distributed"``: row ``i`` lives on rank ``i % n`` at local row ``i // n``.
* ``mode="localized:N"``: the whole table on rank N; an empty ``[0, dim]`` shard elsewhere.

The shard is an ordinary resource variable (plain Keras optimizers update it); ``sok.lookup_sparse``
does the distributed lookup.

Example (2 ranks)::

    v = sok.Variable(np.arange(4 * 3).reshape(4, 3), dtype=tf.float32)
    # rank 0 holds [[0, 1, 2], [6, 7, 8]], rank 1 holds [[3, 4, 5], [9, 10, 11]]
"""

from __future__ import annotations

import itertools
import re
from typing import Any

import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops

from sparse_operation_kit import communication

__all__ = ["Variable", "DistributedVariable", "LocalizedVariable"]

_counter = itertools.count()
_LOCALIZED = re.compile(r"^localized:(\d+)$")


def _global_value(initial_value: Any, shape: Any, initializer: Any, dtype: Any) -> tf.Tensor:
    if initial_value is not None:
        if callable(initial_value):
            initial_value = initial_value()
        value = tf.convert_to_tensor(initial_value, dtype=dtype)
        if value.shape.rank == 1:
            value = tf.reshape(value, [1, -1])
        if value.shape.rank != 2:
            raise ValueError(f"initial_value must have rank 2 [rows, dim] (or 1), got shape {value.shape}")
        return value
    if shape is None or initializer is None:
        raise ValueError("sok.Variable needs initial_value, or shape=[rows, dim] and an initializer")
    shape = tf.TensorShape(shape)
    if shape.rank != 2 or not shape.is_fully_defined():
        raise ValueError(f"shape must be [rows, dim], got {shape}")
    if isinstance(initializer, str):
        initializer = tf.keras.initializers.get(initializer)
    return tf.convert_to_tensor(initializer(shape=shape, dtype=dtype or tf.float32))


class _StaticVariable(resource_variable_ops.ResourceVariable):
    """A shard of a static SOK table (common part of the two layouts)."""

    is_sok_variable = True

    def _create(
        self,
        local: tf.Tensor,
        global_shape: tf.TensorShape,
        target_gpu: int,
        dtype: Any,
        name: str | None,
        trainable: bool,
        kwargs: dict,
    ) -> None:
        super().__init__(
            initial_value=local,
            dtype=dtype,
            name=name or f"sok_static_Variable_{next(_counter)}",
            trainable=trainable,
            **kwargs,
        )
        self._global_shape = global_shape
        self._target_gpu = target_gpu
        self._rank = communication.rank()
        self._num_ranks = communication.num_ranks()

    @property
    def global_shape(self) -> tf.TensorShape:
        return self._global_shape

    @property
    def global_gpu_id(self) -> int:
        return self._rank

    @property
    def num_gpus(self) -> int:
        return self._num_ranks

    @property
    def target_gpu(self) -> int:
        return self._target_gpu

    @property
    def dimension(self) -> int:
        return int(self._global_shape[1])

    def is_static(self) -> bool:
        return True


class DistributedVariable(_StaticVariable):
    """Row ``i`` on rank ``i % n`` at local row ``i // n``."""

    def __init__(
        self,
        initial_value: Any = None,
        shape: Any = None,
        initializer: Any = None,
        dtype: Any = None,
        name: str | None = None,
        trainable: bool = True,
        **kwargs: Any,
    ) -> None:
        n, g = communication.num_ranks(), communication.rank()
        value = _global_value(initial_value, shape, initializer, dtype)
        self._create(
            tf.gather(value, tf.range(g, int(value.shape[0]), n, dtype=tf.int64)),
            value.shape,
            -1,
            dtype,
            name,
            trainable,
            kwargs,
        )

    def key_map(self, indices: Any) -> Any:
        """Local rows of global ids (owned by this rank)."""
        return indices // self._num_ranks


class LocalizedVariable(_StaticVariable):
    """The whole table on rank ``target``; ``[0, dim]`` elsewhere."""

    def __init__(
        self,
        target: int,
        initial_value: Any = None,
        shape: Any = None,
        initializer: Any = None,
        dtype: Any = None,
        name: str | None = None,
        trainable: bool = True,
        **kwargs: Any,
    ) -> None:
        n, g = communication.num_ranks(), communication.rank()
        if target >= n:
            raise ValueError(
                f"mode 'localized:{target}' names rank {target}, but there are only {n} rank(s); "
                f"valid: localized:0 .. localized:{n - 1}"
            )
        value = _global_value(initial_value, shape, initializer, dtype)
        self._create(value if g == target else value[:0], value.shape, target, dtype, name, trainable, kwargs)

    def key_map(self, indices: Any) -> Any:
        return indices


def Variable(*args: Any, mode: str | None = None, **kwargs: Any) -> DistributedVariable | LocalizedVariable:  # noqa: N802
    """A static model-parallel table: ``sok.Variable(initial_value, dtype=..., mode=None | "distributed" |
    "localized:N")``, or ``shape=[rows, dim]`` with ``initializer``. Every rank must pass the same
    initial value (broadcast it first if it is random)."""
    if mode is None or mode == "distributed":
        return DistributedVariable(*args, **kwargs)
    match = _LOCALIZED.match(mode) if isinstance(mode, str) else None
    if match is None:
        raise ValueError(f"mode {mode!r} is not valid; valid: None, 'distributed' or 'localized:N' (N a rank)")
    return LocalizedVariable(int(match.group(1)), *args, **kwargs)


def is_static(param: Any) -> bool:
    return isinstance(param, _StaticVariable)
