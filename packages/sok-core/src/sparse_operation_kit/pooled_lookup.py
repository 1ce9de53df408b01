"""Static tables of one ``sok.lookup_sparse`` call: one op for the whole call.

The pooled lookup of every static table runs in ``SokPooledLookup`` (gather, weights and combiner
for all tables on TensorFlow's intra-op threads, or, for tables on a GPU, in one sequence of CUDA
kernels with the same results to the bit) and its gradient in ``SokPooledLookupGrad`` (per table,
the rows of its distinct ids as a ``tf.IndexedSlices``, in ``tf.unique``'s order). Both run on the
device of the tables (all on one).

At world size 1 nothing is exchanged and a table's shard is the full table: results equal those of
the per-table TensorFlow ops of ``lookup/local_lookup.py`` to the bit, and ids outside a table's
rows fail inside the op with ``sp_ids[i] has ids outside [0, rows)``. With several ranks,
``lookup/local_lookup.py`` gives it the ids this rank received for the global batch and each
table's shard (``shards``): the op sums the rows of the ids this rank holds into partial sums, and
the gradients are IndexedSlices of the shard's rows.

Example::

    v = sok.Variable(np.arange(17 * 3).reshape(17, 3), dtype=tf.float32)
    ids = tf.ragged.constant([[1, 1], [3, 4, 5]], dtype=tf.int64)
    (emb,) = pooled_lookup([v], [ids], None, ["sum"], [0])  # [[6, 8, 10], [36, 39, 42]]
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from sparse_operation_kit import device_ops, tf_ops

__all__ = ["pooled_lookup"]


def pooled_lookup(
    params: Sequence[Any],
    ids: Sequence[tf.RaggedTensor],
    weights: Sequence[tf.RaggedTensor] | None,
    combiners: Sequence[str],
    positions: Sequence[int],
    shards: Sequence[tuple[int, int]] | None = None,
    names: Sequence[str] | None = None,
    numbered: bool = False,
    checked: bool = False,
) -> list[tf.Tensor]:
    """``[batch, dim_t]`` pooled rows of each static table.

    One op pools the tables of each row dtype (float32, float16, bfloat16: read widened to float32);
    the outputs are float32, in the order of ``params``.

    Args:
        params: ``sok.Variable`` tables (``[rows, dim]`` of a dtype of ``dtypes.STATIC_ROW_DTYPES``),
            all on one device, or, with ``numbered``, the rows of a lookup's distinct keys
            (``[distinct, dim]`` float32 tensors).
        ids: one 2-D ``tf.RaggedTensor`` of int32/int64 ids per table, the same batch for all.
        weights: None, or one float32 ``tf.RaggedTensor`` per table with the row lengths of ``ids``.
        combiners: ``"sum"``, ``"mean"`` or ``"sqrtn"`` per table (lower case).
        positions: each table's index in the caller's ``sp_ids`` (for error messages).
        shards: None (each table whole, world size 1) or ``(stride, offset)`` per table: the table
            holds id ``i`` at row ``i // stride`` when ``i % stride == offset``; offset -1 for a
            table that holds no id (a localized table of another rank). Only the held ids are
            summed, the divisors of ``mean`` and ``sqrtn`` count every id. A divisor of 0 gives
            zeros; a negative one (weights summing to less than 0) divides, as
            ``tf.nn.embedding_lookup_sparse`` does.
        names: the tables' names for error messages (None: each param's ``name``).
        numbered: whether ``ids`` number the rows of ``params`` in order of first occurrence
            (``device_ops.unique_index_list``'s positions: ``local_lookup.pool_dynamic``): each
            row is then read, and the gradient of ``params`` is a dense tensor, the rows in order.
        checked: the caller has checked the ids against the tables and made the row splits
            (``lookup.local_lookup.pool_held``: the call's agreement counted ids outside each table
            on every rank before the exchange): on a GPU the op then reads nothing back, so the step
            does not wait for the GPU there; the CPU kernel checks anyway.
    """
    names = [p.name for p in params] if names is None else list(names)
    by_dtype: dict[tf.DType, list[int]] = {}
    for t, p in enumerate(params):
        by_dtype.setdefault(p.dtype, []).append(t)
    outputs: list[Any] = [None] * len(params)
    with _on_device(params[0].device):
        for tables in by_dtype.values():
            pooled = tf_ops.library().sok_pooled_lookup(
                params=[params[t] for t in tables],
                ids=[ids[t].values for t in tables],
                row_splits=[tf.cast(ids[t].row_splits, tf.int64) for t in tables],
                weights=[] if weights is None else [weights[t].values for t in tables],
                combiners=[combiners[t] for t in tables],
                names=[names[t] for t in tables],
                positions=[positions[t] for t in tables],
                strides=[] if shards is None else [shards[t][0] for t in tables],
                offsets=[] if shards is None else [shards[t][1] for t in tables],
                numbered=[numbered] * len(tables) if numbered else [],
                checked=checked,
            )
            for t, out in zip(tables, pooled):
                outputs[t] = out
    return outputs


def _on_device(device: str) -> contextlib.AbstractContextManager[Any]:
    """``tf.device(device)`` (none for an empty name): the op runs where its tables are, not on the
    placer's choice (a GPU for tables on the host, now that the op has GPU kernels)."""
    return tf.device(device) if device else contextlib.nullcontext()


def _held_products(op: tf.Operation, t: int, n: int, scaled: tf.Tensor, samples: tf.Tensor) -> tf.Tensor:
    """``scaled_s . row_j`` for each id ``j`` (sample ``s``) of table ``t`` that its shard holds, 0
    for the others."""
    params, ids = op.inputs[t], tf.cast(op.inputs[n + t], tf.int64)

    def rows(of: tf.Tensor) -> tf.Tensor:  # float32 (half-width rows widened), the gathered rows only
        return tf.cast(tf.gather(params, of), tf.float32)

    strides, offsets = op.get_attr("strides"), op.get_attr("offsets")
    if not strides:
        return tf.reduce_sum(tf.gather(scaled, samples) * rows(ids), axis=1)
    stride, offset = strides[t], offsets[t]
    held = tf.reshape(tf.where(device_ops.floormod(ids, stride) == offset), [-1])
    products = tf.reduce_sum(tf.gather(scaled, tf.gather(samples, held)) * rows(tf.gather(ids, held) // stride), axis=1)
    return tf.scatter_nd(held[:, None], products, tf.shape(ids, out_type=tf.int64))


def _weight_gradients(op: tf.Operation, grads: list[tf.Tensor], n: int) -> list[tf.Tensor]:
    """d loss / d weights of each table: ``(g_s . row_j - [mean] g_s . out_s - [sqrtn] g_s . out_s *
    w_j / d_s) / d_s`` for id ``j`` of sample ``s`` (``d_s`` the divisor; none when it is 0, as the
    output is then zeros, as the gradient of tf.math.divide_no_nan; ``row_j`` zeros for the ids of
    other shards)."""
    result = []
    for t, combiner in enumerate(c.decode() for c in op.get_attr("combiners")):
        splits, w = op.inputs[2 * n + t], op.inputs[3 * n + t]
        samples = device_ops.sample_ids(splits, w)
        g = grads[t]
        if combiner == "sum":
            inverse = tf.ones(tf.shape(splits)[:1] - 1)
        else:
            ragged = tf.RaggedTensor.from_row_splits(w, splits, validate=False)
            d = tf.reduce_sum(ragged, axis=1) if combiner == "mean" else tf.sqrt(tf.reduce_sum(tf.square(ragged), 1))
            inverse = tf.math.divide_no_nan(tf.ones_like(d), d)
        scaled = g * inverse[:, None]  # [batch, dim]
        direct = _held_products(op, t, n, scaled, samples)
        if combiner == "sum":
            result.append(direct)
            continue
        through_divisor = tf.gather(tf.reduce_sum(scaled * op.outputs[t], axis=1), samples)
        if combiner == "sqrtn":
            through_divisor *= w * tf.gather(inverse, samples)
        result.append(direct - through_divisor)
    return result


@tf.RegisterGradient("SokPooledLookup")
def _pooled_lookup_grad(op: tf.Operation, *grads: tf.Tensor | None) -> list[Any]:
    """IndexedSlices per table (its distinct ids), no gradient for ids and row splits, and the
    weights' gradients when the call is weighted."""
    n = op.get_attr("num_tables")
    num_weights = op.get_attr("num_weights")
    grads = [tf.zeros_like(out) if g is None else g for g, out in zip(grads, op.outputs)]
    numbered = op.get_attr("numbered") or [False] * n
    with _on_device(op.outputs[0].device):  # where the forward ran
        rows, indices = tf_ops.library().sok_pooled_lookup_grad(
            grads=grads,
            ids=list(op.inputs[n : 2 * n]),
            row_splits=list(op.inputs[2 * n : 3 * n]),
            weights=list(op.inputs[3 * n :]),
            combiners=op.get_attr("combiners"),
            table_rows=[-1 if dense else int(p.shape[0]) for dense, p in zip(numbered, op.inputs[:n])],
            strides=op.get_attr("strides"),
            offsets=op.get_attr("offsets"),
        )
    params_grads = [
        r if dense else tf.IndexedSlices(r, i, tf.shape(p, out_type=tf.int64))
        for dense, r, i, p in zip(numbered, rows, indices, op.inputs[:n])
    ]
    weight_grads = _weight_gradients(op, grads, n) if num_weights else []
    return params_grads + [None] * (2 * n) + weight_grads
