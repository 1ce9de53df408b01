"""Checks of arguments that many modules share: one definition of "an integer >= 1".

Example::

    >>> positive_int(np.int64(8), "row_width")
    8
    >>> positive_int(True, "row_width")
    Traceback (most recent call last):
    ValueError: row_width must be an integer >= 1, got True
"""

from __future__ import annotations

import numpy as np

__all__ = ["is_positive_int", "positive_int"]


def is_positive_int(value: object, *, numpy: bool = True) -> bool:
    """Whether ``value`` is an integer >= 1: a Python ``int`` or, unless ``numpy`` is False, a
    NumPy integer. A bool is not one (``True`` is an ``int`` to Python, not a count to a caller).

    Args:
        value: what a caller passed.
        numpy: accept NumPy integers; pass False where the value is kept as it is and must stay a
            Python ``int`` (written to JSON, for one).
    """
    types = (int, np.integer) if numpy else int
    return isinstance(value, types) and not isinstance(value, bool) and value >= 1


def positive_int(value: object, what: str, *, numpy: bool = True) -> int:
    """``value`` as a Python ``int``, once :func:`is_positive_int` holds.

    Args:
        value: what a caller passed.
        what: the argument's name in the error, e.g. ``"row_width"``.
        numpy: accept NumPy integers (returned as Python ints).

    Raises:
        ValueError: ``value`` is not an integer >= 1; the message names ``what`` and the value.
    """
    if not is_positive_int(value, numpy=numpy):
        raise ValueError(f"{what} must be an integer >= 1, got {value!r}")
    return int(value)
