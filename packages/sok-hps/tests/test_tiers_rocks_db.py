"""The RocksDB tier: rows survive close and reopen; read_only is honoured; a database another
handle holds is reported as unavailable with the path; table files are of TABLE_FORMAT_VERSION, and
rewrite_tables rewrites those of rocksdict's default format."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

pytest.importorskip("rocksdict", reason="rocksdict is not installed: pip install 'sok-hps[rocksdb]'")

from hierarchical_parameter_server.tiers.base import TierUnavailable  # noqa: E402
from hierarchical_parameter_server.tiers.rocks_db import TABLE_FORMAT_VERSION, RocksDBTier  # noqa: E402
from rocksdict import Options, Rdict  # noqa: E402

TAGS = {"hps_et.a.sparse_embedding0": 4, "hps_et.a.sparse_embedding1": 16, "hps_et.b.x": 1}


#: The 8 bytes that end a block-based table file (its footer's magic number).
BLOCK_BASED_TABLE_MAGIC = 0x88E241B785F4CFF7


def table(dim: int, n: int = 5000) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(dim)
    return rng.permutation(10**7)[:n].astype(np.int64) - 5 * 10**6, rng.random((n, dim), dtype=np.float32)


def table_format_versions(path: str) -> list[int]:
    """The format_version of each table file of the database at ``path``: the 4 little-endian bytes
    before the magic number that ends a block-based table's footer."""
    versions = []
    for sst in sorted(pathlib.Path(path).glob("*.sst")):
        with open(sst, "rb") as file:
            file.seek(-12, 2)
            tail = file.read()
        assert int.from_bytes(tail[4:], "little") == BLOCK_BASED_TABLE_MAGIC, f"{sst} is not a block-based table"
        versions.append(int.from_bytes(tail[:4], "little"))
    return versions


def write_with_rocksdicts_defaults(path: str, tag: str, keys: np.ndarray, values: np.ndarray) -> None:
    """A database laid out as the tier's (a family per table, 8-byte keys, a width record), written
    with rocksdict's default options: table files of its RocksDB's default format_version."""
    db = Rdict(path, Options(raw_mode=True))
    family = db.create_column_family(tag, Options(raw_mode=True))
    for key, row in zip(keys.astype("<i8"), values):
        family[key.tobytes()] = row.tobytes()
    db.put(f"hps_dim:{tag}".encode(), str(values.shape[1]).encode())
    del family  # a family's handle keeps the database open
    db.close()


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
    with pytest.raises(PermissionError, match="read-only.*not rewritten"):
        reader.rewrite_tables()
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


def test_table_files_are_of_table_format_version(tmp_path):
    path = str(tmp_path / "db")
    tier = RocksDBTier(path, num_threads=2)
    for tag, dim in TAGS.items():
        tier.insert(tag, *table(dim))
        tier.set_stored_dim(tag, dim)
    tier.close()
    versions = table_format_versions(path)
    assert len(versions) == len(TAGS) + 1  # a file per table, and the widths' of the default family
    assert set(versions) == {TABLE_FORMAT_VERSION}


def test_rewrite_tables_rewrites_a_database_of_rocksdicts_default_format(tmp_path):
    path, tag = str(tmp_path / "db"), "hps_et.a.sparse_embedding0"
    keys, values = table(4, n=300)
    write_with_rocksdicts_defaults(path, tag, keys, values)
    assert set(table_format_versions(path)) == {6}  # rocksdict's RocksDB 9's default
    tier = RocksDBTier(path, num_threads=2)
    tier.rewrite_tables()
    tier.close()
    assert set(table_format_versions(path)) == {TABLE_FORMAT_VERSION}
    again = RocksDBTier(path, read_only=True)
    got, found = again.fetch(tag, keys, 4)
    assert found.all()
    np.testing.assert_array_equal(got, values)
    assert again.stored_dim(tag) == 4 and again.size(tag) == len(keys)
    again.close()
