"""Type stub of sok-hps's binding of the C++ tiers (csrc/tiers/module.cpp)."""

import numpy as np

__all__ = [
    "DEFAULT_OPTIONS",
    "MAX_PARTITIONS",
    "NO_OVERFLOW_LIMIT",
    "PARALLEL_MIN_KEYS",
    "HashMapTier",
    "REDIS_CLUSTER_DEFAULT_OPTIONS",
    "ROCKSDB_VERSION",
    "ROCKS_DB_BLOCK_CACHE_BYTES",
    "ROCKS_DB_DEFAULT_OPTIONS",
    "ROCKS_DB_KEYS_PER_THREAD",
    "ROCKS_DB_TABLE_FORMAT_VERSION",
    "RedisClusterTier",
    "RocksDbTier",
    "WITH_REDIS",
    "WITH_ROCKSDB",
    "TierClosed",
    "partition_of",
]

#: overflow_margin of a tier that never evicts (config.NO_OVERFLOW_LIMIT).
NO_OVERFLOW_LIMIT: int
#: The most partitions per table (config.MAX_PARTITIONS).
MAX_PARTITIONS: int
#: The fewest keys of a call that a parallel HashMapTier hands to worker threads.
PARALLEL_MIN_KEYS: int
DEFAULT_OPTIONS: dict[str, int | bool | str | float]
#: Whether RedisClusterTier was built (hiredis was found).
WITH_REDIS: bool
#: RedisClusterOptions' defaults (tiers/redis_cluster_defaults.py holds the same); only where WITH_REDIS.
REDIS_CLUSTER_DEFAULT_OPTIONS: dict[str, int | bool | str | float]

class TierClosed(RuntimeError):
    """A call on a closed tier."""

def partition_of(keys: np.ndarray, num_partitions: int) -> np.ndarray:
    """The partition of each int64 key (uint64 ``[n]``), as tiers.partition.partition_of."""

class HashMapTier:
    """sok::hps::HashMapTier (csrc/tiers/hash_map_tier.hpp); tiers.hash_map_cpp wraps it."""

    name: str
    evicts: bool

    def __init__(
        self,
        num_partitions: int,
        parallel: bool,
        allocation_rate: int,
        max_batch_size: int,
        overflow_margin: int,
        overflow_policy: str,
        overflow_resolution_target: float,
        seed: int | None,
    ) -> None: ...
    def fetch(self, tag: str, keys: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]: ...
    def insert(self, tag: str, keys: np.ndarray, rows: np.ndarray) -> None: ...
    def size(self, tag: str) -> int: ...
    def close(self) -> None: ...
    def partition_contents(self, tag: str) -> dict[int, tuple[np.ndarray, np.ndarray, int]]: ...

#: Whether the RocksDB tier was built (RocksDB's headers and library were found); the names below
#: exist only then.
WITH_ROCKSDB: bool
#: The version of the RocksDB the tier is built with, "7.8.3".
ROCKSDB_VERSION: str
#: The format_version of the table files RocksDbTier writes (tiers.rocks_db.TABLE_FORMAT_VERSION).
ROCKS_DB_TABLE_FORMAT_VERSION: int
#: The capacity of a RocksDbTier's block cache, shared by its tables (tiers.rocks_db.BLOCK_CACHE_BYTES).
ROCKS_DB_BLOCK_CACHE_BYTES: int
#: The fewest distinct keys of a fetch per thread of sok-core's worker pool (fewer: one thread).
ROCKS_DB_KEYS_PER_THREAD: int
#: RocksDbOptions' defaults: num_threads, read_only, max_batch_size.
ROCKS_DB_DEFAULT_OPTIONS: dict[str, int | bool]

class RocksDbTier:
    """sok::hps::RocksDbTier (csrc/tiers/rocks_db_tier.hpp); tiers.rocks_db_cpp wraps it."""

    name: str
    location: str
    read_only: bool
    max_batch_size: int

    def __init__(self, path: str, num_threads: int, read_only: bool, max_batch_size: int) -> None: ...
    def fetch(self, tag: str, keys: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]: ...
    def insert(self, tag: str, keys: np.ndarray, rows: np.ndarray) -> None: ...
    def size(self, tag: str) -> int: ...
    def close(self) -> None: ...
    def stored_dim(self, tag: str) -> int | None: ...
    def set_stored_dim(self, tag: str, dim: int) -> None: ...
    def retain_only(self, tag: str, keys: np.ndarray) -> int: ...

class RedisClusterTier:
    """sok::hps::RedisClusterTier (csrc/tiers/redis_cluster_tier.hpp); tiers.redis_cluster_cpp wraps
    it. Only where WITH_REDIS."""

    name: str
    location: str

    def __init__(
        self,
        address: str,
        user_name: str,
        password: str,
        num_partitions: int,
        num_node_connections: int,
        max_batch_size: int,
        enable_tls: bool,
        overflow_margin: int,
        overflow_policy: str,
        overflow_resolution_target: float,
        socket_timeout_s: float,
    ) -> None: ...
    def fetch(self, tag: str, keys: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]: ...
    def insert(self, tag: str, keys: np.ndarray, rows: np.ndarray) -> None: ...
    def size(self, tag: str) -> int: ...
    def close(self) -> None: ...
    def stored_dim(self, tag: str) -> int | None: ...
    def set_stored_dim(self, tag: str, dim: int) -> None: ...
    def retain_only(self, tag: str, keys: np.ndarray) -> int: ...
