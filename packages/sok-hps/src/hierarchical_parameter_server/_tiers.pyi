"""Type stub of sok-hps's binding of the C++ tiers (csrc/tiers/module.cpp)."""

import numpy as np

__all__ = [
    "DEFAULT_OPTIONS",
    "MAX_PARTITIONS",
    "NO_OVERFLOW_LIMIT",
    "PARALLEL_MIN_KEYS",
    "HashMapTier",
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
