"""``sok.Variable``: static model-parallel tables, one shard per rank.

* ``mode=None`` / ``"distributed"``: row ``i`` lives on rank ``i % n`` at local row ``i // n``.
* ``mode="localized:N"``: the whole table on rank N; an empty ``[0, dim]`` shard elsewhere.

The shard is an ordinary resource variable (plain Keras optimizers update it); ``sok.lookup_sparse``
does the distributed lookup.

With several ranks, creating a variable is a collective call: the ranks allgather a fingerprint of
it (rows, dim, mode, dtype, and a digest of an explicit ``initial_value``) and every rank raises when
they differ, before any rank uses a shard that does not match the others'. Random ``initializer``
values are not compared: each rank keeps only its own rows of them.

Example (2 ranks)::

    v = sok.Variable(np.arange(4 * 3).reshape(4, 3), dtype=tf.float32)
    # rank 0 holds [[0, 1, 2], [6, 7, 8]], rank 1 holds [[3, 4, 5], [9, 10, 11]]
"""

from __future__ import annotations

import itertools
import re
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops

from sparse_operation_kit import communication
from sparse_operation_kit.dtypes import STATIC_ROW_DTYPES, VALUE_DTYPE

__all__ = ["Variable", "DistributedVariable", "LocalizedVariable"]

_counter = itertools.count()
_LOCALIZED = re.compile(r"^localized:(\d+)$")


def _global_value(initial_value: Any, shape: Any, initializer: Any, dtype: Any) -> tf.Tensor:
    value = _initial_value(initial_value, shape, initializer, _row_dtype(dtype))
    if value.dtype.name not in STATIC_ROW_DTYPES:
        raise ValueError(
            f"sok.Variable rows of dtype {value.dtype.name} are not supported; valid: "
            f"{', '.join(STATIC_ROW_DTYPES)}. Pass dtype= one of them or leave dtype unset (a NumPy or list "
            f"initial_value of numbers is then converted to {VALUE_DTYPE}; cast a tensor first); under a Keras "
            f"mixed-precision policy the tables keep their dtype and lookups return the compute dtype"
        )
    return value


def _row_dtype(dtype: Any) -> tf.DType | None:
    """``dtype`` as a TensorFlow dtype (None: unset); a dtype rows cannot have is refused by name."""
    if dtype is None:
        return None
    try:
        resolved = tf.as_dtype(dtype)
    except TypeError:
        resolved = None
    if resolved is None or resolved.name not in STATIC_ROW_DTYPES:
        raise ValueError(
            f"sok.Variable dtype={dtype!r} is not supported; valid: {', '.join(STATIC_ROW_DTYPES)} (rows of "
            f"float16 or bfloat16 are summed and updated in float32)"
        )
    return resolved


def _initial_value(initial_value: Any, shape: Any, initializer: Any, dtype: tf.DType | None) -> tf.Tensor:
    """The table's global value; rows of float16 / bfloat16 from numbers or an initializer are made in
    float32 first and rounded to nearest even (the values of a float32 table, rounded)."""
    half = dtype is not None and dtype != tf.float32
    if initial_value is not None:
        if callable(initial_value):
            initial_value = initial_value()
        given = getattr(initial_value, "dtype", None)
        if isinstance(initial_value, (tf.Tensor, tf.Variable)) and dtype is not None and given != dtype:
            raise ValueError(
                f"initial_value is a {given.name} tensor and dtype={dtype.name}: cast it first "
                f"(tf.cast(initial_value, tf.{dtype.name})), or leave dtype unset to keep {given.name}"
            )
        if _untyped_numbers(initial_value) and (dtype is None or half):
            value = tf.cast(tf.convert_to_tensor(initial_value, dtype=VALUE_DTYPE), dtype or VALUE_DTYPE)
        else:
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
    value = tf.convert_to_tensor(initializer(shape=shape, dtype=tf.float32))  # dtype: None or a row dtype
    return tf.cast(value, dtype) if half else value


def _untyped_numbers(initial_value: Any) -> bool:
    """Whether ``initial_value`` is a list or NumPy array of numbers (integers or floats), whose dtype
    the caller did not choose for the table: NVIDIA's own scripts write ``sok.Variable([[3, 4, 5]])``."""
    if isinstance(initial_value, (tf.Tensor, tf.Variable)):
        return False
    kind = np.asarray(initial_value).dtype.kind
    return kind in "iuf"


#: The fields of a variable's fingerprint, in the order of the allgathered record.
_FIELDS = ("created", "rows", "dim", "mode", "dtype", "initial_value given", "initial_value digest")


def _digest(value: tf.Tensor) -> int:
    """A signed 64-bit digest of an eager tensor's dtype, shape and bytes (0 when not eager)."""
    if not hasattr(value, "numpy"):
        return 0
    data = np.ascontiguousarray(value.numpy())
    return communication.fingerprint(f"{data.dtype.str}{data.shape}".encode(), data.tobytes())


def _describe(field: str, value: int) -> str:
    if field == "mode":
        return "distributed" if value < 0 else f"localized:{value}"
    if field == "dtype":
        return tf.as_dtype(int(value)).name if value > 0 else "?"
    if field in ("created", "initial_value given"):
        return "yes" if value else "no"
    if field == "initial_value digest":
        return f"{value & (2**64 - 1):016x}"
    return str(value)


def _global_value_agreed(
    name: str, target: int, initial_value: Any, shape: Any, initializer: Any, dtype: Any
) -> tf.Tensor:
    """The full table (``_global_value``), after the ranks agreed that they create the same one.

    With one rank, just the value. With several, one allgather of each rank's fingerprint (also when
    this rank's value failed, so that no rank waits for it); every rank raises when they differ.
    """
    comm = communication.tool()
    n = comm.num_ranks()
    if n == 1:
        return _global_value(initial_value, shape, initializer, dtype)
    value, failure = None, None
    try:
        value = _global_value(initial_value, shape, initializer, dtype)
    except (ValueError, TypeError, tf.errors.OpError) as error:
        failure = error
    record = [0, 0, 0, target, 0, 0, 0]
    if value is not None:
        explicit = initial_value is not None
        digest = _digest(value) if explicit else 0
        record = [
            1,
            int(value.shape[0]),
            int(value.shape[1]),
            target,
            value.dtype.as_datatype_enum,
            int(explicit),
            digest,
        ]
    with tf.init_scope():
        gathered = comm.allgather(
            tf.constant(record, tf.int64), name=f"sok.Variable({name}): allgather of its fingerprint"
        )
        table = np.asarray(gathered).reshape(n, len(_FIELDS))
    if failure is not None:
        raise failure
    failed = [r for r in range(n) if not table[r, 0]]
    if failed:
        raise ValueError(
            f"sok.Variable {name!r} could not be created on rank(s) {failed} (see their errors), so it is not "
            f"created on any rank; every rank must create the same variables in the same order"
        )
    differences = []
    for j, field in enumerate(_FIELDS[1:], start=1):
        if field == "initial_value digest" and not table[:, _FIELDS.index("initial_value given")].all():
            continue  # random initializers: each rank keeps only its own rows
        if len(set(table[:, j].tolist())) > 1:
            per_rank = ", ".join(f"rank {r}: {_describe(field, int(table[r, j]))}" for r in range(n))
            differences.append(f"{field} differs ({per_rank})")
    if differences:
        raise ValueError(
            f"sok.Variable {name!r} differs between the ranks: {'; '.join(differences)}. Every rank must create "
            f"it with the same shape, mode, dtype and initial_value (broadcast a random initial_value from one "
            f"rank first, e.g. hvd.broadcast(value, 0), or pass shape= and initializer= instead)"
        )
    return value


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
        name = name or f"sok_static_Variable_{next(_counter)}"
        value = _global_value_agreed(name, -1, initial_value, shape, initializer, dtype)
        self._create(
            # Rows g, g + n, ...: none on a rank beyond the table's last row (a 1-row table at np 3).
            tf.gather(value, tf.range(g, max(g, int(value.shape[0])), n, dtype=tf.int64)),
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
        name = name or f"sok_static_Variable_{next(_counter)}"
        value = _global_value_agreed(name, target, initial_value, shape, initializer, dtype)
        self._create(value if g == target else value[:0], value.shape, target, dtype, name, trainable, kwargs)

    def key_map(self, indices: Any) -> Any:
        return indices


def Variable(*args: Any, mode: str | None = None, **kwargs: Any) -> DistributedVariable | LocalizedVariable:  # noqa: N802
    """A static model-parallel table: ``sok.Variable(initial_value, dtype=..., mode=None | "distributed" |
    "localized:N")``, or ``shape=[rows, dim]`` with ``initializer``. Every rank must pass the same
    initial value (broadcast it first if it is random): with several ranks, every rank raises a
    ValueError naming what differs (shape, mode, dtype or initial_value).

    Rows are float32 unless ``dtype`` is ``tf.float16`` or ``tf.bfloat16``: half-width rows that
    lookups read widened to float32 and sum in float32 (the output is float32), and that
    ``sok.RowWiseAdagrad`` updates in float32 with float32 accumulators, storing each row rounded to
    nearest even (initial values and initializers are made in float32 and rounded the same way). A
    list or NumPy array of numbers given without ``dtype`` is converted to float32 (NVIDIA SOK kept
    its dtype, e.g. int64 for ``np.arange``); a tensor of another dtype, or a ``dtype`` outside
    those three, is refused where the table is made.

    Example::

        v = sok.Variable([[3, 4, 5], [6, 7, 8]])   # float32 rows [[3., 4., 5.], [6., 7., 8.]]
        h = sok.Variable(shape=[1000, 128], initializer="uniform", dtype=tf.bfloat16)  # half the bytes
    """
    if mode is None or mode == "distributed":
        return DistributedVariable(*args, **kwargs)
    match = _LOCALIZED.match(mode) if isinstance(mode, str) else None
    if match is None:
        raise ValueError(f"mode {mode!r} is not valid; valid: None, 'distributed' or 'localized:N' (N a rank)")
    return LocalizedVariable(int(match.group(1)), *args, **kwargs)


def is_static(param: Any) -> bool:
    return isinstance(param, _StaticVariable)
