"""The copy of a ``sok.DynamicVariable`` that a SavedModel serves: its keys, sorted, and their
embedding rows, held as constants of the SavedModel's functions and read by TensorFlow's own ops (a
binary search and a gather), so that a C++ process serves the model with no Python and no SOK table
in it.

``tf.saved_model.save`` (and ``model.export``) trace the model's functions again, in a save
context: there a dynamic variable's lookups read this copy instead of the table, made from the
table once per save (every row the local shard holds). A key the table did not hold when the model
was saved reads the default row: the table's initializer where it is a constant (``"zeros"``,
``"ones"``, a number), zeros otherwise (random rows are a function of the key that TensorFlow's ops
cannot recompute). Nothing is inserted while saving. The copy is part of the SavedModel's graph,
which protobuf limits to 2 GiB: a table whose keys and rows take more than ``MAX_COPY_BYTES``
is refused with its size. A function traced for one save holds that save's copy, and TensorFlow
reuses the trace when a later save takes the function: a save is refused while such a function
exists (:meth:`ServingCopy.stale_functions_alive`), so no SavedModel serves rows older than its save.

Example::

    v = sok.DynamicVariable(dimension=8)
    ...                                        # train
    tf.saved_model.save(model, path)           # model's lookups of v read v's serving copy
"""

from __future__ import annotations

import gc
import os
import sys
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.saved_model import save_context

from sparse_operation_kit import device_ops

__all__ = ["MAX_COPY_BYTES", "ServingCopy", "saving", "writing_saved_model"]

#: The most bytes (keys and rows) of one table's serving copy: the SavedModel's graph holds it, and
#: protobuf refuses a graph of 2 GiB or more.
MAX_COPY_BYTES = 1 << 30

#: The file of ``tf.saved_model.save`` (``tensorflow/python/saved_model/save.py``).
_SAVED_MODEL_SAVE = os.path.join("saved_model", "save.py")


def saving() -> bool:
    """Whether a SavedModel is being saved (its functions are being traced for it)."""
    return save_context.in_save_context()


def writing_saved_model() -> bool:
    """Whether the caller runs inside ``tf.saved_model.save``, whose variables' checkpoint is written
    after its save context has closed (so :func:`saving` is False there): a frame of TensorFlow's
    ``saved_model/save.py`` on the stack. A ``tf.train.Checkpoint`` has none."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.endswith(_SAVED_MODEL_SAVE):
            return True
        frame = frame.f_back
    return False


class ServingCopy:
    """One dynamic variable's serving copy: made once per save from what ``read()`` gives (its
    ``(keys, rows)``, read eagerly), then looked up by the save's traced functions.

    Args:
        name: the variable's name (for messages).
        dimension: the embedding width.
        default: the row of an absent key (``dimension`` floats).
        read: ``() -> (keys, rows)`` of the table, any order.
    """

    def __init__(self, name: str, dimension: int, default: np.ndarray, read: Callable[[], tuple[Any, Any]]) -> None:
        self._name = name
        self._dimension = int(dimension)
        self._default = np.asarray(default, np.float32).reshape([self._dimension])
        self._read = read
        self._made_for: Any = None
        self._copy: tuple[tf.Tensor, tf.Tensor] | None = None
        # The keys of the copies of earlier saves, weakly: alive while a function traced for such a
        # save is (it captured them), which a later save may reuse with those rows.
        self._earlier: list[weakref.ref] = []

    def _current(self) -> tuple[tf.Tensor, tf.Tensor]:
        """The eager ``(sorted int64 keys, rows)`` of this save, made at its first lookup."""
        options = save_context.get_save_options()
        if self._copy is None or options is not self._made_for:
            self._retire()
            with tf.init_scope(), tf.device("/CPU:0"):
                keys, rows = self._read()
                bits = device_ops.int64_bits(tf.convert_to_tensor(keys))
                rows = tf.reshape(tf.convert_to_tensor(rows, tf.float32), [-1, self._dimension])
                size = int(tf.size(bits)) * 8 + int(tf.size(rows)) * 4
                if size > MAX_COPY_BYTES:
                    raise ValueError(
                        f"{self._name} holds {int(tf.size(bits)):,} keys ({size / 2**30:.2f} GiB with their rows), "
                        f"more than a SavedModel's graph can hold ({MAX_COPY_BYTES / 2**30:.0f} GiB: protobuf's "
                        f"2 GiB limit); serve it from its sok.dump checkpoint with HPS instead"
                    )
                order = tf.argsort(bits, stable=True)
                self._copy = (tf.gather(bits, order), tf.gather(rows, order))
            self._made_for = options
        return self._copy

    def _retire(self) -> None:
        """Keep only a weak reference to the copy of an earlier save."""
        if self._copy is not None:
            self._earlier.append(weakref.ref(self._copy[0]))
        self._copy, self._made_for = None, None

    def stale_functions_alive(self) -> bool:
        """Whether a function traced for an earlier save still exists (it holds that save's copy):
        TensorFlow reuses such a trace when a later save takes the function, and with it the rows of
        then. Called while a save maps its objects, after its functions were traced."""
        if self._made_for is not save_context.get_save_options():
            self._retire()  # this save did not read the table: its copy, if any, is an earlier one
        if not self._earlier:
            return False
        gc.collect()  # traced functions live in reference cycles
        self._earlier = [ref for ref in self._earlier if ref() is not None]
        return bool(self._earlier)

    def lookup(self, ids: Any) -> tf.Tensor:
        """Rows ``ids.shape + [dimension]`` of ``ids`` (the table's key dtype), the default row for a
        key the copy does not hold."""
        keys, rows = self._current()
        ids = tf.convert_to_tensor(ids)
        flat = device_ops.int64_bits(tf.reshape(ids, [-1]))
        count = int(keys.shape[0])
        default = tf.constant(self._default)
        if count == 0:
            # The empty keys are read all the same: the function must hold its copy (see
            # stale_functions_alive), an empty one included.
            with tf.control_dependencies([tf.size(keys)]):
                found = tf.broadcast_to(default, tf.stack([tf.size(flat, out_type=tf.int64), self._dimension]))
        else:
            position = tf.minimum(tf.searchsorted(keys, flat, side="left", out_type=tf.int64), count - 1)
            held = tf.gather(keys, position) == flat
            found = tf.where(held[:, None], tf.gather(rows, position), default[None, :])
        return tf.reshape(found, tf.concat([tf.shape(ids, out_type=tf.int64), [self._dimension]], 0))
