"""Criteo-shaped click data: a seeded generator with a hidden click model (one id per feature, or
MLPerf's multi-hot bags), and a reader of the real Criteo TSV day files. They stream through
``tf.data`` as the same elements.

A sample has 13 dense features (non-negative counts, as Criteo's integer columns), 26 categorical
features (one id each, feature ``i`` in ``[0, rows[i])``; the table sizes follow Criteo's relative
cardinalities, :data:`CRITEO_CARDINALITIES` scaled by :func:`scaled_cardinalities`) and a click
label. Ids follow a bounded power law (a few ids are most of the traffic, as in Criteo).

The label of a generated sample is drawn from a hidden logistic model: a bias, a linear term in
``log1p`` of the dense counts, one effect per (feature, id) for 16 of the 26 features, and two
products of effects (pairs of features that matter only together, what DLRM's dot interaction can
learn). Its probability is :meth:`CriteoGenerator.click_probability`: the AUC of that probability
on a sample is the best AUC any model can reach there (the ceiling the demo prints).

A batch ``(dense, categorical, label)`` as the datasets yield it::

    dense        float32 [B, 13]  log1p of the counts (DLRM's preprocessing)
    categorical  int64   [B, 26]  column i in [0, rows[i])
    label        float32 [B, 1]   0 or 1

:class:`MultiHotGenerator` makes the data of MLPerf's DLRM-DCNv2: feature ``i`` has a bag of
``hotness[i]`` ids per sample (:data:`MLPERF_HOTNESS`, 214 ids in all; ids may repeat within a
bag), tables of :data:`MLPERF_ROWS` rows capped at ``max_rows`` (:func:`capped_cardinalities`).
Its ``categorical`` is the bags side by side, feature ``i`` in columns ``offsets[i]:offsets[i + 1]``::

    categorical  int64   [B, sum(hotness)]  columns of feature i in [0, rows[i])

and its hidden model takes, for feature ``i``, the sum of its bag's effects over
``sqrt(hotness[i])`` (what a sum-pooled embedding can learn).

Example::

    gen = CriteoGenerator(seed=0, max_rows=1 << 16)
    counts, ids, labels = gen.batch(0, 4096)            # NumPy, deterministic by (seed, stream, index)
    ds = gen.dataset(steps=100, batch_size=4096)        # tf.data, the same batches, preprocessed
    ds = read_criteo_tsv(["day_0"], 4096, gen.rows)     # the real files, the same element layout
    multi = MultiHotGenerator(seed=0, max_rows=1 << 16)  # MLPerf's hotness: ids int64 [B, 214]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from sparse_operation_kit.validate import is_positive_int

__all__ = [
    "CRITEO_CARDINALITIES",
    "NUM_DENSE",
    "NUM_CATEGORICAL",
    "MIN_ROWS",
    "MLPERF_HOTNESS",
    "MLPERF_ROWS",
    "scaled_cardinalities",
    "capped_cardinalities",
    "check_hotness",
    "CriteoGenerator",
    "MultiHotGenerator",
    "preprocess_dense",
    "read_criteo_tsv",
]

NUM_DENSE = 13
NUM_CATEGORICAL = 26
#: Distinct values of each categorical feature of the Criteo Terabyte click logs (all 24 days), as
#: the MLPerf DLRM reference counts them.
CRITEO_CARDINALITIES = (
    39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546, 403346, 10,
    2208, 11938, 155, 4, 976, 14, 39979771, 25641295, 39664984, 585935, 12972, 108, 36,
)  # fmt: skip
#: Rows of each feature's table in MLPerf Training's DLRM-DCNv2 (Criteo 1TB, categories hashed into
#: at most 40 M rows: the reference's ``--num_embeddings_per_feature``).
MLPERF_ROWS = (
    40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10,
    2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36,
)  # fmt: skip
#: Ids per sample of each feature in MLPerf's multi-hot Criteo (the reference's
#: ``--multi_hot_sizes``): 214 in all.
MLPERF_HOTNESS = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)
#: The fewest rows a scaled table gets (a feature with fewer values keeps its own count).
MIN_ROWS = 8
#: Exponent of the power law of the ids (P(rank k) ~ k^-a).
ZIPF_EXPONENT = 1.05
#: Stream numbers of the generator: training and evaluation batches never share a seed.
STREAMS = {"train": 1, "eval": 2}
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def scaled_cardinalities(max_rows: int) -> tuple[int, ...]:
    """Criteo's cardinalities scaled so that the largest is ``max_rows``: ``min(c, max(MIN_ROWS,
    round(c * max_rows / max(c))))``. The order of the features is kept and no table grows.

    Example::

        scaled_cardinalities(1 << 16)[:3]   # (65380, 64, 28)
    """
    if isinstance(max_rows, bool) or not isinstance(max_rows, (int, np.integer)) or max_rows < MIN_ROWS:
        raise ValueError(f"max_rows {max_rows!r} is not valid; valid: an integer >= {MIN_ROWS}")
    largest = max(CRITEO_CARDINALITIES)
    return tuple(min(c, max(MIN_ROWS, round(c * int(max_rows) / largest))) for c in CRITEO_CARDINALITIES)


def capped_cardinalities(max_rows: int) -> tuple[int, ...]:
    """MLPerf's DLRM-DCNv2 table sizes (:data:`MLPERF_ROWS`) capped at ``max_rows``:
    ``min(rows, max_rows)`` per feature (ids of a capped feature are hashed into ``max_rows`` rows).

    Example::

        capped_cardinalities(1 << 22)[:3]   # (4194304, 39060, 17295)
    """
    if not is_positive_int(max_rows):
        raise ValueError(f"max_rows {max_rows!r} is not valid; valid: an integer >= 1")
    return tuple(min(r, int(max_rows)) for r in MLPERF_ROWS)


def check_hotness(hotness: Sequence[int]) -> tuple[int, ...]:
    """``hotness`` as a tuple after checking it: one integer >= 1 per categorical feature (26).

    Raises:
        ValueError: a length other than 26 or an entry that is not an integer >= 1.
    """
    values = list(hotness)
    if len(values) != NUM_CATEGORICAL or not all(is_positive_int(h) for h in values):
        raise ValueError(
            f"hotness {values!r} is not valid ({len(values)} entries); valid: {NUM_CATEGORICAL} integers >= 1, "
            f"the ids per sample of each categorical feature (MLPerf's: {' '.join(map(str, MLPERF_HOTNESS))})"
        )
    return tuple(int(h) for h in values)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 arrays: a bijection whose outputs look independent."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _uniform(bits: np.ndarray) -> np.ndarray:
    """uint64 -> float64 in (0, 1)."""
    return ((bits >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)


def preprocess_dense(counts: Any) -> Any:
    """DLRM's preprocessing of Criteo's integer columns: ``log(1 + max(x, 0))`` as float32 (TensorFlow
    tensors or NumPy arrays)."""
    if isinstance(counts, np.ndarray):
        return np.log1p(np.maximum(counts, 0)).astype(np.float32)
    import tensorflow as tf

    return tf.math.log1p(tf.maximum(tf.cast(counts, tf.float32), 0.0))


class CriteoGenerator:
    """Criteo-shaped samples with a hidden click model, deterministic by seed.

    Args:
        seed: fixes the hidden model and every batch.
        max_rows: rows of the largest table (the others scale with Criteo's cardinalities).
        zipf_exponent: the power law of the ids.

    Attributes:
        rows: rows of each of the 26 tables.
        ids_per_sample: columns of a batch's ids (26: one per feature).

    Example::

        gen = CriteoGenerator(seed=0, max_rows=1 << 16)
        counts, ids, labels = gen.batch(3, 1024, stream="eval")
        p = gen.click_probability(counts, ids)      # the hidden model's P(click)
    """

    def __init__(self, seed: int = 0, max_rows: int = 1 << 16, zipf_exponent: float = ZIPF_EXPONENT) -> None:
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed {seed!r} is not valid; valid: an integer >= 0")
        if not zipf_exponent > 1.0:
            raise ValueError(f"zipf_exponent {zipf_exponent!r} is not valid; valid: a number > 1")
        self.seed = int(seed)
        self.rows = self._table_rows(max_rows)
        self.zipf_exponent = float(zipf_exponent)
        rng = np.random.default_rng([self.seed, 0])
        # The hidden model: which features matter and how much.
        self._dense_mu = rng.uniform(0.5, 3.0, NUM_DENSE)
        self._dense_sigma = rng.uniform(0.8, 1.5, NUM_DENSE)
        self._dense_weight = rng.normal(0.0, 0.25, NUM_DENSE)
        self._dense_missing = rng.uniform(0.0, 0.3, NUM_DENSE)
        scales = np.zeros(NUM_CATEGORICAL)
        informative = rng.choice(NUM_CATEGORICAL, size=16, replace=False)
        scales[informative] = rng.uniform(0.1, 0.4, informative.size)
        self._effect_scale = scales
        self._pairs = [tuple(int(f) for f in rng.choice(NUM_CATEGORICAL, size=2, replace=False)) for _ in range(2)]
        self._bias = -2.3  # about 25% clicks, as Criteo

    def _table_rows(self, max_rows: int) -> tuple[int, ...]:
        """The 26 table sizes for ``max_rows``: Criteo's cardinalities scaled."""
        return scaled_cardinalities(max_rows)

    @property
    def ids_per_sample(self) -> int:
        """Columns of a batch's ids."""
        return NUM_CATEGORICAL

    def _column_features(self) -> np.ndarray:
        """The feature of each column of a batch's ids (int64 [ids_per_sample])."""
        return np.arange(NUM_CATEGORICAL, dtype=np.int64)

    # -- the hidden model -------------------------------------------------------------------
    def _effects(self, ids: np.ndarray) -> np.ndarray:
        """Standard-normal effect of each (feature, id) of ids [B, ids_per_sample], the same shape, a
        function of the seed only."""
        feature = self._column_features().astype(np.uint64)[None, :]
        with np.errstate(over="ignore"):  # uint64 arithmetic wraps by design
            base = _mix(np.uint64(self.seed) * _GOLDEN + feature * np.uint64(0x632BE59BD9B4E019))
            bits = _mix(base ^ (ids.astype(np.uint64) * _GOLDEN))
            u1, u2 = _uniform(bits), _uniform(_mix(bits + _GOLDEN))
        return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)

    def _feature_effects(self, ids: np.ndarray) -> np.ndarray:
        """[B, 26] effect of each feature of a sample: the effect of its one id."""
        return self._effects(ids)

    def click_logit(self, counts: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """The hidden model's logit [B] for counts [B, 13] and ids [B, ids_per_sample]."""
        effects = self._feature_effects(ids)
        dense = preprocess_dense(counts).astype(np.float64)
        logit = self._bias + (dense - 2.0) @ self._dense_weight + effects @ self._effect_scale
        for a, b in self._pairs:
            logit += 0.6 * effects[:, a] * effects[:, b]
        return logit

    def click_probability(self, counts: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """The hidden model's P(click) [B]: the best score there is for these samples."""
        return 1.0 / (1.0 + np.exp(-self.click_logit(counts, ids)))

    # -- samples ---------------------------------------------------------------------------
    def batch(self, index: int, batch_size: int, stream: str = "train") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Batch ``index`` of ``stream`` (``"train"`` or ``"eval"``): ``(counts int64 [B, 13], ids int64
        [B, ids_per_sample], labels float32 [B])``, the same for the same (seed, stream, index,
        batch_size)."""
        if stream not in STREAMS:
            raise ValueError(f"stream {stream!r} is not valid; valid: {', '.join(map(repr, STREAMS))}")
        if batch_size < 1 or index < 0:
            raise ValueError(f"batch_size must be >= 1 and index >= 0, got {batch_size}, {index}")
        rng = np.random.default_rng([self.seed, STREAMS[stream], int(index)])
        normal = rng.standard_normal((batch_size, NUM_DENSE))
        counts = np.floor(np.expm1(np.maximum(self._dense_mu + self._dense_sigma * normal, 0.0)))
        counts[rng.random((batch_size, NUM_DENSE)) < self._dense_missing] = 0  # Criteo's empty fields
        ids = self._power_law(rng.random((batch_size, self.ids_per_sample)))
        counts = counts.astype(np.int64)
        labels = (rng.random(batch_size) < self.click_probability(counts, ids)).astype(np.float32)
        return counts, ids, labels

    def _power_law(self, u: np.ndarray) -> np.ndarray:
        """Ids from uniforms [B, ids_per_sample]: the inverse CDF of a power law with exponent a on
        [1, rows + 1) of the column's feature, minus 1 (id 0 is the most frequent)."""
        column_rows = np.asarray(self.rows, dtype=np.int64)[self._column_features()]
        rows = column_rows.astype(np.float64)[None, :]
        a = 1.0 - self.zipf_exponent
        x = ((np.power(rows + 1.0, a) - 1.0) * u + 1.0) ** (1.0 / a)
        return np.minimum(np.floor(x).astype(np.int64) - 1, column_rows - 1)

    def dataset(self, steps: int, batch_size: int, stream: str = "train", rank: int = 0, num_ranks: int = 1) -> Any:
        """``steps`` batches of ``stream`` as a ``tf.data.Dataset`` of ``(dense, categorical, label)``
        (the module docstring's layout), made on the fly (a NumPy function per batch, prefetched).

        ``batch_size`` is the global batch; with ``num_ranks`` > 1 each rank gets its contiguous
        slice of every batch (so the ranks together see the batches of one process).
        """
        import tensorflow as tf

        if batch_size % num_ranks:
            raise ValueError(f"batch_size {batch_size} must be a multiple of the number of ranks ({num_ranks})")
        local = batch_size // num_ranks
        begin = rank * local

        def make(index: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            counts, ids, labels = self.batch(int(index), batch_size, stream)
            part = slice(begin, begin + local)
            return preprocess_dense(counts[part]), ids[part], labels[part, None]

        def to_tensors(index: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
            dense, ids, labels = tf.numpy_function(make, [index], (tf.float32, tf.int64, tf.float32), stateful=False)
            dense.set_shape([local, NUM_DENSE])
            ids.set_shape([local, self.ids_per_sample])
            labels.set_shape([local, 1])
            return dense, ids, labels

        return tf.data.Dataset.range(steps).map(to_tensors, num_parallel_calls=2, deterministic=True).prefetch(2)


class MultiHotGenerator(CriteoGenerator):
    """MLPerf DLRM-DCNv2's multi-hot samples: feature ``i`` a bag of ``hotness[i]`` power-law ids
    per sample, tables of :data:`MLPERF_ROWS` rows capped at ``max_rows``; a hidden click model as
    :class:`CriteoGenerator`'s, with a feature's effect the sum of its bag's effects over
    ``sqrt(hotness[i])``. Deterministic by seed.

    Args:
        seed: fixes the hidden model and every batch.
        max_rows: the cap on the tables' rows (:func:`capped_cardinalities`).
        hotness: ids per sample of each of the 26 features (:data:`MLPERF_HOTNESS` by default).
        zipf_exponent: the power law of the ids.

    Attributes:
        rows: rows of each of the 26 tables.
        hotness: ids per sample of each feature.
        offsets: feature ``i``'s ids are the columns ``offsets[i]:offsets[i + 1]`` of a batch's ids.
        ids_per_sample: ``sum(hotness)``.

    Example::

        gen = MultiHotGenerator(seed=0, max_rows=1 << 16)
        counts, ids, labels = gen.batch(0, 1024)          # ids int64 [1024, 214]
        bag = ids[:, gen.offsets[20] : gen.offsets[21]]   # feature 21's 100 ids per sample
    """

    def __init__(
        self,
        seed: int = 0,
        max_rows: int = 1 << 16,
        hotness: Sequence[int] = MLPERF_HOTNESS,
        zipf_exponent: float = ZIPF_EXPONENT,
    ) -> None:
        self.hotness = check_hotness(hotness)
        self.offsets = tuple(int(o) for o in np.concatenate([[0], np.cumsum(self.hotness)]))
        super().__init__(seed, max_rows, zipf_exponent)

    def _table_rows(self, max_rows: int) -> tuple[int, ...]:
        """MLPerf's table sizes capped at ``max_rows``."""
        return capped_cardinalities(max_rows)

    @property
    def ids_per_sample(self) -> int:
        """Columns of a batch's ids: ``sum(hotness)``."""
        return self.offsets[-1]

    def _column_features(self) -> np.ndarray:
        return np.repeat(np.arange(NUM_CATEGORICAL, dtype=np.int64), self.hotness)

    def _feature_effects(self, ids: np.ndarray) -> np.ndarray:
        """[B, 26] effect of each feature: the sum of its bag's effects over ``sqrt(hotness)``."""
        summed = np.add.reduceat(self._effects(ids), np.asarray(self.offsets[:-1]), axis=1)
        return summed / np.sqrt(np.asarray(self.hotness, dtype=np.float64))[None, :]


# -- the real data ----------------------------------------------------------------------------
_HEX_DIGITS = "0123456789abcdefABCDEF"


def _hex_to_int64(strings: Any) -> Any:
    """The value of hexadecimal strings of at most 16 digits (Criteo's hashed categories have 8;
    an empty field is 0), as int64 bits; a string with another character fails the dataset with
    an InvalidArgumentError naming it."""
    import tensorflow as tf

    padded = tf.strings.substr(tf.strings.join(["0000000000000000", strings]), -16, 16)
    chars = tf.cast(tf.io.decode_raw(padded, tf.uint8), tf.int32)  # [..., 16]
    digit = tf.where(chars <= ord("9"), chars - ord("0"), tf.bitwise.bitwise_or(chars, 0x20) - ord("a") + 10)
    lower = tf.bitwise.bitwise_or(chars, 0x20)
    valid = tf.reduce_all(
        tf.where(chars <= ord("9"), chars >= ord("0"), (lower >= ord("a")) & (lower <= ord("f"))), axis=-1
    )
    check = tf.debugging.Assert(
        tf.reduce_all(valid),
        [
            f"read_criteo_tsv: a categorical field is not hexadecimal ({_HEX_DIGITS} only, at most 16 "
            f"digits; Criteo's day files hold 8-digit hashes); the first such fields follow:",
            tf.boolean_mask(strings, tf.logical_not(valid))[:3],
        ],
    )
    with tf.control_dependencies([check]):
        digit = tf.cast(tf.identity(digit), tf.int64)
    value = tf.zeros(tf.shape(digit)[:-1], tf.int64)
    for k in range(16):  # int64 overflow wraps, keeping the bits of 16-digit values
        value = value * 16 + digit[..., k]
    return value


def read_criteo_tsv(
    paths: Sequence[str] | str,
    batch_size: int,
    rows: Sequence[int],
    drop_remainder: bool = True,
    rank: int = 0,
    num_ranks: int = 1,
) -> Any:
    """Criteo's TSV day files as a ``tf.data.Dataset`` of ``(dense, categorical, label)`` batches,
    the layout of :meth:`CriteoGenerator.dataset`.

    A line is ``label \\t I1 .. I13 \\t C1 .. C26``: the label (0 or 1), 13 integer counts and 26
    categories as hexadecimal hashes; any count or category may be empty. Counts are preprocessed
    as :func:`preprocess_dense` (empty: 0); category ``i`` becomes id ``int(hash, 16) % rows[i]``
    (empty: 0), DLRM's hashing of Criteo into tables of ``rows``.

    Args:
        paths: a day file or a list of them (plain text; ``.gz`` is read as gzip).
        batch_size: samples per batch.
        rows: rows of each of the 26 tables (e.g. ``CriteoGenerator(...).rows`` or
            :data:`CRITEO_CARDINALITIES`).
        drop_remainder: drop a last, smaller batch.
        rank / num_ranks: with ``num_ranks`` > 1, each rank gets its contiguous slice of every batch
            of ``batch_size`` lines (a multiple of ``num_ranks``), as :meth:`CriteoGenerator.dataset`.

    Raises:
        ValueError: ``rows`` does not have 26 positive entries.

    Example::

        ds = read_criteo_tsv("day_0", 4096, CRITEO_CARDINALITIES)
        dense, ids, labels = next(iter(ds))
    """
    import tensorflow as tf

    paths = [paths] if isinstance(paths, str) else list(paths)
    if len(rows) != NUM_CATEGORICAL or any(int(r) < 1 for r in rows):
        raise ValueError(f"rows must hold {NUM_CATEGORICAL} positive table sizes, got {list(rows)!r}")
    modulus = tf.constant([int(r) for r in rows], tf.int64)
    defaults = [[0]] + [[0]] * NUM_DENSE + [[""]] * NUM_CATEGORICAL
    compression = "GZIP" if paths and all(p.endswith(".gz") for p in paths) else ""

    def parse(lines: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        fields = tf.io.decode_csv(lines, record_defaults=defaults, field_delim="\t", na_value="")
        label = tf.cast(tf.reshape(fields[0], [-1, 1]), tf.float32)
        dense = preprocess_dense(tf.stack(fields[1 : 1 + NUM_DENSE], axis=1))
        hashes = _hex_to_int64(tf.stack(fields[1 + NUM_DENSE :], axis=1))
        ids = tf.math.floormod(hashes, modulus[None, :])  # floormod: never negative
        return dense, ids, label

    if batch_size % num_ranks or not 0 <= rank < num_ranks:
        raise ValueError(
            f"batch_size {batch_size} must be a multiple of num_ranks {num_ranks}, and rank {rank} in "
            f"0 .. {num_ranks - 1}"
        )
    local = batch_size // num_ranks

    def mine(dense: tf.Tensor, ids: tf.Tensor, label: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        part = slice(rank * local, (rank + 1) * local)
        return dense[part], ids[part], label[part]

    lines = tf.data.TextLineDataset(paths, compression_type=compression)
    batches = lines.batch(batch_size, drop_remainder=drop_remainder or num_ranks > 1).map(parse)
    return (batches.map(mine) if num_ranks > 1 else batches).prefetch(2)
