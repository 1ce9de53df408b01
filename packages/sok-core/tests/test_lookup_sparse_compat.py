"""sok.lookup_sparse as NVIDIA SOK 2.x users call it, in one process (issue 16).

* Weighted ``mean`` with weights whose per-sample sum is negative, zero or positive: the result is
  ``tf.nn.embedding_lookup_sparse``'s (``sum(w * e) / sum(w)``, zeros only where the sum is 0),
  for static (distributed, localized) and dynamic tables, eager and in a tf.function; gradients
  with respect to the table and to the weights too. ``sqrtn`` and ``sum`` alongside.
* ``use_low_frequency_filter`` (reference §1.12) with the ``filter_ratio`` option of
  ``sok.DynamicVariable``, on both backends (``"hbm"``, ``"hybrid"``):
  ratio 1 changes nothing, ratio 0 never inserts a new key while known keys are still looked up
  and trained, and a ratio in between admits occurrences of new keys at that rate.

Oracles: ``tf.nn.embedding_lookup_sparse`` on the full table (new keys of a filtered lookup are
zero rows there, which is the filter's semantics: they add nothing, yet count in the divisor), and
NumPy.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
import sparse_operation_kit as sok  # noqa: E402
from sparse_operation_kit import communication  # noqa: E402

DIM = 3
ROWS = 8

#: Per sample: ids (rows of the table) and weights, whose sums are negative, zero or positive.
#: Weights are multiples of 1/4, so every sum is exact in any order.
SAMPLES = (
    ([1, 2], [-1.0, -0.5]),  # sum -1.5
    ([0, 3], [1.5, -1.5]),  # sum 0 (mixed signs)
    ([4], [0.0]),  # sum 0 (a zero weight)
    ([5, 6, 7], [0.75, 0.25, -2.0]),  # sum -1 (mixed signs)
    ([], []),  # empty
    ([2, 2, 6], [0.5, 1.25, 0.25]),  # sum 2, a repeated id
    ([7], [-0.25]),  # sum -0.25
    ([3, 1], [2.0, -0.5]),  # sum 1.5
)
KINDS = ("distributed", "localized", "hbm", "hybrid")
HYBRID_OPTIONS = {"init_capacity": 1024, "max_capacity": 1 << 16}


@pytest.fixture(autouse=True)
def single_process(monkeypatch: pytest.MonkeyPatch):
    """sok as after sok.init() in one process; the global tool is restored afterwards."""
    monkeypatch.setattr(communication, "_tool", communication.SingleProcess())


def _full(seed: int = 0, rows: int = ROWS) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(rows, DIM)).astype(np.float32)


def _key(row: int) -> int:
    """The key of row ``row`` of a dynamic table: spread out, negative ones too."""
    return (row - 3) * 1_000_003


def _table(kind: str, full: np.ndarray, **options):
    if kind == "distributed":
        return sok.Variable(full, dtype=tf.float32)
    if kind == "localized":
        return sok.Variable(full, dtype=tf.float32, mode="localized:0")
    extra = HYBRID_OPTIONS if kind == "hybrid" else {}
    var = sok.DynamicVariable(dimension=DIM, var_type=kind, initializer="-99", **extra, **options)
    keys = np.array([_key(r) for r in range(full.shape[0])], np.int64)
    sok.assign(var, tf.constant(keys), tf.constant(full))
    return var


def _ragged(values, lengths, dtype):
    return tf.RaggedTensor.from_row_lengths(tf.constant(values, dtype), tf.constant(lengths, tf.int64))


def _dense_gradient(grad, kind: str, rows: int) -> np.ndarray:
    """The table gradient as ``[rows, DIM]`` (dynamic tables: keys mapped back to rows)."""
    assert isinstance(grad, tf.IndexedSlices), type(grad)
    indices = np.asarray(grad.indices).reshape(-1)
    if kind in BACKENDS:
        row_of = {_key(r): r for r in range(rows)}
        indices = np.array([row_of[int(k)] for k in indices], np.int64)
    dense = np.zeros((rows, DIM), np.float32)
    np.add.at(dense, indices, np.asarray(grad.values).reshape(-1, DIM))
    return dense


def _oracle(full: np.ndarray, rows: list, weights: list | None, lengths: list, combiner: str, cot: np.ndarray):
    """tf.nn.embedding_lookup_sparse on ``full``: embeddings, and the gradients of
    ``sum(embeddings * cot)`` with respect to the table (dense) and the weights."""
    table = tf.Variable(full)
    w_values = None if weights is None else tf.constant(weights, tf.float32)
    with tf.GradientTape(persistent=True) as tape:
        if w_values is not None:
            tape.watch(w_values)
        ids = _ragged(rows, lengths, tf.int64)
        w = None if w_values is None else tf.RaggedTensor.from_row_lengths(w_values, tf.constant(lengths, tf.int64))
        out = tf.nn.embedding_lookup_sparse(table, ids, w, combiner=combiner)
        out = tf.pad(out, [[0, len(lengths) - tf.shape(out)[0]], [0, 0]])  # trailing empty samples
        loss = tf.reduce_sum(out * cot)
    dense = tf.convert_to_tensor(tape.gradient(loss, table)).numpy()
    w_grad = None if w_values is None else tape.gradient(loss, w_values).numpy()
    return out.numpy(), dense, w_grad


def _samples():
    rows = [r for ids, _ in SAMPLES for r in ids]
    weights = [w for _, ws in SAMPLES for w in ws]
    lengths = [len(ids) for ids, _ in SAMPLES]
    return rows, weights, lengths


def _sok_step(var, kind: str, combiner: str, mode: str, filtered: bool = False):
    """``sok.lookup_sparse`` and its gradients (table and weight values) of ``sum(emb * cot)``."""
    dtype = tf.int64

    def step(ids_values, lengths, w_values, cot):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(w_values)
            ids = tf.RaggedTensor.from_row_lengths(ids_values, lengths)
            w = tf.RaggedTensor.from_row_lengths(w_values, lengths)
            emb = sok.lookup_sparse(var, ids, w, combiners=combiner, use_low_frequency_filter=filtered)
            loss = tf.reduce_sum(emb * cot)
        return emb, tape.gradient(loss, var), tape.gradient(loss, w_values)

    if mode == "function":
        step = tf.function(step)
    rows, weights, lengths = _samples()
    ids = [_key(r) for r in rows] if kind in BACKENDS else rows
    return step, (tf.constant(ids, dtype), tf.constant(lengths, tf.int64), tf.constant(weights, tf.float32))


# -- item 1: weighted mean (and sqrtn) whatever the sign of the sum of weights --------------------


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("combiner", ["mean", "sqrtn", "sum"])
@pytest.mark.parametrize("kind", KINDS)
def test_weighted_lookup_matches_tensorflow_for_any_sum_of_weights(kind: str, combiner: str, mode: str) -> None:
    full = _full()
    var = _table(kind, full)
    step, inputs = _sok_step(var, kind, combiner, mode)
    rows, weights, lengths = _samples()
    cot = np.random.default_rng(1).normal(size=(len(lengths), DIM)).astype(np.float32)
    emb, grad, w_grad = step(*inputs, tf.constant(cot))
    want, want_grad, want_w_grad = _oracle(full, rows, weights, lengths, combiner, cot)
    np.testing.assert_allclose(emb.numpy(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_dense_gradient(grad, kind, ROWS), want_grad, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(w_grad.numpy(), want_w_grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_weighted_mean_divides_by_a_negative_sum_and_zeros_only_a_zero_sum(kind: str) -> None:
    """NumPy's ``sum(w * e) / sum(w)`` per sample: samples 0, 3 and 6 have negative sums."""
    full = _full()
    var = _table(kind, full)
    step, inputs = _sok_step(var, kind, "mean", "eager")
    emb = step(*inputs, tf.zeros([len(SAMPLES), DIM]))[0].numpy()
    for s, (ids, ws) in enumerate(SAMPLES):
        total = sum(ws)
        want = np.zeros(DIM) if total == 0 else sum(w * full[i] for i, w in zip(ids, ws)) / total
        np.testing.assert_allclose(emb[s], want, rtol=1e-5, atol=1e-6, err_msg=f"sample {s}, weights {ws}")
    assert np.abs(emb[[0, 3, 6]]).min() > 0, "samples with a negative sum of weights gave zeros"


# -- item 2: the low-frequency filter --------------------------------------------------------------

#: The filter runs in sok-core on the storage ops (find, then the lookup), so it serves every
#: backend with a C ABI, the plugins' too (det and hkv are plugins of the same hook).
BACKENDS = ("hbm", "hybrid")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


def _dynamic(backend: str, initializer: str = "1", **options):
    extra = HYBRID_OPTIONS if backend == "hybrid" else {}
    return sok.DynamicVariable(dimension=DIM, var_type=backend, initializer=initializer, **extra, **options)


def _keys_of(var) -> set[int]:
    keys, _ = sok.export(var)
    return {int(k) for k in np.asarray(keys)}


@pytest.mark.parametrize("ratio", [-0.1, 1.5, float("nan"), "0.5", True, None])
def test_filter_ratio_outside_0_1_is_refused_naming_the_value(ratio) -> None:
    with pytest.raises(
        ValueError, match=rf"filter_ratio {re.escape(repr(ratio))} is not valid; valid: a number in \[0, 1\]"
    ):
        sok.DynamicVariable(dimension=DIM, filter_ratio=ratio)


def test_filter_ratio_is_a_sok_option_not_a_backend_option(backend: str) -> None:
    """Every backend takes it (backends refuse options they do not know): it is sok-core's."""
    var = _dynamic(backend, filter_ratio=0.25)
    assert var.filter_ratio == 0.25
    assert "filter_ratio" not in var.config_dict
    assert _dynamic(backend).filter_ratio == 1.0


@pytest.mark.parametrize("value", [2, "yes", None, 0.5])
def test_use_low_frequency_filter_must_be_a_bool(value) -> None:
    var = _dynamic("hbm")
    with pytest.raises(TypeError, match=r"use_low_frequency_filter must be True or False"):
        sok.lookup_sparse(var, tf.ragged.constant([[1]], dtype=tf.int64), use_low_frequency_filter=value)


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_ratio_1_changes_nothing(backend: str, mode: str) -> None:
    """The default ratio: filtered and unfiltered lookups of twin tables give the same rows,
    gradients and inserted keys."""
    results = []
    for filtered in (False, True):
        var = _dynamic(backend, initializer="0.5")
        sok.assign(var, tf.constant([_key(r) for r in range(4)], tf.int64), tf.constant(_full(rows=4)))
        step, inputs = _sok_step(var, backend, "mean", mode, filtered=filtered)
        cot = tf.constant(np.random.default_rng(2).normal(size=(len(SAMPLES), DIM)).astype(np.float32))
        emb, grad, _ = step(*inputs, cot)
        results.append((emb.numpy(), _dense_gradient(grad, backend, ROWS), _keys_of(var)))
    (emb0, grad0, keys0), (emb1, grad1, keys1) = results
    assert keys1 == keys0 == {_key(r) for r in range(ROWS)}
    np.testing.assert_array_equal(emb1, emb0)
    np.testing.assert_array_equal(grad1, grad0)


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("combiner", ["mean", "sum", "sqrtn"])
def test_ratio_0_looks_up_known_keys_only(backend: str, combiner: str, mode: str) -> None:
    """Rows 0..3 are in the table, rows 4..7 are new: new keys are never inserted, add nothing,
    get no gradient, and still count in the divisor; the known keys are looked up and trained."""
    full = _full()
    var = _dynamic(backend, initializer="-99", filter_ratio=0.0)
    known = {_key(r) for r in range(4)}
    sok.assign(var, tf.constant([_key(r) for r in range(4)], tf.int64), tf.constant(full[:4]))
    step, inputs = _sok_step(var, backend, combiner, mode, filtered=True)
    rows, weights, lengths = _samples()
    cot = np.random.default_rng(3).normal(size=(len(lengths), DIM)).astype(np.float32)
    for _ in range(2):  # a second call: still nothing inserted
        emb, grad, _ = step(*inputs, tf.constant(cot))
    assert _keys_of(var) == known
    oracle_table = full.copy()
    oracle_table[4:] = 0  # a dropped occurrence adds nothing
    want, want_grad, _ = _oracle(oracle_table, rows, weights, lengths, combiner, cot)
    np.testing.assert_allclose(emb.numpy(), want, rtol=1e-5, atol=1e-6)
    assert {int(k) for k in np.asarray(grad.indices)} <= known, "a dropped key got a gradient"
    np.testing.assert_allclose(_dense_gradient(grad, backend, ROWS)[:4], want_grad[:4], rtol=1e-5, atol=1e-6)

    # One training step updates the known rows by the gradient and inserts nothing.
    optimizer = sok.OptimizerWrapper(tf.keras.optimizers.SGD(learning_rate=0.5))
    optimizer.apply_gradients([(grad, var)])
    rows_after = tf.nn.embedding_lookup(var, tf.constant([_key(r) for r in range(4)], tf.int64)).numpy()
    np.testing.assert_allclose(rows_after, full[:4] - 0.5 * want_grad[:4], rtol=1e-5, atol=1e-6)
    assert _keys_of(var) == known


def test_static_tables_ignore_the_filter() -> None:
    full = _full()
    for kind in ("distributed", "localized"):
        var = _table(kind, full)
        step, inputs = _sok_step(var, kind, "mean", "eager", filtered=True)
        rows, weights, lengths = _samples()
        emb = step(*inputs, tf.zeros([len(lengths), DIM]))[0]
        want = _oracle(full, rows, weights, lengths, "mean", np.zeros((len(lengths), DIM), np.float32))[0]
        np.testing.assert_allclose(emb.numpy(), want, rtol=1e-5, atol=1e-6)


def _binomial_bound(n: int, p: float) -> tuple[float, float]:
    """Mean +- 5 standard deviations of Binomial(n, p): a false alarm about once in 3.5 million."""
    sd = math.sqrt(n * p * (1 - p))
    return n * p - 5 * sd, n * p + 5 * sd


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_ratio_between_admits_new_keys_at_that_rate(backend: str, mode: str) -> None:
    """4000 distinct new keys, one per sample, ratio 0.3: the admitted ones are those inserted and
    those whose sample is not zero, and their number is within the binomial bound; 200 known keys
    are always admitted."""
    tf.random.set_seed(11)
    n, ratio = 4000, 0.3
    var = _dynamic(backend, initializer="1", filter_ratio=ratio)
    known = np.arange(-200, 0, dtype=np.int64) * 7
    sok.assign(var, tf.constant(known), tf.fill([known.size, DIM], 2.0))
    new = np.arange(1, n + 1, dtype=np.int64) * 1_000_003
    ids = tf.RaggedTensor.from_row_lengths(tf.constant(np.concatenate([new, known])), tf.ones([n + 200], tf.int64))

    def lookup(ids):
        return sok.lookup_sparse(var, ids, combiners="sum", use_low_frequency_filter=True)

    emb = (tf.function(lookup) if mode == "function" else lookup)(ids).numpy()
    admitted = np.flatnonzero(emb[:n, 0] != 0)
    np.testing.assert_array_equal(emb[admitted], np.ones((admitted.size, DIM)))
    np.testing.assert_array_equal(emb[n:], np.full((known.size, DIM), 2.0))
    assert _keys_of(var) == set(new[admitted].tolist()) | set(known.tolist())
    low, high = _binomial_bound(n, ratio)
    assert low <= admitted.size <= high, f"{admitted.size} of {n} new keys admitted at ratio {ratio}"


def test_ratio_between_filters_each_occurrence(backend: str) -> None:
    """One new key 2000 times in one sample (sum): each occurrence is admitted on its own, so the
    sample sums the admitted occurrences; the key is inserted once one is admitted."""
    tf.random.set_seed(12)
    m, ratio = 2000, 0.25
    var = _dynamic(backend, initializer="1", filter_ratio=ratio)
    ids = tf.RaggedTensor.from_row_lengths(tf.fill([m], tf.constant(42, tf.int64)), tf.constant([m], tf.int64))
    emb = sok.lookup_sparse(var, ids, combiners="sum", use_low_frequency_filter=True).numpy()
    count = emb[0, 0]
    np.testing.assert_array_equal(emb[0], np.full(DIM, count))
    low, high = _binomial_bound(m, ratio)
    assert low <= count <= high, f"{count} of {m} occurrences admitted at ratio {ratio}"
    assert _keys_of(var) == {42}


def test_filter_is_reproducible_under_tf_random_set_seed(backend: str) -> None:
    admitted = []
    for _ in range(2):
        tf.random.set_seed(5)
        var = _dynamic(backend, initializer="1", filter_ratio=0.5)
        ids = tf.RaggedTensor.from_row_lengths(tf.range(1, 301, dtype=tf.int64), tf.ones([300], tf.int64))
        emb = sok.lookup_sparse(var, ids, combiners="sum", use_low_frequency_filter=True).numpy()
        admitted.append(np.flatnonzero(emb[:, 0]))
    np.testing.assert_array_equal(admitted[0], admitted[1])
    assert 0 < admitted[0].size < 300
