"""The persistent DB: RocksDB through rocksdict (``persistent_db.type: rocks_db``).

One column family per table tag; a key is the key's 8 little-endian bytes and its value the row's
raw float32 bytes (the original's layout, reference §3.3). Writes are write batches of
``max_batch_size`` rows each, through RocksDB's write-ahead log, so every row written before
:meth:`RocksDBTier.close` (or a crash) is there when the path is opened again. ``read_only`` opens
the database for reading only (e.g. one shared over NFS); ``insert`` then raises
``PermissionError``.

A fetch reads each distinct key once, in the order RocksDB keeps keys (by their bytes), in
multi-gets of at most ``max_batch_size`` keys: RocksDB sorts a multi-get's keys first, which costs
little on keys in that order, and the keys of one block come one after another. The tables' blocks
share one LRU block cache of :data:`BLOCK_CACHE_BYTES`. :meth:`RocksDBTier.retain_only`, which the
servers call once they have written a table (the end of its deploy), then flushes the table's
memtable into a table file: a table file is faster to search than a memtable of many rows.

Table files are written in format_version :data:`TABLE_FORMAT_VERSION` (5, which RocksDB reads
since 6.6), so that the C++ tier (:mod:`.rocks_db_cpp`, built against the system's RocksDB, e.g.
Debian's 7.8.3) opens a database this tier wrote, and this tier one the C++ tier wrote. A database
rocksdict wrote in its default format_version 6 (RocksDB 8.6 or newer reads it) is rewritten by
:meth:`RocksDBTier.rewrite_tables`.

The width of each table is recorded in the default column family (key ``hps_dim:<tag>``, value
the width as decimal text; :meth:`RocksDBTier.set_stored_dim`), so that a server refuses a
deploy of another width; a database written without it reports the size of a stored row.

Example::

    tier = RocksDBTier("/tmp/hps_rocksdb")
    tier.insert("hps_et.m.t", np.arange(4), np.ones((4, 8), np.float32))
    tier.close()
    RocksDBTier("/tmp/hps_rocksdb", read_only=True).fetch("hps_et.m.t", np.arange(4), 8)[1]  # all True
"""

from __future__ import annotations

import logging
import os
import threading

import numpy as np
from rocksdict import (
    AccessType,
    BlockBasedOptions,
    BottommostLevelCompaction,
    Cache,
    CompactOptions,
    DataBlockIndexType,
    Options,
    Rdict,
    WriteBatch,
)

from ..config import PersistentDBConfig
from .base import TierUnavailable, check_keys, check_rows, start_fetch

__all__ = ["BLOCK_CACHE_BYTES", "TABLE_FORMAT_VERSION", "RocksDBTier"]

log = logging.getLogger(__name__)

_DEFAULT_FAMILY = "default"
_DIM_KEY = "hps_dim:"
_POINT_LOOKUP_CACHE_MB = 8
#: The format of the table files the tier writes: 5, which RocksDB reads since 6.6, so that the C++
#: tier built against an older RocksDB than rocksdict's (Debian's 7.8.3) opens what this tier wrote;
#: rocksdict's RocksDB (9.8.4) writes 6 unless told otherwise, which RocksDB before 8.6 cannot read.
TABLE_FORMAT_VERSION = 5
#: The capacity of a tier's block cache, one LRU cache for all its tables (``optimize_for_point_lookup``
#: gives each table one of 8 MiB): blocks read from table files stay there, uncompressed and
#: checksummed, up to this many bytes; the rest are read again from the files (the OS's page cache).
#: The C++ tier's kRocksDbBlockCacheBytes (the tests compare them).
BLOCK_CACHE_BYTES = 256 << 20


def _dim_key(tag: str) -> bytes:
    return (_DIM_KEY + tag).encode()


def _point_lookup_tables(block_cache: Cache) -> BlockBasedOptions:
    """The table options ``optimize_for_point_lookup(8)`` makes (a hash index in each data block,
    a Bloom filter of 10 bits per key), of :data:`TABLE_FORMAT_VERSION`, their blocks in
    ``block_cache`` (instead of an 8 MiB cache of their own)."""
    tables = BlockBasedOptions()
    tables.set_data_block_index_type(DataBlockIndexType.binary_and_hash())
    tables.set_data_block_hash_ratio(0.75)
    tables.set_bloom_filter(10, False)
    tables.set_block_cache(block_cache)
    tables.set_format_version(TABLE_FORMAT_VERSION)
    return tables


def _family_options(block_cache: Cache) -> Options:
    options = Options(raw_mode=True)
    options.optimize_for_point_lookup(_POINT_LOOKUP_CACHE_MB)
    options.set_block_based_table_factory(_point_lookup_tables(block_cache))
    return options


def _in_stored_order(keys: np.ndarray) -> tuple[bytes, np.ndarray]:
    """The distinct ``keys`` (int64) as their stored bytes, in RocksDB's order of them (bytewise), and
    for each key the index of its distinct key: ``(8 bytes a distinct key, int64 [len(keys)])``.

    Example::

        _in_stored_order(np.array([256, 1, 256]))  # (np.array([256, 1], "<i8").tobytes(), [0, 1, 0])
    """
    # A key's stored bytes, read big-endian, order keys as RocksDB does.
    order = keys.astype("<i8").view("<u8").byteswap()
    distinct, where = np.unique(order, return_inverse=True)
    return distinct.astype(">u8").tobytes(), where.reshape(-1)


class RocksDBTier:
    """Rows in a RocksDB database at ``path`` (see the module docstring).

    Args:
        path: the database directory (made when missing, unless ``read_only``).
        num_threads: RocksDB's background threads (``IncreaseParallelism``).
        read_only: open for reading only.
        max_batch_size: rows per multi-get and per write batch.

    Raises:
        TierUnavailable: the database cannot be opened (another process holds it, a read-only
            open of a path without a database, ...); the message names the path.
    """

    name = "rocks_db"

    def __init__(self, path: str, num_threads: int = 16, read_only: bool = False, max_batch_size: int = 65536) -> None:
        self.path = os.fspath(path)
        self.read_only = read_only
        self.max_batch_size = max_batch_size
        self._block_cache = Cache(BLOCK_CACHE_BYTES)
        options = _family_options(self._block_cache)
        options.create_if_missing(not read_only)
        options.create_missing_column_families(not read_only)
        options.increase_parallelism(num_threads)
        options.optimize_level_style_compaction(512 * 1024 * 1024)
        try:
            if not read_only:
                os.makedirs(self.path, exist_ok=True)
            exists = os.path.isfile(os.path.join(self.path, "CURRENT"))
            families = Rdict.list_cf(self.path, options) if exists else [_DEFAULT_FAMILY]
            access = AccessType.read_only() if read_only else AccessType.read_write()
            self._db = Rdict(
                self.path,
                options,
                column_families={f: _family_options(self._block_cache) for f in families if f != _DEFAULT_FAMILY},
                access_type=access,
            )
        except Exception as e:  # rocksdict raises plain Exception with RocksDB's status text
            raise TierUnavailable(f"rocks_db at {self.path!r} cannot be opened: {e}") from e
        self._families = {f: self._db.get_column_family(f) for f in families if f != _DEFAULT_FAMILY}
        self._lock = threading.Lock()
        log.info(
            "rocks_db at %s opened%s with %d table(s)", self.path, " read-only" if read_only else "", len(families) - 1
        )

    @classmethod
    def from_config(cls, cfg: PersistentDBConfig) -> RocksDBTier:
        """The tier ``persistent_db`` describes."""
        return cls(cfg.path, num_threads=cfg.num_threads, read_only=cfg.read_only, max_batch_size=cfg.max_batch_size)

    def _check_open(self) -> None:
        if self._db is None:
            raise RuntimeError(f"rocks_db at {self.path!r} is closed; open a new RocksDBTier")

    def fetch(self, tag: str, keys: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
        self._check_open()
        keys, out, found = start_fetch(tag, keys, dim)
        family = self._families.get(tag)
        if family is None or not len(keys):
            return out, found
        raw, where = _in_stored_order(keys)
        distinct = len(raw) // 8
        rows, hit = np.zeros((distinct, dim), np.float32), np.zeros(distinct, bool)
        sizes: set[int] = set()  # of the rows found, checked once every row is read
        for first in range(0, distinct, self.max_batch_size):
            last = min(distinct, first + self.max_batch_size)
            replies = family[[raw[8 * i : 8 * i + 8] for i in range(first, last)]]
            at = first + np.flatnonzero(np.fromiter((v is not None for v in replies), bool, count=last - first))
            present = [v for v in replies if v is not None]
            sizes.update(len(v) for v in present)
            if sizes <= {4 * dim}:
                rows[at] = np.frombuffer(b"".join(present), np.float32).reshape(-1, dim)
                hit[at] = True
        if not sizes <= {4 * dim}:
            raise ValueError(
                f"{tag}: {self.name} holds rows of {[s // 4 for s in sorted(sizes)]} floats, asked for dim {dim}"
            )
        np.take(rows, where, axis=0, out=out)
        np.take(hit, where, out=found)
        return out, found

    def insert(self, tag: str, keys: np.ndarray, values: np.ndarray) -> None:
        self._check_open()
        keys, values = check_rows(tag, keys, values)
        self._check_writable(f"{tag} not written")
        if not len(keys):
            return
        self._family(tag)
        handle = self._db.get_column_family_handle(tag)
        raw_keys, raw_values = keys.astype("<i8").tobytes(), values.tobytes()
        row_bytes = 4 * values.shape[1]
        for first in range(0, len(keys), self.max_batch_size):
            batch = WriteBatch(raw_mode=True)
            batch.set_default_column_family(handle)
            for i in range(first, min(len(keys), first + self.max_batch_size)):
                batch.put(raw_keys[8 * i : 8 * i + 8], raw_values[row_bytes * i : row_bytes * (i + 1)])
            self._db.write(batch)

    def _check_writable(self, refused: str) -> None:
        if self.read_only:
            raise PermissionError(f"rocks_db at {self.path!r} is opened read-only (persistent_db.read_only); {refused}")

    @property
    def location(self) -> str:
        """The database's path."""
        return self.path

    def stored_dim(self, tag: str) -> int | None:
        """The recorded width of ``tag``, else the size of one of its rows, else None."""
        self._check_open()
        recorded = self._db.get(_dim_key(tag))
        if recorded is not None:
            return int(recorded.decode())
        family = self._families.get(tag)
        row = next(iter(family.values()), None) if family is not None else None
        return None if row is None else len(row) // 4

    def set_stored_dim(self, tag: str, dim: int) -> None:
        self._check_open()
        self._check_writable(f"{tag} not written")
        self._db.put(_dim_key(tag), str(int(dim)).encode())

    def retain_only(self, tag: str, keys: np.ndarray) -> int:
        """Erase the rows of ``tag`` whose key is not in ``keys`` (one pass over the table's keys),
        then flush the table's memtable into a table file (the servers call this once they have
        written a table's rows)."""
        self._check_open()
        self._check_writable(f"{tag} not written")
        keep = check_keys(tag, keys, 1)
        family = self._families.get(tag)
        if family is None:
            return 0
        handle = self._db.get_column_family_handle(tag)
        erased, stored = 0, []
        for raw in family.keys():
            stored.append(raw)
            if len(stored) == self.max_batch_size:
                erased += self._erase_absent(handle, stored, keep)
                stored = []
        erased += self._erase_absent(handle, stored, keep) if stored else 0
        family.flush()
        return erased

    def _erase_absent(self, handle, stored: list[bytes], keep: np.ndarray) -> int:
        absent = np.flatnonzero(~np.isin(np.frombuffer(b"".join(stored), "<i8"), keep))
        batch = WriteBatch(raw_mode=True)
        batch.set_default_column_family(handle)
        for i in absent.tolist():
            batch.delete(stored[i])
        self._db.write(batch)
        return len(absent)

    def _family(self, tag: str) -> Rdict:
        family = self._families.get(tag)
        if family is None:
            with self._lock:
                family = self._families.get(tag)
                if family is None:
                    family = self._families[tag] = self._db.create_column_family(
                        tag, _family_options(self._block_cache)
                    )
        return family

    def rewrite_tables(self) -> None:
        """Rewrite every table file of the database in :data:`TABLE_FORMAT_VERSION` (a full
        compaction of every column family), so that a RocksDB before 8.6 (the C++ tier built against
        Debian's 7.8.3) opens a database that rocksdict wrote in its default format_version 6. Reads
        and writes every row once; the rows and widths stay as they are.

        Raises:
            PermissionError: the tier is read-only.
        """
        self._check_open()
        self._check_writable("its table files not rewritten")
        every_level = CompactOptions()
        every_level.set_bottommost_level_compaction(BottommostLevelCompaction.force())
        for family in [self._db, *self._families.values()]:
            family.compact_range(None, None, every_level)
        log.info("rocks_db at %s: table files rewritten in format_version %d", self.path, TABLE_FORMAT_VERSION)

    def size(self, tag: str) -> int:
        """Rows of ``tag`` (counted by iterating them: exact, linear in the table's size)."""
        self._check_open()
        family = self._families.get(tag)
        return 0 if family is None else sum(1 for _ in family.keys())

    def close(self) -> None:
        """Flush and close the database (idempotent); the rows stay on disk."""
        with self._lock:
            db, self._db = getattr(self, "_db", None), None
            self._families = {}
        if db is not None:
            if not self.read_only:
                db.flush()
            db.close()
