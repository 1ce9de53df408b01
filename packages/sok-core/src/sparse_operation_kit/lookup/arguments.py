"""The arguments of ``sok.lookup_sparse``, checked on each rank before anything is exchanged.

Each check raises at once (before any collective, so every rank that makes the same mistake fails
the same way): wrong types, lengths or dtypes, combiners outside ``COMBINERS``, SparseTensor row
indices outside the batch, localized tables on ranks that do not exist.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from sparse_operation_kit.distributed_variable import DistributedVariable, LocalizedVariable
from sparse_operation_kit.dtypes import STATIC_ROW_DTYPES
from sparse_operation_kit.dynamic_variable import DynamicVariable

__all__ = [
    "COMBINERS",
    "ID_DTYPES",
    "as_list",
    "check_id_dtype",
    "combiner",
    "flag",
    "ragged",
    "subset",
    "table_kind",
    "validate_placement",
]

#: Combiner names (case-insensitive; "average" is SOK's alias of "mean").
COMBINERS = ("sum", "mean", "sqrtn")
_ALIASES = {"average": "mean"}


def combiner(name: Any, index: int) -> str:
    if not isinstance(name, str) or _ALIASES.get(name.lower(), name.lower()) not in COMBINERS:
        raise ValueError(f"combiners[{index}] = {name!r} is not valid; valid: {', '.join(COMBINERS)} (any case)")
    return _ALIASES.get(name.lower(), name.lower())


def ragged(ids: Any, index: int, what: str) -> tf.RaggedTensor:
    if isinstance(ids, tf.SparseTensor):
        if ids.shape.rank not in (None, 2):
            raise ValueError(f"{what}[{index}] must be a 2-D SparseTensor, got rank {ids.shape.rank}")
        return tf.RaggedTensor.from_sparse(_checked_rows(ids, f"{what}[{index}]"))
    if isinstance(ids, tf.RaggedTensor):
        if ids.ragged_rank != 1 or ids.shape.rank != 2:
            raise ValueError(f"{what}[{index}] must be a 2-D RaggedTensor (ragged_rank 1), got shape {ids.shape}")
        return ids
    raise TypeError(f"{what}[{index}] must be a tf.SparseTensor or tf.RaggedTensor, got {type(ids).__name__}")


def _checked_rows(sparse: tf.SparseTensor, what: str) -> tf.SparseTensor:
    """``sparse`` after checking that its row indices (the samples) are in [0, dense_shape[0]):
    eagerly a ValueError; inside tf.function an assert that gates the values."""
    rows, nrows = sparse.indices[:, 0], sparse.dense_shape[0]
    fix = f"the row index of each id is its sample: 0 .. dense_shape[0] - 1; fix how {what} is built"
    if isinstance(rows, tf.Tensor) and hasattr(rows, "numpy") and tf.executing_eagerly():
        values, limit = rows.numpy(), int(nrows)
        bad = ((values < 0) | (values >= limit)).nonzero()[0]
        if bad.size:
            raise ValueError(
                f"{what} has row index {int(values[bad[0]])!r} at indices[{int(bad[0])}] ({bad.size} such), outside "
                f"[0, {limit}) (dense_shape[0] = {limit}); {fix}"
            )
        return sparse
    inside = tf.reduce_all((rows >= 0) & (rows < nrows))
    check = tf.debugging.Assert(
        inside,
        [
            f"{what} has row indices outside [0, dense_shape[0]); {fix}. dense_shape[0] and the smallest and largest "
            f"row index follow:",
            nrows,
            tf.reduce_min(rows),
            tf.reduce_max(rows),
        ],
    )
    with tf.control_dependencies([check]):
        return tf.SparseTensor(tf.identity(sparse.indices), sparse.values, sparse.dense_shape)


#: The id dtypes sok.lookup_sparse takes (and, for a dynamic table of uint64 keys, uint64).
ID_DTYPES = ("int32", "int64")


def check_id_dtype(ids: tf.RaggedTensor, index: int, param: Any, kind: str) -> None:
    valid = ID_DTYPES + (("uint64",) if kind == "dynamic" and param.key_type == tf.uint64 else ())
    dtype = ids.dtype
    if dtype.name in valid:
        return
    if dtype.is_integer:
        fix = "cast them: tf.cast(ids, tf.int64)"
    elif dtype == tf.string:
        fix = (
            "ids are row numbers (or keys of a dynamic table), not strings: map the strings to int64 first "
            "(tf.keras.layers.StringLookup, or tf.strings.to_hash_bucket_fast for a sok.DynamicVariable)"
        )
    else:
        fix = (
            "ids are row numbers (or keys of a dynamic table), not floats or bools: make them int64 where they "
            "are built (tf.cast(ids, tf.int64) when they hold whole numbers)"
        )
    raise TypeError(
        f"sp_ids[{index}] (for params[{index}], {param.name}) has dtype {dtype.name}; ids must be "
        f"{' or '.join(valid)}; {fix}"
    )


def table_kind(param: Any, index: int) -> str:
    if isinstance(param, DynamicVariable):
        return "dynamic"
    if isinstance(param, (DistributedVariable, LocalizedVariable)):
        if param.dtype.name not in STATIC_ROW_DTYPES:
            raise TypeError(
                f"params[{index}] ({param.name}) has dtype {param.dtype.name}; sok.Variable rows must be "
                f"{', '.join(STATIC_ROW_DTYPES)}: create it with one of them"
            )
        return "localized" if isinstance(param, LocalizedVariable) else "distributed"
    raise TypeError(
        f"params[{index}] must be a sok.Variable or sok.DynamicVariable, got {type(param).__name__}; "
        f"for a plain tf.Variable use tf.nn.embedding_lookup_sparse"
    )


def as_list(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def validate_placement(params: Sequence[Any], kinds: Sequence[str], n: int) -> None:
    for i, (param, kind) in enumerate(zip(params, kinds)):
        if kind in ("dynamic", "localized") and param.target_gpu >= n:
            raise ValueError(
                f"params[{i}] ({param.name}) is localized on rank {param.target_gpu}, but there are only "
                f"{n} rank(s); valid: localized:0 .. localized:{n - 1}"
            )


def flag(value: Any, name: str) -> bool:
    """``value`` as a bool: True, False (NumPy's too) or the ints 1 and 0."""
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, (int, np.integer)) and value in (0, 1)):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {value!r}")


def subset(values: Sequence[Any] | None, indices: Sequence[int]) -> list[Any] | None:
    """The entries of ``values`` at ``indices`` (None stays None)."""
    return None if values is None else [values[i] for i in indices]
