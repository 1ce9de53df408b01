"""The demo's data: the Criteo-shaped generator (cardinalities, determinism, ids, the hidden
model) and the reader of Criteo's TSV day files, against NumPy / Python oracles."""

from __future__ import annotations

import numpy as np
import pytest
from sparse_operation_kit.demo.criteo import (
    CRITEO_CARDINALITIES,
    MIN_ROWS,
    NUM_CATEGORICAL,
    NUM_DENSE,
    CriteoGenerator,
    preprocess_dense,
    read_criteo_tsv,
    scaled_cardinalities,
)


@pytest.mark.parametrize("max_rows", [MIN_ROWS, 1000, 1 << 16])
def test_scaled_cardinalities_follow_criteos(max_rows):
    rows = scaled_cardinalities(max_rows)
    assert len(rows) == NUM_CATEGORICAL
    largest = max(CRITEO_CARDINALITIES)
    for scaled, original in zip(rows, CRITEO_CARDINALITIES):
        assert scaled == min(original, max(MIN_ROWS, round(original * max_rows / largest)))
    assert max(rows) == max_rows
    order = np.argsort(CRITEO_CARDINALITIES, kind="stable")
    assert np.all(np.diff(np.asarray(rows)[order]) >= 0), "a larger Criteo feature got a smaller table"


def test_scaled_cardinalities_refuse_a_bad_size():
    with pytest.raises(ValueError, match="max_rows 3 is not valid"):
        scaled_cardinalities(3)


def test_batches_are_deterministic_by_seed_stream_and_index():
    a, b = CriteoGenerator(seed=7, max_rows=5000), CriteoGenerator(seed=7, max_rows=5000)
    for x, y in zip(a.batch(3, 256), b.batch(3, 256)):
        np.testing.assert_array_equal(x, y)
    other_index, other_stream = a.batch(4, 256), a.batch(3, 256, stream="eval")
    other_seed = CriteoGenerator(seed=8, max_rows=5000).batch(3, 256)
    for other in (other_index, other_stream, other_seed):
        assert not np.array_equal(other[1], a.batch(3, 256)[1])


def test_batch_shapes_ranges_and_power_law():
    gen = CriteoGenerator(seed=0, max_rows=1 << 14)
    counts, ids, labels = gen.batch(0, 20000)
    assert counts.shape == (20000, NUM_DENSE) and counts.dtype == np.int64 and counts.min() >= 0
    assert ids.shape == (20000, NUM_CATEGORICAL) and ids.dtype == np.int64
    assert np.all(ids >= 0) and np.all(ids < np.asarray(gen.rows)[None, :])
    assert set(np.unique(labels)) <= {0.0, 1.0} and 0.1 < labels.mean() < 0.4
    big = int(np.argmax(gen.rows))
    frequency = np.bincount(ids[:, big], minlength=gen.rows[big])
    # Power law: id 0 is the most frequent, and the 1% most frequent ids hold far more than 1%.
    assert frequency.argmax() == 0
    top = np.sort(frequency)[::-1][: gen.rows[big] // 100].sum()
    assert top > 0.25 * ids.shape[0]


def test_labels_follow_the_hidden_model():
    gen = CriteoGenerator(seed=1, max_rows=4096)
    counts, ids, labels = gen.batch(0, 50000, stream="eval")
    p = gen.click_probability(counts, ids)
    assert abs(labels.mean() - p.mean()) < 0.01  # calibrated: the labels are drawn from p
    positive = labels == 1
    # AUC of p by ranks (Mann-Whitney): the ceiling is well above chance.
    rank = np.empty(p.size)
    rank[np.argsort(p)] = np.arange(p.size)
    auc = (rank[positive].sum() - positive.sum() * (positive.sum() - 1) / 2) / (positive.sum() * (~positive).sum())
    assert 0.7 < auc < 0.95


def test_dataset_slices_the_global_batch_over_ranks():
    gen = CriteoGenerator(seed=2, max_rows=1000)
    counts, ids, labels = gen.batch(1, 64)
    parts = [list(gen.dataset(2, 64, rank=r, num_ranks=2))[1] for r in range(2)]
    np.testing.assert_array_equal(np.concatenate([p[1].numpy() for p in parts]), ids)
    np.testing.assert_array_equal(np.concatenate([p[2].numpy()[:, 0] for p in parts]), labels)
    np.testing.assert_allclose(np.concatenate([p[0].numpy() for p in parts]), np.log1p(counts), rtol=1e-6)


def test_tsv_reader_parses_lines_the_test_writes(tmp_path):
    rows = [int(r) for r in scaled_cardinalities(1000)]
    rng = np.random.default_rng(0)
    lines, expected = [], []
    for n in range(7):
        label = n % 2
        counts = [str(int(c)) if c >= 0 else "" for c in rng.integers(-3, 500, NUM_DENSE)]  # some empty
        hashes = [f"{int(h):08x}" for h in rng.integers(0, 2**32, NUM_CATEGORICAL)]
        hashes[n % NUM_CATEGORICAL] = ""  # an empty category
        hashes[(n + 1) % NUM_CATEGORICAL] = hashes[(n + 1) % NUM_CATEGORICAL].upper()
        lines.append("\t".join([str(label)] + counts + hashes))
        dense = np.log1p([float(c) if c else 0.0 for c in counts])
        ids = [int(h, 16) % r if h else 0 for h, r in zip(hashes, rows)]
        expected.append((label, dense, ids))
    path = tmp_path / "day_0"
    path.write_text("\n".join(lines) + "\n", encoding="ascii")
    batches = list(read_criteo_tsv(str(path), 4, rows, drop_remainder=False))
    assert [b[0].shape[0] for b in batches] == [4, 3]
    dense = np.concatenate([b[0].numpy() for b in batches])
    ids = np.concatenate([b[1].numpy() for b in batches])
    labels = np.concatenate([b[2].numpy()[:, 0] for b in batches])
    np.testing.assert_array_equal(labels, [e[0] for e in expected])
    np.testing.assert_allclose(dense, np.stack([e[1] for e in expected]), rtol=1e-6)
    np.testing.assert_array_equal(ids, np.asarray([e[2] for e in expected]))


def test_tsv_reader_names_a_field_that_is_not_hexadecimal(tmp_path):
    import tensorflow as tf

    path = tmp_path / "bad"
    path.write_text("\t".join(["1"] + ["1"] * NUM_DENSE + ["zz12"] + ["0a"] * 25) + "\n", encoding="ascii")
    with pytest.raises(tf.errors.InvalidArgumentError, match="not hexadecimal"):
        list(read_criteo_tsv(str(path), 1, CRITEO_CARDINALITIES))


def test_tsv_reader_refuses_bad_rows():
    with pytest.raises(ValueError, match="26 positive table sizes"):
        read_criteo_tsv("x", 4, [10] * 25)


def test_preprocess_dense_numpy_and_tensorflow_agree():
    counts = np.array([[0, 1, 5, -2]], np.int64)
    np.testing.assert_allclose(preprocess_dense(counts), np.log1p([[0, 1, 5, 0]]), rtol=1e-6)
    import tensorflow as tf

    np.testing.assert_allclose(preprocess_dense(tf.constant(counts)).numpy(), preprocess_dense(counts), rtol=1e-6)


def test_tsv_reader_slices_each_batch_over_ranks(tmp_path):
    rows = CRITEO_CARDINALITIES
    lines = ["\t".join([str(n % 2)] + [str(n)] * NUM_DENSE + [f"{n:08x}"] * NUM_CATEGORICAL) for n in range(10)]
    path = tmp_path / "day"
    path.write_text("\n".join(lines) + "\n", encoding="ascii")
    whole = [b[1].numpy() for b in read_criteo_tsv(str(path), 4, rows)]
    parts = [[b[1].numpy() for b in read_criteo_tsv(str(path), 4, rows, rank=r, num_ranks=2)] for r in range(2)]
    assert len(whole) == 2 and all(len(p) == 2 for p in parts)  # the last 2 lines make no full batch
    for i, batch in enumerate(whole):
        np.testing.assert_array_equal(np.concatenate([parts[0][i], parts[1][i]]), batch)
    with pytest.raises(ValueError, match="multiple of num_ranks 3"):
        read_criteo_tsv(str(path), 4, rows, rank=0, num_ranks=3)
