"""``DynamicSlot``: one optimizer slot of a ``sok.DynamicVariable``, as a variable-like view.

A dynamic variable's optimizer state lives in extra columns of its own storage rows
(``[embedding | slot 1 | slot 2 ...]``, see :mod:`sparse_operation_kit.optimizer`), so that eviction,
export and checkpoints never separate a key's weight from its state. NVIDIA SOK instead keeps each
slot in a separate ``DynamicVariable`` named ``"DynamicSlot"``, reachable as
``optimizer.get_slot(var, name)`` on the Keras optimizer the ``sok.OptimizerWrapper`` wraps; code
written for it reads and writes that slot with ``sok.export`` / ``sok.assign``. A ``DynamicSlot``
is what such code gets here: a view of the slot's column range of the variable's rows, which
``sok.export`` and ``sok.assign`` accept (they read or write those columns only).

Example::

    wrapper = sok.OptimizerWrapper(tf_keras.optimizers.legacy.Adagrad(0.1))
    wrapper.apply_gradients(zip(grads, [v]))
    slot = wrapper.optimizer.get_slot(v, "accumulator")   # DynamicSlot
    keys, accumulators = sok.export(slot)                   # [N], [N, slot.dimension]
    sok.assign(slot, keys, tf.zeros_like(accumulators))     # the weights stay as they are
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
from tensorflow.python.trackable import base as trackable

from sparse_operation_kit.dynamic_variable import ColumnView, DynamicVariable

__all__ = ["DynamicSlot"]


class DynamicSlot(ColumnView, trackable.Trackable):
    """The columns ``[begin, end)`` of a dynamic variable's rows that hold one optimizer slot.

    Made by ``sok.OptimizerWrapper`` (never directly) when it first updates the variable; it reads
    and writes the variable's own storage, so it always shows the current state, and it stays valid
    as long as the variable lives.

    Args:
        variable: the ``sok.DynamicVariable`` whose rows hold the slot.
        slot_name: the slot's name, as the optimizer that exposes the view names it (``"m"``).
        columns: ``(begin, end)``, the slot's column range in the rows (``end - begin``, its
            :attr:`dimension`, is the variable's dimension, or 1 for a per-row slot such as
            ``sok.RowWiseAdagrad``'s accumulator).

    Tracked by ``tf.train.Checkpoint`` as the wrapped optimizer's slot of the variable, like the
    variable itself it cannot be saved that way (checkpoint dynamic variables with ``sok.dump``).
    """

    def __init__(self, variable: DynamicVariable, slot_name: str, columns: tuple[int, int]) -> None:
        begin, end = columns
        if not 0 <= begin < end:
            raise ValueError(
                f"slot {slot_name!r} of {variable.name} must span one or more columns (begin < end), got "
                f"columns {columns!r}"
            )
        self._variable = variable
        self._slot_name = slot_name
        self._columns = (int(begin), int(end))

    @property
    def variable(self) -> DynamicVariable:
        """The dynamic variable whose rows hold this slot."""
        return self._variable

    @property
    def slot_name(self) -> str:
        return self._slot_name

    @property
    def columns(self) -> tuple[int, int]:
        """``(begin, end)``: the slot's column range in the variable's storage rows."""
        return self._columns

    @property
    def name(self) -> str:
        """``"<variable>/DynamicSlot/<slot>:0"`` (NVIDIA SOK names its slot variables ``DynamicSlot``)."""
        return f"{self._variable.name.split(':')[0]}/DynamicSlot/{self._slot_name}:0"

    @property
    def dimension(self) -> int:
        """The slot's width: the variable's dimension, or 1 for a per-row slot."""
        return self._columns[1] - self._columns[0]

    @property
    def key_type(self) -> tf.DType:
        return self._variable.key_type

    @property
    def dtype(self) -> tf.DType:
        return tf.float32

    @property
    def shape(self) -> tf.TensorShape:
        return tf.TensorShape([None, self.dimension])

    @property
    def backend_type(self) -> str:
        return self._variable.backend_type

    @property
    def mode(self) -> str | None:
        return self._variable.mode

    @property
    def target_gpu(self) -> int:
        return self._variable.target_gpu

    @property
    def trainable(self) -> bool:
        return False

    @property
    def size(self) -> tf.Tensor:
        """``[rows in this shard, dimension]`` (the variable's rows: every row holds the slot)."""
        return self._variable.size

    def is_static(self) -> bool:
        return False

    @property
    def table_inputs(self) -> tuple[tf.Tensor, tf.Tensor]:
        return self._variable.table_inputs

    def _serialize_to_tensors(self) -> Any:
        raise NotImplementedError(
            f"tf.train.Checkpoint / SavedModel cannot save {self.name}, the optimizer state of the "
            f"sok.DynamicVariable {self._variable.name} (it lives in the variable's rows); checkpoint dynamic "
            f"variables and their optimizer state with sok.dump(path, variables, optimizer) / sok.load"
        )

    def __repr__(self) -> str:
        return (
            f"<sok.DynamicSlot '{self.name}' of {self._variable.name} columns={self._columns} "
            f"shape=(None, {self.dimension}) dtype=float32>"
        )
