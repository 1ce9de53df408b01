"""Asserts of the lookup's checks that raise at once when eager and gate the graph otherwise.

Example::

    check = raise_unless(total <= limit, message)   # None when eager (it raised or passed)
    with tf.control_dependencies([] if check is None else [check]):
        ...
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

__all__ = ["gate", "raise_unless"]


def raise_unless(condition: tf.Tensor, message: tf.Tensor) -> tf.Operation | None:
    """An InvalidArgumentError with the string tensor ``message`` unless ``condition``: raised now
    when eager, else the assert op to gate on."""
    if tf.executing_eagerly():
        if not bool(condition):
            raise tf.errors.InvalidArgumentError(None, None, message.numpy().decode(errors="replace"))
        return None
    return tf.debugging.Assert(condition, [message])


def gate(ok: tf.Tensor, report: Callable[[], tf.Tensor]) -> tf.Tensor:
    """``ok``, after ``report`` (which makes the errors and raises them) when it is False: the one
    read of a check on the host (a ``tf.cond``'s predicate), whatever the failures it reports."""
    return tf.cond(ok, lambda: tf.identity(ok), report)
