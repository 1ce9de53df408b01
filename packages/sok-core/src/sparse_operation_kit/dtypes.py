"""Key and value dtypes of storages: the one list of what is supported, as NumPy names."""

from __future__ import annotations

import numpy as np

#: Key dtypes every storage backend must accept, in the order of the C ABI's ``sok_key_type``.
KEY_DTYPES: tuple[str, ...] = ("int64", "uint64", "int32")

#: The dtype of embedding rows (and of optimizer state in the same rows).
VALUE_DTYPE: str = "float32"

#: The dtypes a static table's rows (``sok.Variable(dtype=...)``) may have, float32 first (the default).
#: Rows of the others are read widened to float32, summed and updated in float32 (the optimizer's
#: state stays float32) and stored rounded to nearest even: the kernels' list is ``RowType`` in
#: ``csrc/tf_ops/gpu/row_type.h``.
STATIC_ROW_DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")

#: The dtype of per-row scores (timestamps, frequencies or caller scores).
SCORE_DTYPE: str = "uint64"


def normalize_key_dtype(dtype: object) -> np.dtype:
    """The NumPy dtype of a key dtype given as a name, NumPy dtype or TensorFlow dtype.

    Example::

        >>> normalize_key_dtype("int64")
        dtype('int64')
    """
    name = getattr(dtype, "name", None) if not isinstance(dtype, str) else dtype
    try:
        resolved = np.dtype(name if name is not None else dtype)
    except TypeError:
        resolved = None
    if resolved is None or resolved.name not in KEY_DTYPES:
        raise ValueError(f"key dtype {dtype!r} is not supported; valid: {', '.join(KEY_DTYPES)}")
    return resolved
