"""The storage tiers below the embedding cache, made from the ps_config.

* volatile DB (``volatile_db``): :class:`~.hash_map.HashMapTier` (``hash_map``,
  ``parallel_hash_map``) in this process, or :class:`~.redis_cluster.RedisClusterTier`
  (``redis_cluster``, needs ``pip install sok-hps[redis]``);
* persistent DB (``persistent_db``): :class:`~.rocks_db.RocksDBTier` (``rocks_db``, needs
  ``pip install sok-hps[rocksdb]``).

The same tiers in C++ (``csrc/tiers``; :class:`~.hash_map_cpp.CppHashMapTier`,
:class:`~.redis_cluster_cpp.CppRedisClusterTier`, :class:`~.rocks_db_cpp.CppRocksDBTier` in Python)
are what the C++ server (``csrc/serving/server_tiers.cpp``) makes in a process with no Python; a
Python process's server makes these.

Every tier follows :class:`~.base.Tier`; a service that cannot be reached raises
:class:`~.base.TierUnavailable`. Redis and RocksDB, whose rows outlive the server, are also
:class:`~.base.SharedTier`: they record each table's width and drop rows a re-deploy lacks.

Example::

    cfg = load_config("ps.json")
    volatile = make_volatile_db(cfg.volatile_db)        # None when disabled
    persistent = make_persistent_db(cfg.persistent_db)
"""

from __future__ import annotations

import importlib

from ..config import PersistentDBConfig, VolatileDBConfig
from .base import SharedTier, Tier, TierUnavailable

__all__ = ["SharedTier", "Tier", "TierUnavailable", "make_persistent_db", "make_volatile_db"]


#: Per type: the module and class of its tier, and for a tier that needs an optional dependency,
#: ``(extra of sok-hps that installs it, its name)``. Imported only when that type is asked for.
_Registry = dict[str, tuple[str, str, "tuple[str, str] | None"]]
_VOLATILE_TIERS: _Registry = {
    "hash_map": ("hash_map", "HashMapTier", None),
    "parallel_hash_map": ("hash_map", "HashMapTier", None),
    "redis_cluster": ("redis_cluster", "RedisClusterTier", ("redis", "redis-py")),
}
_PERSISTENT_TIERS: _Registry = {
    "rocks_db": ("rocks_db", "RocksDBTier", ("rocksdb", "rocksdict")),
}


def _make(section: str, cfg: VolatileDBConfig | PersistentDBConfig, tiers: _Registry) -> Tier | None:
    if cfg.type == "disabled":
        return None
    if cfg.type not in tiers:
        raise ValueError(f"{section}.type {cfg.type!r} has no tier; load the config with load_config")
    module, name, needs = tiers[cfg.type]
    try:
        tier_class = getattr(importlib.import_module(f".{module}", __name__), name)
    except ImportError as e:
        if needs is None:
            raise
        extra, package = needs
        raise ImportError(f"the {extra} tier needs {package}: pip install 'sok-hps[{extra}]' ({e})") from e
    return tier_class.from_config(cfg)


def make_volatile_db(cfg: VolatileDBConfig) -> Tier | None:
    """The volatile DB ``cfg`` describes, or None when its type is ``disabled``.

    Raises:
        ImportError: ``redis_cluster`` without redis-py installed (the message says what to install).
        TierUnavailable: not raised here for Redis: the first call connects.
    """
    return _make("volatile_db", cfg, _VOLATILE_TIERS)


def make_persistent_db(cfg: PersistentDBConfig) -> Tier | None:
    """The persistent DB ``cfg`` describes, or None when its type is ``disabled``.

    Raises:
        ImportError: ``rocks_db`` without rocksdict installed (the message says what to install).
        TierUnavailable: the database cannot be opened.
    """
    return _make("persistent_db", cfg, _PERSISTENT_TIERS)
