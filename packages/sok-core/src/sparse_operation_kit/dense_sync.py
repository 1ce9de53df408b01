"""Data parallelism of the dense part of a model over Horovod, for Keras 3 variables.

With several ranks, a model that uses SOK has two kinds of variables: SOK's tables
(``sok.Variable`` shards, ``sok.DynamicVariable``), which are model-parallel (each rank holds its own
rows, and ``sok.lookup_sparse``'s backward already sums their gradients over the global batch), and
everything else (the MLPs, a ``tf.keras.layers.Embedding``), which every rank holds whole and must
keep equal. Horovod's own helpers for the second kind, ``hvd.broadcast_variables`` and
``hvd.DistributedGradientTape``, fail on Keras 3 variables (TensorFlow 2.21's ``tf.keras``); these
two functions do their job through SOK's communication tool (``sok.init``), skip SOK's tables, and
are identities in a single process.

Example (every rank)::

    hvd.init(); sok.init()
    model = build()                                     # Keras 3 layers + SOK tables
    sok.broadcast_dense_variables(model.variables)      # rank 0's initial values everywhere
    ...
    with tf.GradientTape() as tape:
        loss = ...
    grads = tape.gradient(loss, variables)
    grads = sok.allreduce_dense_gradients(grads, variables)   # average of dense gradients; SOK's as they are
    optimizer.apply_gradients(zip(grads, variables))

On GPU ranks the gradients travel through the same collectives as ``sok.lookup_sparse``'s exchange
(SOK's NCCL communicator, ``SOK_EXCHANGE``), fused into one allreduce per dtype. Reduce the dense
gradients with this function rather than ``hvd.allreduce`` when SOK's exchange is NCCL: Horovod's
NCCL collectives on GPU tensors run in an order of their own, and NCCL does not support two
communicators whose collectives the ranks order differently (the step can hang).

Which ``op`` to use: with each rank's loss the mean over its own samples, ``op="average"`` (the
default) gives the dense gradient of the mean over the global batch, while SOK's table gradients
are the *sum* over ranks of each rank's gradient (``num_ranks`` times larger; Adagrad and Adam do
not mind a constant factor). To train exactly as one process on the global batch, divide each
rank's summed loss by the global batch size and use ``op="sum"``: then both kinds of gradient are
those of the global mean.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import tensorflow as tf

from sparse_operation_kit import communication
from sparse_operation_kit.lookup import exchange
from sparse_operation_kit.optimizer import filter_variables

logger = logging.getLogger(__name__)

__all__ = ["broadcast_dense_variables", "allreduce_dense_gradients", "REDUCE_OPS"]

#: The ``op`` values of :func:`allreduce_dense_gradients`.
REDUCE_OPS = ("average", "sum")


def _variables(variables: Any, what: str) -> list:
    """A list of variables from a list, a tuple, or an object with ``.variables`` (a Keras model,
    layer or optimizer)."""
    if hasattr(variables, "variables") and not isinstance(variables, (list, tuple)):
        variables = variables.variables
    if not isinstance(variables, Iterable) or isinstance(variables, (str, bytes)):
        raise TypeError(
            f"{what} must be a list of variables or a Keras model, layer or optimizer, got {type(variables).__name__}"
        )
    items = list(variables)
    for i, v in enumerate(items):
        if not hasattr(v, "assign"):
            raise TypeError(f"{what}[{i}] is a {type(v).__name__}, not a variable (it has no assign)")
    return items


def broadcast_dense_variables(variables: Any, root_rank: int = 0) -> int:
    """Give every rank ``root_rank``'s values of the dense variables (collective, eager).

    Call it once on every rank after the model is built (and, for optimizer state, after the
    optimizer is built), with the same variables in the same order. SOK's tables among
    ``variables`` are skipped: their shards differ by design.

    Args:
        variables: variables (Keras 3 ``keras.Variable``, ``tf.Variable``), or a Keras model, layer
            or optimizer (its ``.variables``).
        root_rank: the rank whose values everyone takes, 0 .. num_ranks - 1.

    Returns:
        The number of variables broadcast (SOK tables not counted).

    Raises:
        ValueError: ``root_rank`` is not a rank.
        TypeError: an entry is not a variable.

    Example::

        sok.broadcast_dense_variables(model.variables)   # before the first step, on every rank
    """
    comm = communication.tool()
    n = comm.num_ranks()
    if isinstance(root_rank, bool) or not isinstance(root_rank, int) or not 0 <= root_rank < n:
        raise ValueError(f"root_rank {root_rank!r} is not a rank; valid: 0 .. {n - 1} ({n} rank(s))")
    _, dense = filter_variables(_variables(variables, "variables"))
    if n == 1:
        return len(dense)
    for i, var in enumerate(dense):
        value = comm.broadcast(tf.convert_to_tensor(var), root_rank, name=f"sok.broadcast_dense_variables: {i}")
        var.assign(value)
    logger.debug("broadcast %d dense variables from rank %d", len(dense), root_rank)
    return len(dense)


def allreduce_dense_gradients(gradients: Sequence[Any], variables: Sequence[Any], op: str = "average") -> list[Any]:
    """Allreduce the gradients of the dense variables over the ranks; SOK tables' gradients pass
    through as they are (model-parallel: ``sok.lookup_sparse`` already summed them).

    Eager or inside ``tf.function``; every rank calls it with the same variables in the same
    order. ``tf.IndexedSlices`` gradients (a ``tf.keras.layers.Embedding``) are allgathered, as
    Horovod does (their rows summed, or divided by the number of ranks for ``"average"``). None
    gradients stay None, without a collective (so ranks must agree on which are None).

    Args:
        gradients: one gradient per variable (``tape.gradient``'s list).
        variables: the variables, in the same order.
        op: ``"average"`` (default) or ``"sum"`` (:data:`REDUCE_OPS`); see the module docstring for
            which to pick.

    Returns:
        The gradients, dense ones reduced over the ranks.

    Raises:
        ValueError: the lengths differ, or ``op`` is not valid.

    Example::

        grads = tape.gradient(loss, variables)
        grads = sok.allreduce_dense_gradients(grads, variables)
        optimizer.apply_gradients(zip(grads, variables))
    """
    gradients, variables = list(gradients), list(variables)
    if len(gradients) != len(variables):
        raise ValueError(
            f"got {len(gradients)} gradients for {len(variables)} variables; pass one gradient per variable "
            f"(tape.gradient(loss, variables) returns that list)"
        )
    if op not in REDUCE_OPS:
        raise ValueError(f"op {op!r} is not valid; valid: {', '.join(map(repr, REDUCE_OPS))}")
    comm = communication.tool()
    n = comm.num_ranks()
    if n == 1:
        return gradients
    sok_vars, _ = filter_variables(variables)
    model_parallel = {id(v) for v in sok_vars}
    collectives = exchange.of(comm)
    reduced: list[Any] = list(gradients)
    dense: dict[tf.DType, list[int]] = {}  # the dense gradients by dtype: one allreduce each
    for i, (grad, var) in enumerate(zip(gradients, variables)):
        if grad is None or id(var) in model_parallel:
            continue
        if isinstance(grad, tf.IndexedSlices):
            name = f"sok.allreduce_dense_gradients: {i}"
            values = collectives.allgather_rows(grad.values, name=name + " values")
            indices = collectives.allgather_rows(tf.cast(grad.indices, tf.int64), name=name + " indices")
            if op == "average":
                values = values / tf.cast(n, values.dtype)
            reduced[i] = tf.IndexedSlices(values, tf.cast(indices, grad.indices.dtype), grad.dense_shape)
            continue
        reduced[i] = tf.convert_to_tensor(grad)
        dense.setdefault(reduced[i].dtype, []).append(i)
    for dtype, members in dense.items():
        flat = tf.concat([tf.reshape(reduced[i], [-1]) for i in members], 0)
        total = collectives.allreduce_sum(flat, name=f"sok.allreduce_dense_gradients: {dtype.name}")
        if op == "average":
            total = total / tf.cast(n, dtype)
        sizes = [tf.size(reduced[i]) for i in members]
        for i, part in zip(members, tf.split(total, tf.stack(sizes), num=len(members))):
            reduced[i] = tf.reshape(part, tf.shape(reduced[i]))
    return reduced
