"""sok.lookup_sparse, sok.all2all_dense_embedding, sok.Variable and sok.init in one process (np 1).

Every check of ``distributed/lookup_checks.py`` (the ones the np 2 worker runs) runs here in-process
with one rank: the seed example's numbers (reference §1.5, §2.8), sharding, the TensorFlow oracle
(``tf.nn.embedding_lookup_sparse`` on the full tables; gradients; one training step), and errors.
A few single-process cases with literal numbers follow.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
import sparse_operation_kit as sok  # noqa: E402
from sparse_operation_kit import communication  # noqa: E402
from sparse_operation_kit import experiment as sok_experiment  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent / "distributed"))
import lookup_checks  # noqa: E402

#: Checks that fail at np 1 because of library bugs: strict, so a fix turns them into failures.
KNOWN_BUGS: dict[str, str] = {}  # check name -> reason, for checks that are expected to fail


@pytest.fixture
def single_process(monkeypatch: pytest.MonkeyPatch):
    """sok as after sok.init() in one process; the global tool is restored afterwards."""
    monkeypatch.setattr(communication, "_tool", communication.SingleProcess())


@pytest.fixture
def no_init(monkeypatch: pytest.MonkeyPatch):
    """sok before sok.init(); the global tool is restored afterwards."""
    monkeypatch.setattr(communication, "_tool", None)


def _params() -> list:
    params = []
    for name in lookup_checks.CHECKS:
        marks = [pytest.mark.xfail(reason=KNOWN_BUGS[name], strict=True)] if name in KNOWN_BUGS else []
        params.append(pytest.param(name, marks=marks, id=name))
    return params


@pytest.mark.parametrize("name", _params())
def test_check_single_process(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    tool = None if name in lookup_checks.PRE_INIT else communication.SingleProcess()
    monkeypatch.setattr(communication, "_tool", tool)
    lookup_checks.CHECKS[name](lookup_checks.Comm())


# -- literal numbers ----------------------------------------------------------------------------


def _seed_tables():
    return (
        sok.Variable(np.arange(17 * 3).reshape(17, 3), dtype=tf.float32),
        sok.Variable(np.arange(7 * 5).reshape(7, 5), dtype=tf.float32),
    )


def _seed_ids():
    return tf.ragged.constant([[1, 1], [3, 4, 5]], dtype=tf.int64), tf.ragged.constant([[1], [2, 3]], dtype=tf.int64)


def test_seed_example_sum(single_process):
    v1, v2 = _seed_tables()
    emb1, emb2 = sok.lookup_sparse([v1, v2], list(_seed_ids()), combiners=["sum", "sum"])
    np.testing.assert_array_equal(emb1.numpy(), [[6, 8, 10], [36, 39, 42]])
    np.testing.assert_array_equal(emb2.numpy(), [[5, 6, 7, 8, 9], [25, 27, 29, 31, 33]])


def test_seed_example_mean(single_process):
    v1, v2 = _seed_tables()
    emb1, emb2 = sok.lookup_sparse([v1, v2], list(_seed_ids()), combiners=["mean", "mean"])
    np.testing.assert_array_equal(emb1.numpy(), [[3, 4, 5], [12, 13, 14]])
    np.testing.assert_array_equal(emb2.numpy(), [[5, 6, 7, 8, 9], [12.5, 13.5, 14.5, 15.5, 16.5]])


def test_seed_example_sqrtn(single_process):
    v1, _ = _seed_tables()
    (emb1,) = sok.lookup_sparse([v1], [_seed_ids()[0]], combiners=["sqrtn"])
    np.testing.assert_allclose(emb1.numpy(), [np.array([6, 8, 10]) / np.sqrt(2), np.array([36, 39, 42]) / np.sqrt(3)])


def test_weighted_mean_divides_by_the_sum_of_weights(single_process):
    v1, _ = _seed_tables()
    weights = tf.ragged.constant([[1.0, 3.0], [2.0, 0.0, 2.0]], dtype=tf.float32)
    (emb1,) = sok.lookup_sparse([v1], [_seed_ids()[0]], [weights], combiners=["mean"])
    # Sample 0: (1 + 3) * row 1 / 4; sample 1: (2 * row 3 + 2 * row 5) / 4.
    np.testing.assert_allclose(emb1.numpy(), [[3, 4, 5], [12, 13, 14]])


def test_empty_samples_give_zeros_for_every_combiner(single_process):
    v1, _ = _seed_tables()
    ids = tf.ragged.constant([[], [2], []], dtype=tf.int64)
    for combiner in ("sum", "mean", "sqrtn"):
        (emb,) = sok.lookup_sparse([v1], [ids], combiners=[combiner])
        np.testing.assert_array_equal(emb.numpy(), [[0, 0, 0], [6, 7, 8], [0, 0, 0]])


def test_gradient_is_indexed_slices_over_rows(single_process):
    """One rank owns every row: the gradient's indices are the global ids (reference §2.8 at np 1)."""
    v1, _ = _seed_tables()
    with tf.GradientTape() as tape:
        (emb1,) = sok.lookup_sparse([v1], [_seed_ids()[0]], combiners=["sum"])
        loss = tf.reduce_sum(emb1)
    (grad,) = tape.gradient(loss, [v1])
    assert isinstance(grad, tf.IndexedSlices)
    dense = tf.math.unsorted_segment_sum(grad.values, grad.indices, 17).numpy()
    want = np.zeros((17, 3), np.float32)
    want[1], want[3], want[4], want[5] = 2, 1, 1, 1
    np.testing.assert_array_equal(dense, want)


def test_all2all_dense_embedding_rows_in_order(single_process):
    v = sok.Variable(np.arange(12).reshape(4, 3), dtype=tf.float32)
    out = sok.all2all_dense_embedding(v, tf.constant([3, 0, 3], tf.int64))
    np.testing.assert_array_equal(out.numpy(), [[9, 10, 11], [0, 1, 2], [9, 10, 11]])


def test_all2all_dense_embedding_rejects_2d_indices(single_process):
    v = sok.Variable(np.arange(12).reshape(4, 3), dtype=tf.float32)
    with pytest.raises(ValueError, match="indices must be 1-D"):
        sok.all2all_dense_embedding(v, tf.constant([[1, 2]], tf.int64))


@pytest.mark.parametrize("hotness", [0, -1, True, 1.5])
def test_experiment_hotness_must_be_a_positive_int(single_process, hotness):
    v1, _ = _seed_tables()
    with pytest.raises(ValueError, match=r"hotness\[0\]"):
        sok_experiment.lookup_sparse([v1], [_seed_ids()[0]], hotness=[hotness], combiners=["sum"])


def test_init_rejects_a_second_call(no_init):
    sok.init("single")
    assert (sok.rank(), sok.num_ranks()) == (0, 1)
    with pytest.raises(RuntimeError, match="already called"):
        sok.init("single")
