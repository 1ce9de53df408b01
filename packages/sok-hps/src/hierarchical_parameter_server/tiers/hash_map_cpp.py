"""The in-process volatile DB in C++: :class:`CppHashMapTier`, the :class:`~.base.Tier` over
``sok::hps::HashMapTier`` (``csrc/tiers/hash_map_tier.hpp``, bound as
:mod:`hierarchical_parameter_server._tiers`).

It does what :class:`~.hash_map.HashMapTier` does (same settings, same partition function, same
overflow behaviour and policies, same errors) without Python or TensorFlow in its data path: fetch
and insert release the GIL for the whole call, so threads fetch and insert in parallel. Where the
two differ:

* ``evict_random`` draws from a ``std::mt19937_64`` per partition, seeded from ``seed``: as random,
  and reproducible for one seed, but not the rows NumPy's generator picks. ``evict_least_used`` and
  ``evict_oldest`` leave the same rows as the Python tier after the same calls.
* Without an ``overflow_margin`` the rows are in the tier's own partitions (the Python tier keeps
  them in a det storage per table), so there is no :meth:`~.hash_map.HashMapTier.graph_table`.
* ``parallel`` works on a call's partitions on sok-core's worker threads only for calls of at least
  ``_tiers.PARALLEL_MIN_KEYS`` keys; smaller calls gain nothing from threads.

The C++ server (``docs/design/hps-serving.md``) uses the C++ tier directly; a Python process's
server uses the Python one. The tests run the tier suites on both implementations.

Example::

    tier = CppHashMapTier(num_partitions=4, overflow_margin=1000, overflow_policy="evict_oldest")
    tier.insert("hps_et.m.t", np.arange(10), np.ones((10, 8), np.float32))
    rows, found = tier.fetch("hps_et.m.t", np.array([3, 42]), 8)     # found == [True, False]
"""

from __future__ import annotations

from .. import _tiers
from ..config import NO_OVERFLOW_LIMIT, VolatileDBConfig
from . import hash_map_defaults as defaults
from .cpp_tier import CppTier
from .partition import PartitionContents

__all__ = ["CppHashMapTier"]


class CppHashMapTier(CppTier):
    """In-process rows by table tag, in C++: the partitions of each table, evicting by policy when
    ``overflow_margin`` is set (see the module docstring and ``csrc/tiers/hash_map_tier.hpp``).

    Args:
        num_partitions: partitions per table, 1 to :data:`~..config.MAX_PARTITIONS`; each is made
            when its first row arrives.
        parallel: work on a large call's partitions on worker threads (``parallel_hash_map``).
        allocation_rate: the most bytes one partition's row array grows by at a time.
        max_batch_size: rows per insert chunk (overflow is checked after each).
        overflow_margin: the most rows per partition; :data:`~..config.NO_OVERFLOW_LIMIT` (the
            default): no limit, no eviction.
        overflow_policy: ``evict_random``, ``evict_least_used`` or ``evict_oldest``.
        overflow_resolution_target: evict down to this fraction of ``overflow_margin``.
        seed: seeds ``evict_random``'s choice; None: a random seed.

    Raises:
        ValueError: a setting out of range (the messages of :class:`~.hash_map.HashMapTier`).
    """

    def __init__(
        self,
        num_partitions: int = defaults.NUM_PARTITIONS,
        parallel: bool = defaults.PARALLEL,
        allocation_rate: int = defaults.ALLOCATION_RATE,
        max_batch_size: int = defaults.MAX_BATCH_SIZE,
        overflow_margin: int = NO_OVERFLOW_LIMIT,
        overflow_policy: str = defaults.OVERFLOW_POLICY,
        overflow_resolution_target: float = defaults.OVERFLOW_RESOLUTION_TARGET,
        seed: int | None = None,
    ) -> None:
        self._tier = _tiers.HashMapTier(
            num_partitions=num_partitions,
            parallel=parallel,
            allocation_rate=allocation_rate,
            max_batch_size=max_batch_size,
            overflow_margin=overflow_margin,
            overflow_policy=overflow_policy,
            overflow_resolution_target=overflow_resolution_target,
            seed=seed,
        )
        self.name: str = self._tier.name
        #: Whether rows evict by policy (``overflow_margin`` set).
        self.evicts: bool = self._tier.evicts

    @classmethod
    def from_config(cls, cfg: VolatileDBConfig) -> CppHashMapTier:
        """The tier ``volatile_db`` describes (type ``hash_map`` or ``parallel_hash_map``)."""
        return cls(
            num_partitions=cfg.num_partitions,
            parallel=cfg.type == "parallel_hash_map",
            allocation_rate=cfg.allocation_rate,
            max_batch_size=cfg.max_batch_size,
            overflow_margin=cfg.overflow_margin,
            overflow_policy=cfg.overflow_policy,
            overflow_resolution_target=cfg.overflow_resolution_target,
        )

    def partition_contents(self, tag: str) -> dict[int, PartitionContents]:
        """What each partition of ``tag`` that has rows holds, by number (empty for a tag the tier
        does not hold).

        Raises:
            RuntimeError: the tier is closed.
        """
        return {p: PartitionContents(*contents) for p, contents in self._tier.partition_contents(tag).items()}
