"""Each rank's shard of a distributed sok.Variable at any world size, without launching ranks: a
stand-in communication tool plays rank ``r`` of ``n`` whose peers made the same call."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import sparse_operation_kit as sok  # noqa: E402
from sparse_operation_kit import communication  # noqa: E402


class PeersAgree(communication.SingleProcess):
    """Rank ``rank`` of ``n``; every peer sends what this rank sends (they made the same call)."""

    def __init__(self, rank: int, n: int) -> None:
        self._rank, self._n = rank, n

    def rank(self) -> int:
        return self._rank

    def num_ranks(self) -> int:
        return self._n

    def allgather(self, tensor, name=None):
        return tf.concat([tensor] * self._n, 0)


@pytest.mark.parametrize(("rows", "n"), [(1, 3), (2, 4), (5, 8)])
def test_ranks_beyond_the_last_row_hold_an_empty_shard(monkeypatch, rows: int, n: int) -> None:
    table = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
    for rank in range(n):
        monkeypatch.setattr(communication, "_tool", PeersAgree(rank, n))
        v = sok.Variable(table, dtype=tf.float32)
        np.testing.assert_array_equal(v.numpy(), table[rank::n])
        assert tuple(v.global_shape.as_list()) == (rows, 3)


@pytest.mark.parametrize(
    ("initial_value", "dtype"),
    [(tf.constant([[1, 2, 3]]), None), (tf.zeros((2, 3), tf.float64), None), (np.zeros((2, 3)), tf.float64)],
    ids=["int32-tensor", "float64-tensor", "float64-dtype"],
)
def test_rows_of_another_dtype_are_refused_when_the_table_is_made(initial_value, dtype) -> None:
    """A table the lookups cannot read fails where it is made, naming the dtype and the fix (it
    failed at the first lookup before); test_half_rows.py has the float16 / bfloat16 tables."""
    with pytest.raises(
        ValueError,
        match=r"(rows of dtype \w+ are|dtype=tf.float64 is) not supported; valid: float32, float16, bfloat16",
    ):
        sok.Variable(initial_value, dtype=dtype)
    converted = sok.Variable(tf.cast(initial_value, tf.float32))
    assert converted.dtype == tf.float32


@pytest.mark.parametrize(
    "initial_value",
    [[[3, 4, 5]], np.arange(6).reshape(2, 3), np.linspace(0.0, 1.0, 6).reshape(2, 3)],
    ids=["int-list", "int64-numpy", "float64-numpy"],
)
def test_numbers_given_without_a_dtype_become_float32_rows(initial_value) -> None:
    """NVIDIA's own scripts write sok.Variable([[3, 4, 5]]): a list or NumPy array of numbers with no
    dtype is a table of float32 rows."""
    v = sok.Variable(initial_value)
    assert v.dtype == tf.float32
    np.testing.assert_array_equal(v.numpy(), np.asarray(initial_value, np.float32))
