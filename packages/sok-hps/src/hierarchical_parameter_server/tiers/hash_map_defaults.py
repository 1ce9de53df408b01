"""The default settings of both hash-map tiers (:class:`~.hash_map.HashMapTier` and
:class:`~.hash_map_cpp.CppHashMapTier`): one home. The C++ tier's ``HashMapOptions``
(``csrc/tiers/hash_map_tier.hpp``) holds the same values, which ``_tiers.DEFAULT_OPTIONS`` exposes
and ``tests/test_tiers_hash_map_cpp.py`` compares with these.

A ps_config's ``volatile_db`` gives its own values (``config.VolatileDBConfig``, whose
``num_partitions`` follows the machine's cores); these are the tiers' when made directly.
"""

from __future__ import annotations

#: Partitions per table.
NUM_PARTITIONS: int = 8
#: Whether a call's partitions are worked on by threads (``parallel_hash_map``).
PARALLEL: bool = True
#: The most bytes a partition's row array grows by at a time (256 MiB, NVIDIA HPS's default).
ALLOCATION_RATE: int = 268435456
#: Rows per insert chunk; overflow is checked after each.
MAX_BATCH_SIZE: int = 65536
#: The rows an overflowing partition loses.
OVERFLOW_POLICY: str = "evict_random"
#: An overflowing partition is evicted down to this fraction of its ``overflow_margin``.
OVERFLOW_RESOLUTION_TARGET: float = 0.8
