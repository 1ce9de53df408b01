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
