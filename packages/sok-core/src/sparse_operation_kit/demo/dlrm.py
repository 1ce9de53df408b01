"""DLRM in Keras 3 with SOK embeddings: a bottom MLP over the dense features, one embedding per
categorical feature (all 26 looked up by one ``sok.lookup_sparse``), their pairwise dot products,
and a top MLP.

The model is two parts so that serving can swap the embeddings and keep the rest:

* :class:`SokEmbeddings`: the 26 tables and their lookup (one id per feature, or bags of ids per
  feature through :meth:`SokEmbeddings.lookup`, as the DCNv2 of :mod:`~.dcnv2` uses them).
  ``tables="static"``: every feature a ``sok.Variable`` (row ``i`` on rank ``i % n``);
  ``"dynamic"``: every feature a ``sok.DynamicVariable``; ``"mixed"`` (default): features of at
  least ``dynamic_rows`` rows dynamic, the others static. Dynamic tables take the ``var_types`` in
  turn (``("hbm", "hybrid")``: det and hkv tables in one model), and their keys are the ids spread
  over the int64 range (:func:`dynamic_keys`), as hashed ids are.
* :class:`DenseTower`: a Keras model of the bottom MLP, the dot interaction and the top MLP,
  ``(dense [B, 13], embeddings 26 x [B, dim]) -> logits [B, 1]``.

Example::

    embeddings = SokEmbeddings(gen.rows, dim=16)
    tower = DenseTower(dim=16)
    logits = tower((dense, embeddings(ids)))          # ids: int64 [B, 26]
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from sparse_operation_kit.checkpoint import format as ckpt_format
from sparse_operation_kit.demo import next_pow2
from sparse_operation_kit.demo.criteo import NUM_CATEGORICAL, NUM_DENSE
from sparse_operation_kit.distributed_variable import Variable
from sparse_operation_kit.dynamic_variable import DynamicVariable
from sparse_operation_kit.lookup import lookup_sparse

__all__ = [
    "TABLE_KINDS",
    "SokEmbeddings",
    "DenseTower",
    "dynamic_keys",
    "column_bags",
    "single_id_bags",
    "table_keys",
    "table_plan",
    "float32_matmuls",
]

#: Values of ``tables``.
TABLE_KINDS = ("static", "dynamic", "mixed")
#: Multiplier of :func:`dynamic_keys` (odd, so the map is a bijection of int64).
_SPREAD = np.int64(-7046029254386353131)  # 0x9E3779B97F4A7C15 as int64


@contextlib.contextmanager
def float32_matmuls() -> Iterator[None]:
    """Within the scope, TensorFlow's float32 matmuls compute in float32, not TF32; the setting
    before the scope is restored after it.

    On Ampere and later GPUs TensorFlow runs float32 matmuls in TF32 by default (inputs rounded to
    a 10-bit mantissa), and cuBLAS picks TF32 or float32 kernels per shape. Training evaluates
    ``batch_size / N`` samples per rank and serving the whole batch, so under TF32 the same model's
    predictions differ by far more than sok-hps's serving tolerance (``demo_serve.AUC_TOLERANCE``); in
    float32 only the order of the sums differs. :func:`~.train.train` and sok-hps's
    ``demo_serve.serve`` run inside this scope. (TF32 does not exist on CPUs: there it changes nothing.)

    Example::

        with float32_matmuls():
            logits = tower((dense, embeddings(ids)))
    """
    previous = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(False)
    try:
        yield
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(previous)


def dynamic_keys(ids: Any) -> Any:
    """The keys of a dynamic table for ids (int64, NumPy or TensorFlow): ``(id + 1) * 0x9E37...``
    with int64 wrap-around, a bijection that spreads small ids over the whole int64 range (negative
    keys included), as hashed categories are."""
    if isinstance(ids, np.ndarray):
        with np.errstate(over="ignore"):
            return (ids.astype(np.int64) + 1) * _SPREAD
    return (tf.cast(ids, tf.int64) + 1) * tf.constant(_SPREAD, tf.int64)


def column_bags(ids: tf.Tensor, widths: Sequence[int]) -> list[tf.RaggedTensor]:
    """The bags of ids ``[B, sum(widths)]`` whose feature ``i`` holds the next ``widths[i]`` columns:
    one ``tf.RaggedTensor`` ``[B, widths[i]]`` per feature, the ids' dtype kept. Their row splits
    come from the batch's static size (a constant, made once: ``tf.range`` of constants placed on a
    GPU would copy its start and limit back to the host at every step), or else its shape (int32,
    which TensorFlow keeps in host memory): nothing is read back from the GPU, as
    ``tf.RaggedTensor.from_tensor`` does once per feature.

    Example::

        column_bags(tf.constant([[1, 2, 3], [4, 5, 6]]), [1, 2])   # [[[1], [4]], [[2, 3], [5, 6]]]
    """
    rows = ids.shape[0]
    sample_starts = None if rows is None else tf.constant(np.arange(rows + 1, dtype=np.int64))
    bags, start = [], 0
    for width in widths:
        if sample_starts is None:
            splits = tf.cast(tf.range(tf.shape(ids)[0] + 1) * width, tf.int64)
        else:
            splits = sample_starts if width == 1 else sample_starts * width
        values = tf.reshape(ids[:, start : start + width], [-1])
        bags.append(tf.RaggedTensor.from_row_splits(values, splits, validate=False))
        start += width
    return bags


def single_id_bags(ids: tf.Tensor) -> list[tf.RaggedTensor]:
    """The 26 features of ids ``int64 [B, 26]`` (one id per feature and sample) as one-id bags, one
    ``tf.RaggedTensor`` ``[B, 1]`` per feature: what the embeddings' ``lookup`` takes."""
    return column_bags(ids, [1] * NUM_CATEGORICAL)


def table_keys(sp_ids: Sequence[Any], dynamic: Sequence[bool]) -> list[Any]:
    """Each feature's ids as its table takes them: :func:`dynamic_keys` of them for a dynamic table,
    the ids for a static one (one ``tf.RaggedTensor`` or ``tf.SparseTensor`` per feature; training
    and serving feed the tables through it, so the checkpoint's keys are what serving asks for).

    Raises:
        ValueError: ``sp_ids`` does not hold one tensor per feature.
    """
    if len(sp_ids) != len(dynamic):
        raise ValueError(f"sp_ids must hold one id tensor per feature ({len(dynamic)}), got {len(sp_ids)}")
    keyed = []
    for ids, is_dynamic in zip(sp_ids, dynamic):
        if not is_dynamic:
            keyed.append(ids)
        elif isinstance(ids, tf.SparseTensor):
            keyed.append(tf.SparseTensor(ids.indices, dynamic_keys(ids.values), ids.dense_shape))
        else:
            keyed.append(ids.with_flat_values(dynamic_keys(ids.flat_values)))
    return keyed


def table_plan(
    rows: Sequence[int], tables: str = "mixed", var_types: Sequence[str] = ("hbm", "hybrid"), dynamic_rows: int = 4096
) -> list[str]:
    """The kind of each feature's table: ``"static"`` or a var_type (a dynamic table of it).

    Example::

        table_plan([100, 10_000], "mixed", ["hbm"], dynamic_rows=4096)   # ["static", "hbm"]
    """
    if tables not in TABLE_KINDS:
        raise ValueError(f"tables {tables!r} is not valid; valid: {', '.join(map(repr, TABLE_KINDS))}")
    if not var_types and tables != "static":
        raise ValueError("var_types is empty; give at least one var_type (e.g. 'hbm') for the dynamic tables")
    plan, turn = [], 0
    for count in rows:
        if tables == "static" or (tables == "mixed" and count < dynamic_rows):
            plan.append("static")
        else:
            plan.append(var_types[turn % len(var_types)])
            turn += 1
    return plan


class SokEmbeddings:
    """The 26 embedding tables of the DLRM (and of the DCNv2, :mod:`~.dcnv2`) and their one
    ``sok.lookup_sparse`` (see the module docstring for ``tables``).

    Args:
        rows: rows of each feature's table (ids of feature ``i`` are in ``[0, rows[i])``).
        dim: embedding width.
        tables: ``"static"``, ``"dynamic"`` or ``"mixed"``.
        var_types: the var_types of the dynamic tables, taken in turn.
        dynamic_rows: with ``"mixed"``, features of at least this many rows get dynamic tables.
        seed: initial values (every rank makes the same static tables).
        row_dtype: the static tables' rows (``dtypes.STATIC_ROW_DTYPES``; float16 / bfloat16 ones are
            trained by ``sok.RowWiseAdagrad``).

    Attributes:
        tables: the 26 variables, named ``C1`` .. ``C26`` (Criteo's column names).
        kinds: ``"static"`` or the var_type of each table.

    A hybrid (hkv) table gets room for twice its feature's rows, so that it never evicts a row:
    its rows stay those that training wrote (what serving must find again).
    """

    def __init__(
        self,
        rows: Sequence[int],
        dim: int,
        tables: str = "mixed",
        var_types: Sequence[str] = ("hbm", "hybrid"),
        dynamic_rows: int = 4096,
        seed: int = 0,
        row_dtype: str = "float32",
    ) -> None:
        if len(rows) != NUM_CATEGORICAL:
            raise ValueError(f"rows must have {NUM_CATEGORICAL} entries, got {len(rows)}")
        if dim < 1:
            raise ValueError(f"dim {dim!r} is not valid; valid: an integer >= 1")
        self.rows = [int(r) for r in rows]
        self.dim = int(dim)
        self.kinds = table_plan(self.rows, tables, list(var_types), dynamic_rows)
        init = tf.keras.initializers.RandomUniform(-0.05, 0.05, seed=seed)
        self.tables: list[Any] = []
        for i, (count, kind) in enumerate(zip(self.rows, self.kinds)):
            name = f"C{i + 1}"
            if kind == "static":
                self.tables.append(Variable(shape=[count, dim], initializer=init, dtype=row_dtype, name=name))
                continue
            options = {}
            if kind == "hybrid":
                capacity = max(1 << 12, next_pow2(2 * count))
                options = {"init_capacity": capacity, "max_capacity": capacity}
            initializer = tf.keras.initializers.RandomUniform(-0.05, 0.05, seed=seed + i)
            self.tables.append(DynamicVariable(dim, var_type=kind, initializer=initializer, name=name, **options))

    @property
    def table_names(self) -> list[str]:
        """The tables' names in a ``sok.dump`` checkpoint (``<checkpoint>/<name>-key`` ...)."""
        return [ckpt_format.table_name(t.name) for t in self.tables]

    @property
    def dynamic(self) -> list[bool]:
        """Whether each feature's table is dynamic (its keys are :func:`dynamic_keys` of the ids)."""
        return [kind != "static" for kind in self.kinds]

    def __call__(self, ids: tf.Tensor) -> list[tf.Tensor]:
        """26 embeddings ``[B, dim]`` of ids ``int64 [B, 26]`` (one id per feature and sample)."""
        return self.lookup(single_id_bags(ids))

    def lookup(self, sp_ids: Sequence[Any]) -> list[tf.Tensor]:
        """26 embeddings ``[B, dim]``: per feature, the sum of the rows of its ids.

        Args:
            sp_ids: one ``tf.RaggedTensor`` or ``tf.SparseTensor`` of int64 ids ``[B, None]`` per
                feature (ids of feature ``i`` in ``[0, rows[i])``; a dynamic table is fed
                :func:`dynamic_keys` of them). All 26 go through one ``sok.lookup_sparse``.

        Example::

            bags = [tf.ragged.constant([[0, 3], [5]], tf.int64)] * 26
            pooled = embeddings.lookup(bags)    # 26 x [2, dim]: rows 0 + 3, row 5
        """
        return lookup_sparse(self.tables, table_keys(sp_ids, self.dynamic), combiners=["sum"] * NUM_CATEGORICAL)


class DenseTower(tf.keras.Model):
    """Bottom MLP, dot interaction, top MLP: ``(dense [B, 13], [26 x [B, dim]]) -> logits [B, 1]``.

    The bottom MLP maps the dense features to one more vector of width ``dim``; the interaction
    takes the dot products of the 27 vectors pairwise (351 numbers) and concatenates them with
    that vector; the top MLP maps that to one logit.

    Args:
        dim: embedding width.
        bottom: hidden widths of the bottom MLP (its last layer has width ``dim``).
        top: hidden widths of the top MLP (a last layer of width 1 follows).
        seed: initial weights.
    """

    def __init__(self, dim: int, bottom: Sequence[int] = (64, 32), top: Sequence[int] = (128, 64), seed: int = 0):
        super().__init__()
        glorot = tf.keras.initializers.GlorotUniform

        def dense(width: int, i: int, activation: str | None = "relu") -> tf.keras.layers.Dense:
            return tf.keras.layers.Dense(width, activation=activation, kernel_initializer=glorot(seed=seed + i))

        self.dim = int(dim)
        self.bottom = [dense(w, i) for i, w in enumerate(list(bottom) + [dim])]
        self.top = [dense(w, 100 + i) for i, w in enumerate(top)] + [dense(1, 200, activation=None)]
        vectors = NUM_CATEGORICAL + 1
        self._pairs = tf.constant([i * vectors + j for i in range(vectors) for j in range(i)], tf.int32)

    def call(self, inputs: tuple[tf.Tensor, list[tf.Tensor]]) -> tf.Tensor:
        dense, embeddings = inputs
        x = dense
        for layer in self.bottom:
            x = layer(x)
        vectors = tf.stack([x] + list(embeddings), axis=1)  # [B, 27, dim]
        dots = tf.matmul(vectors, vectors, transpose_b=True)  # [B, 27, 27]
        flat = tf.reshape(dots, [-1, (NUM_CATEGORICAL + 1) ** 2])
        y = tf.concat([x, tf.gather(flat, self._pairs, axis=1)], axis=1)
        for layer in self.top:
            y = layer(y)
        return y

    def build_for(self, batch: int = 1) -> None:
        """Create the weights (a call on zeros)."""
        self((tf.zeros([batch, NUM_DENSE]), [tf.zeros([batch, self.dim])] * NUM_CATEGORICAL))
