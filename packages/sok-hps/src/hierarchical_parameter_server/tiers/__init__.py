"""The storage tiers below the embedding cache, made from the ps_config.

* volatile DB (``volatile_db``): :class:`~.hash_map.HashMapTier` (``hash_map``,
  ``parallel_hash_map``) in this process, or :class:`~.redis_cluster.RedisClusterTier`
  (``redis_cluster``, needs ``pip install sok-hps[redis]``);
* persistent DB (``persistent_db``): :class:`~.rocks_db.RocksDBTier` (``rocks_db``, needs
  ``pip install sok-hps[rocksdb]``).

Every tier follows :class:`~.base.Tier`; a service that cannot be reached raises
:class:`~.base.TierUnavailable`.

Example::

    cfg = load_config("ps.json")
    volatile = make_volatile_db(cfg.volatile_db)        # None when disabled
    persistent = make_persistent_db(cfg.persistent_db)
"""

from __future__ import annotations

from ..config import PersistentDBConfig, VolatileDBConfig
from .base import Tier, TierUnavailable

__all__ = ["Tier", "TierUnavailable", "make_persistent_db", "make_volatile_db"]


def _missing(extra: str, package: str, error: ImportError) -> ImportError:
    return ImportError(f"the {extra} tier needs {package}: pip install 'sok-hps[{extra}]' ({error})")


def make_volatile_db(cfg: VolatileDBConfig) -> Tier | None:
    """The volatile DB ``cfg`` describes, or None when its type is ``disabled``.

    Raises:
        ImportError: ``redis_cluster`` without redis-py installed (the message says what to install).
        TierUnavailable: not raised here for Redis: the first call connects.
    """
    if cfg.type == "disabled":
        return None
    if cfg.type in ("hash_map", "parallel_hash_map"):
        from .hash_map import HashMapTier

        return HashMapTier(
            num_partitions=cfg.num_partitions,
            parallel=cfg.type == "parallel_hash_map",
            allocation_rate=cfg.allocation_rate,
            max_batch_size=cfg.max_batch_size,
            overflow_margin=cfg.overflow_margin,
            overflow_policy=cfg.overflow_policy,
            overflow_resolution_target=cfg.overflow_resolution_target,
        )
    if cfg.type == "redis_cluster":
        try:
            from .redis_cluster import RedisClusterTier
        except ImportError as e:
            raise _missing("redis", "redis-py", e) from e
        return RedisClusterTier.from_config(cfg)
    raise ValueError(f"volatile_db.type {cfg.type!r} has no tier; load the config with load_config")


def make_persistent_db(cfg: PersistentDBConfig) -> Tier | None:
    """The persistent DB ``cfg`` describes, or None when its type is ``disabled``.

    Raises:
        ImportError: ``rocks_db`` without rocksdict installed (the message says what to install).
        TierUnavailable: the database cannot be opened.
    """
    if cfg.type == "disabled":
        return None
    if cfg.type == "rocks_db":
        try:
            from .rocks_db import RocksDBTier
        except ImportError as e:
            raise _missing("rocksdb", "rocksdict", e) from e
        return RocksDBTier.from_config(cfg)
    raise ValueError(f"persistent_db.type {cfg.type!r} has no tier; load the config with load_config")
