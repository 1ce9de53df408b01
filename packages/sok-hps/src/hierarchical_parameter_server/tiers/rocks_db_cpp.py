"""The persistent DB in C++: :class:`CppRocksDBTier`, the :class:`~.base.SharedTier` over
``sok::hps::RocksDbTier`` (``csrc/tiers/rocks_db_tier.hpp``, bound as
:mod:`hierarchical_parameter_server._tiers` where sok-hps was built with RocksDB).

It does what :class:`~.rocks_db.RocksDBTier` does on the same files (one column family per table,
8 little-endian key bytes, raw float32 rows, widths under ``hps_dim:<tag>``, the same RocksDB
options and table format), so a database either tier wrote, the other opens; with the system's
RocksDB (Debian's 7.8.3) instead of rocksdict's, and without Python in its data path: fetch and
insert release the GIL for the whole call. Where the two differ:

* ``close`` waits for the calls in flight on other threads, then flushes every table;
* a fetch of many keys reads them in parts on sok-core's worker pool (``_tiers.ROCKS_DB_KEYS_PER_THREAD``
  keys or more a thread), with the GIL released;
* a writable open refuses a path this process holds open through the Python tier (whose lock
  RocksDB's own check does not see); the reverse is not checked;
* a database written in a table format its RocksDB cannot read (rocksdict's default
  format_version 6, before RocksDB 8.6) raises :class:`~.base.TierUnavailable` saying so and how
  to rewrite it (:meth:`.rocks_db.RocksDBTier.rewrite_tables`).

The C++ server (``docs/design/hps-serving.md``) uses the C++ tier directly; a Python process's
server uses the Python one. The tests run the tier suites on both implementations.

Example::

    tier = CppRocksDBTier("/tmp/hps_rocksdb")
    tier.insert("hps_et.m.t", np.arange(4), np.ones((4, 8), np.float32))
    tier.set_stored_dim("hps_et.m.t", 8)
    tier.close()
    RocksDBTier("/tmp/hps_rocksdb", read_only=True).fetch("hps_et.m.t", np.arange(4), 8)[1]  # all True
"""

from __future__ import annotations

import os

from .. import _tiers
from ..config import PersistentDBConfig
from .cpp_tier import CppSharedTier

__all__ = ["CppRocksDBTier"]

if not _tiers.WITH_ROCKSDB:
    raise ImportError(
        "the C++ rocks_db tier is not built: sok-hps was built where RocksDB's headers and library were not "
        "found. Install them (ci/setup.sh: apt-get install librocksdb-dev), then rebuild sok-hps: "
        "pip install --no-build-isolation --force-reinstall --no-deps sok-hps"
    )


class CppRocksDBTier(CppSharedTier):
    """Rows in a RocksDB database at ``path``, in C++ (see the module docstring and
    ``csrc/tiers/rocks_db_tier.hpp``). ``size`` counts a table's rows by iterating them (exact,
    linear in its size); ``retain_only`` is one pass over its keys; ``close`` flushes and closes the
    database once the calls in flight have returned (idempotent; the rows stay on disk).

    Args:
        path: the database directory (made with its parents when missing, unless ``read_only``).
        num_threads: RocksDB's background threads (``IncreaseParallelism``), >= 1.
        read_only: open for reading only; writes raise PermissionError.
        max_batch_size: rows per multi-get and per write batch, >= 1.

    Raises:
        ValueError: ``num_threads`` or ``max_batch_size`` below 1.
        TierUnavailable: the database cannot be opened (a process holds it, a read-only open of a
            path without a database, a table format this RocksDB cannot read, ...); the message
            names the path and RocksDB's status.
    """

    def __init__(self, path: str, num_threads: int = 16, read_only: bool = False, max_batch_size: int = 65536) -> None:
        self._tier = _tiers.RocksDbTier(os.fspath(path), num_threads, read_only, max_batch_size)
        self.name: str = self._tier.name
        self.path: str = self._tier.location
        self.read_only: bool = self._tier.read_only
        self.max_batch_size: int = self._tier.max_batch_size

    @classmethod
    def from_config(cls, cfg: PersistentDBConfig) -> CppRocksDBTier:
        """The tier ``persistent_db`` describes."""
        return cls(cfg.path, num_threads=cfg.num_threads, read_only=cfg.read_only, max_batch_size=cfg.max_batch_size)
