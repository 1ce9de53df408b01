"""The RocksDB tiers, in Python (rocksdict) and in C++ (the system's RocksDB), each test on both
where it applies: rows survive close and reopen; read_only is honoured; a database another handle
or process holds is reported as unavailable with the path; 8 threads fetch and insert at once;
table files are of TABLE_FORMAT_VERSION, and rewrite_tables rewrites those of rocksdict's default
format. A large fetch (keys repeated, missing, in any order, in parts on several threads in C++)
reads every row; retain_only flushes the table into a table file; every table's blocks share one
block cache of BLOCK_CACHE_BYTES. A database either tier wrote, closed or not, the other reads bit
for bit; the C++ tier's defaults and messages are the Python tier's."""

from __future__ import annotations

import importlib
import inspect
import pathlib
import re
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("rocksdict", reason="rocksdict is not installed: pip install 'sok-hps[rocksdb]'")

from hierarchical_parameter_server import _tiers  # noqa: E402
from hierarchical_parameter_server.tiers.base import TierUnavailable  # noqa: E402
from hierarchical_parameter_server.tiers.rocks_db import (  # noqa: E402
    BLOCK_CACHE_BYTES,
    TABLE_FORMAT_VERSION,
    RocksDBTier,
)
from rocksdict import Options, Rdict  # noqa: E402

TAGS = {"hps_et.a.sparse_embedding0": 4, "hps_et.a.sparse_embedding1": 16, "hps_et.b.x": 1}
#: The 8 bytes that end a block-based table file (its footer's magic number).
BLOCK_BASED_TABLE_MAGIC = 0x88E241B785F4CFF7
#: Each implementation's module and class.
TIER_CLASSES = {
    "python": ("hierarchical_parameter_server.tiers.rocks_db", "RocksDBTier"),
    "cpp": ("hierarchical_parameter_server.tiers.rocks_db_cpp", "CppRocksDBTier"),
}
needs_cpp = pytest.mark.skipif(
    not _tiers.WITH_ROCKSDB,
    reason="sok-hps was built without RocksDB (no librocksdb-dev): the C++ rocks_db tier is not built",
)
IMPLEMENTATIONS = ["python", pytest.param("cpp", marks=needs_cpp)]
BOTH_WAYS = [pytest.param("python", "cpp", marks=needs_cpp), pytest.param("cpp", "python", marks=needs_cpp)]


def tier_class_of(implementation: str) -> type:
    module, name = TIER_CLASSES[implementation]
    return getattr(importlib.import_module(module), name)


@pytest.fixture(params=IMPLEMENTATIONS)
def tier_class(request) -> type:
    return tier_class_of(request.param)


def table(dim: int, n: int = 5000) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(dim)
    return rng.permutation(10**7)[:n].astype(np.int64) - 5 * 10**6, rng.random((n, dim), dtype=np.float32)


def any_bits(dim: int, n: int = 3000) -> tuple[np.ndarray, np.ndarray]:
    """Keys over the whole int64 range and rows of any 32 bits (NaNs with payloads among them)."""
    rng = np.random.default_rng(100 + dim)
    keys = np.unique(rng.integers(-(2**63), 2**63 - 1, size=n, dtype=np.int64, endpoint=True))
    return keys, rng.integers(0, 2**32, size=(len(keys), dim), dtype=np.uint32).view(np.float32)


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


def run_python(code: str, **kwargs) -> subprocess.Popen:
    """``code`` running in a Python process of this interpreter and import path."""
    return subprocess.Popen([sys.executable, "-c", code], text=True, **kwargs)


def test_close_and_reopen_keeps_every_row(tmp_path, tier_class):
    path = str(tmp_path / "db")
    tier = tier_class(path, num_threads=2, max_batch_size=999)
    for tag, dim in TAGS.items():
        tier.insert(tag, *table(dim))
    tier.close()
    tier.close()  # idempotent
    again = tier_class(path, num_threads=2)
    for tag, dim in TAGS.items():
        keys, values = table(dim)
        got, found = again.fetch(tag, keys, dim)
        assert found.all()
        np.testing.assert_array_equal(got, values)
        assert again.size(tag) == len(keys)
    again.close()


def test_read_only_reads_and_refuses_writes(tmp_path, tier_class):
    path, tag = str(tmp_path / "db"), "hps_et.a.sparse_embedding0"
    tier = tier_class(path, num_threads=2)
    keys, values = table(4)
    tier.insert(tag, keys, values)
    tier.close()
    reader = tier_class(path, read_only=True)
    np.testing.assert_array_equal(reader.fetch(tag, keys, 4)[0], values)
    with pytest.raises(PermissionError, match="read-only"):
        reader.insert(tag, keys[:1], values[:1])
    with pytest.raises(PermissionError, match="read-only"):
        reader.set_stored_dim(tag, 4)
    with pytest.raises(PermissionError, match="read-only"):
        reader.retain_only(tag, keys[:1])
    assert not reader.fetch("hps_et.never.written", keys[:3], 4)[1].any()
    assert reader.size(tag) == len(keys)
    reader.close()


def test_rewrite_tables_refuses_a_read_only_tier(tmp_path):
    path = str(tmp_path / "db")
    RocksDBTier(path, num_threads=2).close()
    reader = RocksDBTier(path, read_only=True)
    with pytest.raises(PermissionError, match="read-only.*not rewritten"):
        reader.rewrite_tables()
    reader.close()


def test_read_only_without_a_database_is_unavailable(tmp_path, tier_class):
    with pytest.raises(TierUnavailable, match="cannot be opened"):
        tier_class(str(tmp_path / "absent"), read_only=True)


def test_a_database_held_open_is_unavailable_with_its_path(tmp_path, tier_class):
    path = str(tmp_path / "db")
    holder = tier_class(path)
    with pytest.raises(TierUnavailable, match=re.escape(path)):
        tier_class(path)
    holder.close()
    tier_class(path).close()  # free again


@pytest.mark.parametrize("holder", IMPLEMENTATIONS)
def test_a_database_another_process_holds_is_unavailable_with_its_path(tmp_path, tier_class, holder):
    path = str(tmp_path / "db")
    module, name = TIER_CLASSES[holder]
    hold = f"import sys, {module} as m\nt = m.{name}({path!r}, num_threads=2)\nprint('open', flush=True)\n"
    process = run_python(hold + "sys.stdin.read()\nt.close()\n", stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert process.stdout.readline() == "open\n"
        with pytest.raises(TierUnavailable, match=f"{re.escape(path)}.*LOCK"):
            tier_class(path)
    finally:
        process.communicate(timeout=60)
    assert process.returncode == 0
    tier_class(path).close()  # free again


@needs_cpp
def test_cpp_tier_refuses_a_path_the_python_tier_holds_in_this_process(tmp_path):
    """RocksDB does not see the lock of another RocksDB library in its process (rocksdict's): the C++
    tier checks for it, instead of opening the database a second time."""
    from hierarchical_parameter_server.tiers.rocks_db_cpp import CppRocksDBTier

    path = str(tmp_path / "db")
    holder = RocksDBTier(path, num_threads=2)
    with pytest.raises(TierUnavailable, match=f"{re.escape(path)}.*this process holds its LOCK"):
        CppRocksDBTier(path, num_threads=2)
    CppRocksDBTier(path, read_only=True).close()  # reading is allowed
    holder.close()
    CppRocksDBTier(path, num_threads=2).close()


def test_closed_tier_refuses_calls(tmp_path, tier_class):
    tier = tier_class(str(tmp_path / "db"), num_threads=2)
    tier.close()
    with pytest.raises(RuntimeError, match="is closed"):
        tier.fetch("hps_et.a.b", np.arange(3), 4)
    with pytest.raises(RuntimeError, match="is closed"):
        tier.insert("hps_et.a.b", np.arange(3), np.zeros((3, 4), np.float32))
    with pytest.raises(RuntimeError, match="is closed"):
        tier.stored_dim("hps_et.a.b")


def test_eight_threads_fetch_and_insert_at_once(tmp_path, tier_class, run_in_threads):
    """Each thread writes keys of its own and the same shared keys (rows of its number); every fetch
    finds the rows written before it exactly, and each shared row whole, of one writer."""
    tier = tier_class(str(tmp_path / "db"), num_threads=2, max_batch_size=64)
    tag, dim, threads, chunk = "hps_et.a.sparse_embedding0", 8, 8, 50
    keys, values = table(dim, n=threads * 4 * chunk)
    shared = np.arange(40, dtype=np.int64) - 10**7  # not among keys (those are >= -5e6)

    def work(t: int) -> None:
        mine, mine_values = keys[t::threads], values[t::threads]
        for first in range(0, len(mine), chunk):
            tier.insert(tag, mine[first : first + chunk], mine_values[first : first + chunk])
            tier.insert(tag, shared, np.full((len(shared), dim), t, np.float32))
            got, found = tier.fetch(tag, keys, dim)
            np.testing.assert_array_equal(got[found], values[found])  # others' rows: absent yet or exact
            assert found[t::threads][: first + chunk].all()
            got, found = tier.fetch(tag, shared, dim)
            assert found.all() and (got == got[:, :1]).all() and np.isin(got[:, 0], np.arange(threads)).all()

    run_in_threads(threads, work)
    got, found = tier.fetch(tag, keys, dim)
    assert found.all()
    np.testing.assert_array_equal(got, values)
    assert tier.size(tag) == len(keys) + len(shared)
    tier.close()


@needs_cpp
def test_cpp_close_waits_for_the_calls_in_flight(tmp_path, run_in_threads):
    """Threads insert (calls of many write batches) and fetch while another closes the tier: each
    call returns whole or raises "is closed" having written nothing, so the rows of every insert that
    returned are on disk, and no call uses the closed database."""
    from hierarchical_parameter_server.tiers.rocks_db_cpp import CppRocksDBTier

    path, tag, dim, rows_per_call = str(tmp_path / "db"), "hps_et.a.sparse_embedding0", 4, 4000
    tier = CppRocksDBTier(path, num_threads=2, max_batch_size=16)
    returned: list[list[np.ndarray]] = [[] for _ in range(8)]

    def work(t: int) -> None:
        if t == 0:
            while not all(returned[1:]):  # every other thread inserting
                time.sleep(0.001)
            tier.close()
            return
        for call in range(10**6):
            chunk = np.arange(rows_per_call, dtype=np.int64) + (t * 10**9 + call * rows_per_call)
            try:
                tier.insert(tag, chunk, np.full((rows_per_call, dim), t, np.float32))
                returned[t].append(chunk)
                got, found = tier.fetch(tag, chunk, dim)
            except RuntimeError as error:
                assert "is closed" in str(error)
                return
            assert found.all() and (got == t).all()

    run_in_threads(8, work)
    again = CppRocksDBTier(path, read_only=True)
    for t in range(1, 8):
        got, found = again.fetch(tag, np.concatenate(returned[t]), dim)
        assert found.all() and (got == t).all()
    assert again.size(tag) == sum(rows_per_call * len(chunks) for chunks in returned)
    again.close()


def test_a_large_fetch_of_repeated_missing_and_shuffled_keys_reads_every_row(tmp_path, tier_class):
    """More distinct keys than the C++ tier reads on one thread (its parts on sok-core's worker
    pool), over many multi-gets (max_batch_size 1000), in no order, some twice, some never written."""
    path, tag = str(tmp_path / "db"), "hps_et.a.sparse_embedding0"
    keys, values = any_bits(8, n=12000)
    tier = tier_class(path, num_threads=2, max_batch_size=1000)
    tier.insert(tag, keys[:9000], values[:9000])
    rng = np.random.default_rng(7)
    asked = rng.permutation(np.concatenate([np.arange(len(keys)), rng.integers(0, len(keys), 3000)]))
    if _tiers.WITH_ROCKSDB:
        assert len(keys) >= 2 * _tiers.ROCKS_DB_KEYS_PER_THREAD
    got, found = tier.fetch(tag, keys[asked], 8)
    np.testing.assert_array_equal(found, asked < 9000)
    want = np.where((asked < 9000)[:, None], values[np.minimum(asked, 8999)], np.float32(0))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    tier.close()


def test_retain_only_flushes_the_table_into_a_table_file(tmp_path, tier_class):
    """The servers call retain_only once they have written a table: its rows then leave the
    memtable (and the write-ahead log) for a table file."""
    path, tag = str(tmp_path / "db"), "hps_et.a.sparse_embedding0"
    keys, values = table(16, n=3000)
    tier = tier_class(path, num_threads=2, max_batch_size=1000)
    tier.insert(tag, keys, values)
    assert not table_format_versions(path)  # the rows are in the memtable only
    assert tier.retain_only(tag, keys[:2000]) == 1000
    assert len(table_format_versions(path)) == 1
    assert sum(f.stat().st_size for f in pathlib.Path(path).glob("*.sst")) > 2000 * 16 * 4
    got, found = tier.fetch(tag, keys, 16)
    np.testing.assert_array_equal(found, np.arange(3000) < 2000)
    np.testing.assert_array_equal(got[:2000], values[:2000])
    tier.close()


def block_caches_logged(path: str) -> dict[str, tuple[str, int]]:
    """Each column family's block cache as RocksDB's LOG at ``path`` reports it when the family is
    opened or made: ``{family: (the cache's address, its capacity in bytes)}``."""
    caches = {}
    text = (pathlib.Path(path) / "LOG").read_text()
    sections = re.findall(r"Options for column family \[(.*?)\]:\n(.*?)(?=Options for column|\Z)", text, re.S)
    for family, options in sections:
        address = re.search(r"^\s+block_cache: (0x[0-9a-f]+)$", options, re.M)
        capacity = re.search(r"^\s+block_cache_options:\n\s+capacity : (\d+)$", options, re.M)
        caches[family] = (address.group(1), int(capacity.group(1)))
    return caches


def test_every_table_shares_one_block_cache_of_block_cache_bytes(tmp_path, tier_class):
    path = str(tmp_path / "db")
    tier = tier_class(path, num_threads=2)
    tier.insert("hps_et.a.sparse_embedding0", *table(4, n=10))
    tier.close()
    tier = tier_class(path, num_threads=2)  # the default family and a table opened, one made
    tier.insert("hps_et.a.sparse_embedding1", *table(4, n=10))
    tier.close()  # the LOG written out
    caches = block_caches_logged(path)
    assert set(caches) == {"default", "hps_et.a.sparse_embedding0", "hps_et.a.sparse_embedding1"}
    assert len(set(caches.values())) == 1
    assert next(iter(caches.values()))[1] == BLOCK_CACHE_BYTES


def test_table_files_are_of_table_format_version(tmp_path, tier_class):
    path = str(tmp_path / "db")
    tier = tier_class(path, num_threads=2)
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


@needs_cpp
def test_cpp_tier_says_how_to_open_a_database_of_rocksdicts_default_format(tmp_path):
    """A RocksDB before 8.6 cannot read table files of format_version 6: the message says so, and
    rewrite_tables, which it names, makes the database readable."""
    from hierarchical_parameter_server.tiers.rocks_db_cpp import CppRocksDBTier

    if tuple(int(part) for part in _tiers.ROCKSDB_VERSION.split(".")) >= (8, 6):
        pytest.skip(f"the C++ tier's RocksDB {_tiers.ROCKSDB_VERSION} reads format_version 6")
    path, tag = str(tmp_path / "db"), "hps_et.a.sparse_embedding0"
    keys, values = table(4, n=300)
    write_with_rocksdicts_defaults(path, tag, keys, values)
    with pytest.raises(TierUnavailable) as refused:
        CppRocksDBTier(path, read_only=True)
    message = str(refused.value)
    assert path in message and f"newer than the RocksDB {_tiers.ROCKSDB_VERSION}" in message
    assert "RocksDBTier(path).rewrite_tables()" in message
    writer = RocksDBTier(path, num_threads=2)
    writer.rewrite_tables()
    writer.close()
    reader = CppRocksDBTier(path, read_only=True)
    got, found = reader.fetch(tag, keys, 4)
    assert found.all()
    np.testing.assert_array_equal(got, values)
    assert reader.stored_dim(tag) == 4
    reader.close()


def write_tables(tier, recorded: dict[str, int]) -> None:
    """The rows of :func:`any_bits` for every tag of TAGS, and the widths of ``recorded``."""
    for tag, dim in TAGS.items():
        tier.insert(tag, *any_bits(dim))
    for tag, dim in recorded.items():
        tier.set_stored_dim(tag, dim)


def check_tables(tier, recorded: dict[str, int]) -> None:
    """What :func:`write_tables` wrote is in ``tier`` bit for bit, with the widths recorded, or for a
    table without a record, its rows'."""
    for tag, dim in TAGS.items():
        keys, values = any_bits(dim)
        got, found = tier.fetch(tag, keys, dim)
        assert found.all()
        np.testing.assert_array_equal(got.view(np.uint32), values.view(np.uint32))
        assert tier.size(tag) == len(keys)
        assert tier.stored_dim(tag) == recorded.get(tag, dim)


@pytest.mark.parametrize(("writer", "reader"), BOTH_WAYS)
@pytest.mark.parametrize("read_only", [True, False], ids=["read_only", "writable"])
def test_a_database_one_tier_wrote_the_other_reads(tmp_path, writer, reader, read_only):
    path = str(tmp_path / "db")
    recorded = {"hps_et.a.sparse_embedding0": 4, "hps_et.b.x": 7}  # hps_et.a.sparse_embedding1: its rows' 16
    tier = tier_class_of(writer)(path, num_threads=2, max_batch_size=1000)
    write_tables(tier, recorded)
    tier.close()
    other = tier_class_of(reader)(path, num_threads=2, read_only=read_only)
    check_tables(other, recorded)
    other.close()


@pytest.mark.parametrize(("writer", "reader"), BOTH_WAYS)
def test_the_other_tier_reads_the_log_of_a_process_that_died_without_close(tmp_path, writer, reader):
    """The writer never closed: the last rows it wrote are only in its write-ahead log."""
    path = str(tmp_path / "db")
    recorded = {"hps_et.a.sparse_embedding0": 4}
    module, name = TIER_CLASSES[writer]
    died = run_python(
        f"import os, {module} as m, {pathlib.Path(__file__).stem} as t\n"
        f"tier = m.{name}({path!r}, num_threads=2)\n"
        f"t.write_tables(tier, {recorded!r})\n"
        "os._exit(0)  # tier never closed\n",
        cwd=pathlib.Path(__file__).parent,
    )
    assert died.wait(timeout=120) == 0
    assert any(log.stat().st_size for log in pathlib.Path(path).glob("*.log"))
    other = tier_class_of(reader)(path, num_threads=2, read_only=True)
    check_tables(other, recorded)
    other.close()


@needs_cpp
def test_cpp_defaults_are_the_python_tiers():
    from hierarchical_parameter_server.tiers.rocks_db_cpp import CppRocksDBTier

    def defaults(tier_class: type) -> dict[str, object]:
        parameters = inspect.signature(tier_class).parameters.values()
        return {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}

    assert _tiers.ROCKS_DB_DEFAULT_OPTIONS == defaults(RocksDBTier) == defaults(CppRocksDBTier)
    assert _tiers.ROCKS_DB_TABLE_FORMAT_VERSION == TABLE_FORMAT_VERSION
    assert _tiers.ROCKS_DB_BLOCK_CACHE_BYTES == BLOCK_CACHE_BYTES


@needs_cpp
def test_cpp_tier_refuses_options_below_one(tmp_path):
    from hierarchical_parameter_server.tiers.rocks_db_cpp import CppRocksDBTier

    with pytest.raises(ValueError, match="num_threads and max_batch_size must be >= 1, got 0, 65536"):
        CppRocksDBTier(str(tmp_path / "db"), num_threads=0)
    with pytest.raises(ValueError, match="num_threads and max_batch_size must be >= 1, got 16, 0"):
        CppRocksDBTier(str(tmp_path / "db"), max_batch_size=0)


@needs_cpp
def test_a_fetch_of_another_width_fails_with_the_python_tiers_message(tmp_path):
    path, tag = str(tmp_path / "db"), "hps_et.a.sparse_embedding0"
    writer = RocksDBTier(path, num_threads=2)
    writer.insert(tag, np.arange(3), np.ones((3, 6), np.float32))
    writer.insert(tag, np.arange(3, 5), np.ones((2, 4), np.float32))  # the tiers write any width
    writer.close()
    messages = []
    for implementation in TIER_CLASSES:
        reader = tier_class_of(implementation)(path, read_only=True)
        with pytest.raises(ValueError, match=r"rows of \[4, 6\] floats, asked for dim 8") as refused:
            reader.fetch(tag, np.arange(6), 8)
        messages.append(str(refused.value))
        reader.close()
    assert messages[0] == messages[1]


@needs_cpp
def test_a_fetch_of_another_width_names_every_width_of_its_rows_in_both_tiers(tmp_path):
    """The widths are in different multi-gets (max_batch_size 2): the message names all of them, in
    both tiers."""
    path, tag = str(tmp_path / "db"), "hps_et.a.sparse_embedding0"
    writer = RocksDBTier(path, num_threads=2)
    writer.insert(tag, np.arange(5000), np.ones((5000, 6), np.float32))
    writer.insert(tag, np.arange(5000, 5002), np.ones((2, 4), np.float32))
    writer.insert(tag, np.arange(5002, 10000), np.ones((4998, 8), np.float32))
    writer.close()
    messages = []
    for implementation in TIER_CLASSES:
        reader = tier_class_of(implementation)(path, read_only=True, max_batch_size=2)
        with pytest.raises(ValueError, match=r"rows of \[4, 6, 8\] floats, asked for dim 8") as refused:
            reader.fetch(tag, np.arange(10000)[::-1], 8)
        messages.append(str(refused.value))
        reader.close()
    assert messages[0] == messages[1]


@needs_cpp
def test_a_write_to_a_read_only_tier_fails_with_the_python_tiers_message(tmp_path):
    path, tag = str(tmp_path / "it's a db"), "hps_et.a.sparse_embedding0"  # repr() in double quotes
    RocksDBTier(path, num_threads=2).close()
    messages = []
    for implementation in TIER_CLASSES:
        reader = tier_class_of(implementation)(path, read_only=True)
        with pytest.raises(PermissionError) as refused:
            reader.insert(tag, np.arange(2), np.ones((2, 4), np.float32))
        messages.append(str(refused.value))
        reader.close()
    assert (
        messages[0]
        == messages[1]
        == f"rocks_db at {path!r} is opened read-only (persistent_db.read_only); {tag} not written"
    )
