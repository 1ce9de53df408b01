"""The RocksDB tier: rows survive close and reopen; read_only is honoured; a database another
handle holds is reported as unavailable with the path."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("rocksdict", reason="rocksdict is not installed: pip install 'sok-hps[rocksdb]'")

from hierarchical_parameter_server.tiers.base import TierUnavailable  # noqa: E402
from hierarchical_parameter_server.tiers.rocks_db import RocksDBTier  # noqa: E402

TAGS = {"hps_et.a.sparse_embedding0": 4, "hps_et.a.sparse_embedding1": 16, "hps_et.b.x": 1}


def table(dim: int, n: int = 5000) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(dim)
    return rng.permutation(10**7)[:n].astype(np.int64) - 5 * 10**6, rng.random((n, dim), dtype=np.float32)


def test_close_and_reopen_keeps_every_row(tmp_path):
    path = str(tmp_path / "db")
    tier = RocksDBTier(path, num_threads=2, max_batch_size=999)
    for tag, dim in TAGS.items():
        tier.insert(tag, *table(dim))
    tier.close()
    tier.close()  # idempotent
    again = RocksDBTier(path, num_threads=2)
    for tag, dim in TAGS.items():
        keys, values = table(dim)
        got, found = again.fetch(tag, keys, dim)
        assert found.all()
        np.testing.assert_array_equal(got, values)
        assert again.size(tag) == len(keys)
    again.close()


def test_read_only_reads_and_refuses_writes(tmp_path):
    path = str(tmp_path / "db")
    tier = RocksDBTier(path, num_threads=2)
    keys, values = table(4)
    tier.insert("hps_et.a.sparse_embedding0", keys, values)
    tier.close()
    reader = RocksDBTier(path, read_only=True)
    np.testing.assert_array_equal(reader.fetch("hps_et.a.sparse_embedding0", keys, 4)[0], values)
    with pytest.raises(PermissionError, match="read-only"):
        reader.insert("hps_et.a.sparse_embedding0", keys[:1], values[:1])
    assert not reader.fetch("hps_et.never.written", keys[:3], 4)[1].any()
    reader.close()


def test_read_only_without_a_database_is_unavailable(tmp_path):
    with pytest.raises(TierUnavailable, match="cannot be opened"):
        RocksDBTier(str(tmp_path / "absent"), read_only=True)


def test_a_database_held_open_is_unavailable_with_its_path(tmp_path):
    path = str(tmp_path / "db")
    holder = RocksDBTier(path)
    with pytest.raises(TierUnavailable, match=str(tmp_path / "db")):
        RocksDBTier(path)
    holder.close()


def test_closed_tier_refuses_calls(tmp_path):
    tier = RocksDBTier(str(tmp_path / "db"), num_threads=2)
    tier.close()
    with pytest.raises(RuntimeError, match="is closed"):
        tier.fetch("hps_et.a.b", np.arange(3), 4)
    with pytest.raises(RuntimeError, match="is closed"):
        tier.insert("hps_et.a.b", np.arange(3), np.zeros((3, 4), np.float32))
