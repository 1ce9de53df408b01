"""MLPerf's DLRM-DCNv2 in Keras 3 with SOK embeddings: a bottom MLP over the dense features, 26
multi-hot features each sum-pooled from its table (all 26 looked up by one ``sok.lookup_sparse``,
:meth:`~.dlrm.SokEmbeddings.lookup`), a low-rank DCNv2 cross network over the concatenation of the
bottom MLP's output and the 26 pooled embeddings, and a top MLP.

As for the DLRM (:mod:`~.dlrm`), the model is two parts: the tables
(:class:`~.dlrm.SokEmbeddings`, fed one ``tf.RaggedTensor`` of ids per feature, :func:`split_bags`)
and :class:`DCNv2Tower`, ``(dense [B, 13], embeddings 26 x [B, dim]) -> logits [B, 1]``.

MLPerf Training's configuration (the reference's ``dlrm_v2``; :data:`~.train.MLPERF_DCNV2`, ``sok
demo --model dcnv2 --mlperf``): dim 128, bottom MLP 512-256-128, 3 cross layers of low rank 512 over
27 x 128 = 3456 features, top MLP 1024-1024-512-256-1, ReLU after every layer but the last,
hotness :data:`~.criteo.MLPERF_HOTNESS`, tables :data:`~.criteo.MLPERF_ROWS` (capped by
``max_rows``).

Example::

    gen = MultiHotGenerator(seed=0, max_rows=1 << 16)
    embeddings = SokEmbeddings(gen.rows, dim=16)
    tower = DCNv2Tower(dim=16, cross_layers=3, low_rank=64)
    counts, ids, labels = gen.batch(0, 1024)                         # ids int64 [1024, 214]
    pooled = embeddings.lookup(split_bags(tf.constant(ids), gen.hotness))
    logits = tower((preprocess_dense(counts), pooled))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from sparse_operation_kit.demo.criteo import NUM_CATEGORICAL, NUM_DENSE, check_hotness
from sparse_operation_kit.demo.dlrm import column_bags
from sparse_operation_kit.validate import is_positive_int

__all__ = ["LowRankCrossNet", "DCNv2Tower", "split_bags"]


def split_bags(ids: Any, hotness: Sequence[int]) -> list[tf.RaggedTensor]:
    """The 26 bags of a batch's ids ``int64 [B, sum(hotness)]`` (the layout of
    :class:`~.criteo.MultiHotGenerator`), one ``tf.RaggedTensor`` ``[B, hotness[i]]`` per feature.

    Raises:
        ValueError: ``hotness`` is not 26 integers >= 1, or the ids do not have ``sum(hotness)``
            columns.
    """
    hotness = check_hotness(hotness)
    ids = tf.convert_to_tensor(ids)
    columns = ids.shape[-1]
    if ids.shape.rank != 2 or (columns is not None and columns != sum(hotness)):
        raise ValueError(
            f"ids of shape {ids.shape} do not hold the bags of hotness {list(hotness)}; valid: [batch, "
            f"{sum(hotness)}] (the columns of feature i side by side, as MultiHotGenerator.batch makes them)"
        )
    return column_bags(ids, hotness)


class LowRankCrossNet(tf.keras.layers.Layer):
    """DCNv2's cross network of low rank: ``x_{l+1} = x_0 * (U_l (V_l x_l) + b_l) + x_l`` for
    ``l = 0 .. num_layers - 1``, ``*`` elementwise, ``V_l``: ``d -> low_rank``, ``U_l``:
    ``low_rank -> d`` (``d`` the width of the input ``x_0``).

    Args:
        num_layers: cross layers (MLPerf: 3).
        low_rank: the rank of each layer's ``U_l V_l`` (MLPerf: 512).
        seed: initial weights (Glorot uniform ``V_l`` and ``U_l``, zero ``b_l``).

    Attributes:
        kernels_v / kernels_u / biases: per layer, ``V_l`` as a ``[d, low_rank]`` matrix, ``U_l`` as
            ``[low_rank, d]`` and ``b_l`` ``[d]`` (row vectors: ``x @ V_l @ U_l``).

    Example::

        cross = LowRankCrossNet(num_layers=3, low_rank=64)
        y = cross(tf.ones([8, 432]))        # [8, 432]
    """

    def __init__(self, num_layers: int, low_rank: int, seed: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        for name, value in (("num_layers", num_layers), ("low_rank", low_rank)):
            if not is_positive_int(value):
                raise ValueError(f"{name} {value!r} is not valid; valid: an integer >= 1")
        self.num_layers = int(num_layers)
        self.low_rank = int(low_rank)
        self.seed = int(seed)
        self.kernels_v: list[Any] = []
        self.kernels_u: list[Any] = []
        self.biases: list[Any] = []

    def build(self, input_shape: Any) -> None:
        width = int(input_shape[-1])
        glorot = tf.keras.initializers.GlorotUniform
        for layer in range(self.num_layers):
            self.kernels_v.append(
                self.add_weight(
                    shape=(width, self.low_rank), initializer=glorot(seed=self.seed + 2 * layer), name=f"V{layer}"
                )
            )
            self.kernels_u.append(
                self.add_weight(
                    shape=(self.low_rank, width), initializer=glorot(seed=self.seed + 2 * layer + 1), name=f"U{layer}"
                )
            )
            self.biases.append(self.add_weight(shape=(width,), initializer="zeros", name=f"b{layer}"))

    def call(self, x0: tf.Tensor) -> tf.Tensor:
        x = x0
        for v, u, b in zip(self.kernels_v, self.kernels_u, self.biases):
            x = x0 * (tf.matmul(tf.matmul(x, v), u) + b) + x
        return x


class DCNv2Tower(tf.keras.Model):
    """Bottom MLP, DCNv2 cross network, top MLP: ``(dense [B, 13], [26 x [B, dim]]) -> logits [B, 1]``.

    The bottom MLP maps the dense features to one vector of width ``dim``; the cross network takes
    it and the 26 pooled embeddings side by side (``27 * dim`` features); the top MLP maps its
    output to one logit. Every layer but the last has a ReLU.

    Args:
        dim: embedding width (the bottom MLP's last width).
        bottom: hidden widths of the bottom MLP (MLPerf: 512, 256; a last layer of width ``dim``
            follows).
        top: hidden widths of the top MLP (MLPerf: 1024, 1024, 512, 256; a last layer of width 1
            follows).
        cross_layers / low_rank: of the cross network (:class:`LowRankCrossNet`).
        seed: initial weights.

    Example::

        tower = DCNv2Tower(dim=16, bottom=(64, 32), top=(128, 64), cross_layers=3, low_rank=64)
        logits = tower((dense, pooled))       # dense [B, 13], pooled 26 x [B, 16] -> [B, 1]
    """

    def __init__(
        self,
        dim: int,
        bottom: Sequence[int] = (64, 32),
        top: Sequence[int] = (128, 64),
        cross_layers: int = 3,
        low_rank: int = 64,
        seed: int = 0,
    ) -> None:
        super().__init__()
        for name, value, valid in (("dim", [dim], "an integer"), ("bottom", bottom, "widths"), ("top", top, "widths")):
            if not all(is_positive_int(w) for w in value):
                shown = dim if name == "dim" else list(value)
                raise ValueError(f"{name} {shown!r} is not valid; valid: {valid} >= 1")
        glorot = tf.keras.initializers.GlorotUniform

        def dense(width: int, i: int, activation: str | None = "relu") -> tf.keras.layers.Dense:
            return tf.keras.layers.Dense(width, activation=activation, kernel_initializer=glorot(seed=seed + i))

        self.dim = int(dim)
        self.bottom = [dense(w, i) for i, w in enumerate(list(bottom) + [dim])]
        self.cross = LowRankCrossNet(cross_layers, low_rank, seed=seed + 300)
        self.top = [dense(w, 100 + i) for i, w in enumerate(top)] + [dense(1, 200, activation=None)]

    def call(self, inputs: tuple[tf.Tensor, list[tf.Tensor]]) -> tf.Tensor:
        dense, embeddings = inputs
        x = dense
        for layer in self.bottom:
            x = layer(x)
        # [B, 27 * dim], as tf.concat(axis=1) would make it; but the gradient of a concat needs its
        # axis, an int32 tensor that an XLA-compiled tower then returns in host memory, a copy from
        # the GPU at every step (run p's trace); stack and reshape need none.
        vectors = [x] + list(embeddings)
        y = self.cross(tf.reshape(tf.stack(vectors, axis=1), [-1, len(vectors) * self.dim]))
        for layer in self.top:
            y = layer(y)
        return y

    def build_for(self, batch: int = 1) -> None:
        """Create the weights (a call on zeros)."""
        self((tf.zeros([batch, NUM_DENSE]), [tf.zeros([batch, self.dim])] * NUM_CATEGORICAL))
