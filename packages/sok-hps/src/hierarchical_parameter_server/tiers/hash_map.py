"""The in-process volatile DB: ``hash_map`` and ``parallel_hash_map`` (reference §3.3, §3.8).

Without an ``overflow_margin`` (:data:`~..config.NO_OVERFLOW_LIMIT`, the default) nothing is ever
evicted, and each table's rows are held by one CPU storage of sok's det backend: a non-trainable
``sok.DynamicVariable`` (``var_type="hbm"``, int64 keys) on ``/CPU:0``. The tier's ``fetch`` and
``insert`` call that storage, and a lookup of a table served without an embedding cache
(``gpucache: false``) reads it in the graph with ``SokFind`` (:meth:`HashMapTier.graph_table`): no
Python runs for the keys it holds. The storage is multi-threaded and safe for concurrent calls, so
``num_partitions`` and ``parallel`` change nothing for such a tier.

With an ``overflow_margin`` the rows evict by policy, per partition, and stay in Python: each table
is split into ``num_partitions`` partitions by :func:`~.partition.partition_of`. A partition is
made when its first row arrives, so a table costs what its rows need whatever ``num_partitions``
is (up to :data:`~..config.MAX_PARTITIONS`). A partition keeps its keys sorted (a lookup is a
vectorised binary search; an insert of new keys merges them in, linear in the partition's size)
and maps them to rows of one growable float32 array (grown by at most ``allocation_rate`` bytes at
a time, so a small table does not take a 256 MiB page as the original's does); per row it keeps
the time of its last access and an access count. ``parallel_hash_map`` works on the partitions of
a call in a thread pool of at most ``min(32, cores + 4)`` threads (Python's default);
``hash_map`` one after another. Each partition has a lock, so any number of threads may fetch and
insert at once. Such a tier has no :meth:`~HashMapTier.graph_table`: lookups fetch from it
through a ``SokPyCall``.

Overflow (``overflow_margin`` rows per partition): after each ``max_batch_size`` chunk of an
insert, a partition holding more than ``overflow_margin`` rows is evicted down to
``round(overflow_margin * overflow_resolution_target)`` rows, so a partition never holds more than
``overflow_margin`` rows when ``insert`` returns (the original checks before the chunk and may end
a chunk above the margin):

* ``evict_random``: rows chosen at random;
* ``evict_least_used``: the rows fetched least often; the survivors' counts then become
  ``(count - smallest) // 2``, as in the original, so old popularity fades;
* ``evict_oldest``: the rows least recently fetched or written. "Time" is a counter of calls
  (exact order) where the original uses seconds.

The same tier in C++ (no Python in its data path; the C++ server's): :mod:`.hash_map_cpp`.

Example::

    tier = HashMapTier(num_partitions=4, overflow_margin=1000, overflow_policy="evict_oldest")
    tier.insert("hps_et.m.t", np.arange(10), np.ones((10, 8), np.float32))
    rows, found = tier.fetch("hps_et.m.t", np.array([3, 42]), 8)     # found == [True, False]
    tier.graph_table("hps_et.m.t", 8)                                 # None: rows evict by policy
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tensorflow as tf
from sparse_operation_kit.dynamic_variable import DynamicVariable

from ..config import MAX_PARTITIONS, NO_OVERFLOW_LIMIT, OVERFLOW_POLICIES, VolatileDBConfig
from . import hash_map_defaults as defaults
from .base import check_keys, check_rows, start_fetch
from .partition import PartitionContents, partition_of

__all__ = ["HashMapTier"]

log = logging.getLogger(__name__)

_MIN_GROWTH_ROWS = 64
#: The most threads of a ``parallel_hash_map``'s pool (ThreadPoolExecutor's default).
_POOL_THREADS = min(32, (os.cpu_count() or 1) + 4)


class _Partition:
    """The rows of one partition of one table; every method runs under ``lock``.

    ``skeys`` holds the keys in ascending order and ``sslots`` the row of each (in ``values``,
    ``last_access``, ``access_count``): lookups are one vectorised binary search, with no Python
    work per key.
    """

    def __init__(self, dim: int, growth_rows: int, rng: np.random.Generator) -> None:
        self.lock = threading.Lock()
        self.rng = rng
        self.dim = dim
        self.growth_rows = growth_rows
        self.skeys = np.empty(0, np.int64)
        self.sslots = np.empty(0, np.int64)
        self.values = np.empty((0, dim), np.float32)
        self.last_access = np.empty(0, np.int64)
        self.access_count = np.empty(0, np.int64)
        self.free: list[int] = []
        self.high = 0  # rows of `values` ever handed out

    def __len__(self) -> int:
        return len(self.skeys)

    def slots(self, keys: np.ndarray) -> np.ndarray:
        """The row of each key, -1 where missing."""
        if not len(self.skeys):
            return np.full(len(keys), -1, np.int64)
        # Searching in key order walks the sorted keys forward: far fewer cache misses.
        order = np.argsort(keys)
        ordered = keys[order]
        at = np.searchsorted(self.skeys, ordered)
        np.minimum(at, len(self.skeys) - 1, out=at)
        out = np.empty(len(keys), np.int64)
        out[order] = np.where(self.skeys[at] == ordered, self.sslots[at], -1)
        return out

    def add(self, keys: np.ndarray) -> np.ndarray:
        """Give rows to ``keys`` (distinct, none present yet); returns their rows."""
        slots = self.allocate(len(keys))
        order = np.argsort(keys, kind="stable")
        at = np.searchsorted(self.skeys, keys[order])
        self.skeys = np.insert(self.skeys, at, keys[order])
        self.sslots = np.insert(self.sslots, at, slots[order])
        return slots

    def allocate(self, count: int) -> np.ndarray:
        reused = [self.free.pop() for _ in range(min(count, len(self.free)))]
        fresh = count - len(reused)
        if self.high + fresh > len(self.values):
            capacity = len(self.values)
            capacity = max(self.high + fresh, capacity + max(min(capacity, self.growth_rows), _MIN_GROWTH_ROWS))
            for name in ("values", "last_access", "access_count"):
                old = getattr(self, name)
                new = np.zeros((capacity, *old.shape[1:]), old.dtype)
                new[: len(old)] = old
                setattr(self, name, new)
        out = np.empty(count, np.int64)
        out[: len(reused)] = reused
        out[len(reused) :] = np.arange(self.high, self.high + fresh)
        self.high += fresh
        return out

    def evict(self, keep: int, policy: str) -> int:
        """Evict rows until ``keep`` remain; returns how many went."""
        excess = len(self.skeys) - keep
        if excess <= 0:
            return 0
        if policy == "evict_random":
            victims = self.rng.choice(len(self.skeys), excess, replace=False)
        elif policy == "evict_least_used":
            victims = np.argsort(self.access_count[self.sslots], kind="stable")[:excess]
        else:  # evict_oldest
            victims = np.argsort(self.last_access[self.sslots], kind="stable")[:excess]
        self.free.extend(self.sslots[victims].tolist())
        alive = np.ones(len(self.skeys), bool)
        alive[victims] = False
        self.skeys, self.sslots = self.skeys[alive], self.sslots[alive]
        if policy == "evict_least_used" and len(self.sslots):
            counts = self.access_count[self.sslots]
            self.access_count[self.sslots] = (counts - counts.min()) // 2
        return excess


class _StoredTable:
    """The rows of one table of a tier that never evicts: a det storage on the CPU."""

    def __init__(self, tag: str, dim: int) -> None:
        self.dim = dim
        # init_scope: the table may be made while a tf.function is traced (a lookup's graph_table)
        with tf.init_scope(), tf.device("/CPU:0"):
            self.variable = DynamicVariable(
                dimension=dim,
                var_type="hbm",
                name=f"{tag}.hash_map".replace(".", "_"),
                trainable=False,
                key_type=tf.int64,
                initializer="zeros",
            )


class _Table:
    """The partitions of one table of an evicting tier by number, each made when its first row
    arrives (:meth:`partition`). Partition ``p`` draws from the child ``p`` of ``seeds``, so its
    random evictions do not depend on the order partitions are made in."""

    def __init__(self, dim: int, growth_rows: int, seeds: np.random.SeedSequence) -> None:
        self.dim = dim
        self.growth_rows = growth_rows
        self.seeds = seeds
        self.partitions: dict[int, _Partition] = {}
        self.lock = threading.Lock()

    def partition(self, p: int) -> _Partition:
        """Partition ``p``, made empty if it has none yet."""
        part = self.partitions.get(p)
        if part is None:
            with self.lock:
                part = self.partitions.get(p)
                if part is None:
                    seed = np.random.SeedSequence(self.seeds.entropy, spawn_key=(*self.seeds.spawn_key, p))
                    part = self.partitions[p] = _Partition(self.dim, self.growth_rows, np.random.default_rng(seed))
        return part


class HashMapTier:
    """In-process rows by table tag: a det storage per table, or partitions that evict by policy
    when ``overflow_margin`` is set (see the module docstring).

    Args:
        num_partitions: partitions per table, 1 to :data:`~..config.MAX_PARTITIONS`; only with an
            ``overflow_margin``. Each is made when its first row arrives.
        parallel: work on a call's partitions in a thread pool (``parallel_hash_map``); only with
            an ``overflow_margin``.
        allocation_rate: the most bytes one partition's row array grows by at a time; only with
            an ``overflow_margin``.
        max_batch_size: rows per insert chunk (overflow is checked after each); only with an
            ``overflow_margin``.
        overflow_margin: the most rows per partition; :data:`~..config.NO_OVERFLOW_LIMIT` (the
            default): no limit, no eviction, the rows in a det storage per table.
        overflow_policy: ``evict_random``, ``evict_least_used`` or ``evict_oldest``.
        overflow_resolution_target: evict down to this fraction of ``overflow_margin``.
        seed: seeds ``evict_random``'s choice.
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
        if not 1 <= num_partitions <= MAX_PARTITIONS:
            raise ValueError(f"num_partitions must be in [1, {MAX_PARTITIONS}], got {num_partitions!r}")
        if max_batch_size < 1 or overflow_margin < 1 or allocation_rate < 1:
            raise ValueError(
                "max_batch_size, overflow_margin and allocation_rate must be >= 1, got "
                f"{max_batch_size!r}, {overflow_margin!r}, {allocation_rate!r}"
            )
        if overflow_policy not in OVERFLOW_POLICIES:
            raise ValueError(f"overflow_policy {overflow_policy!r} is not one of {sorted(OVERFLOW_POLICIES)}")
        if not 0.0 < overflow_resolution_target <= 1.0:
            raise ValueError(f"overflow_resolution_target must be in (0, 1], got {overflow_resolution_target!r}")
        self.name = "parallel_hash_map" if parallel else "hash_map"
        self.num_partitions = num_partitions
        self.allocation_rate = allocation_rate
        self.max_batch_size = max_batch_size
        self.overflow_margin = overflow_margin
        self.overflow_policy = overflow_policy
        self.keep_rows = max(0, round(overflow_margin * overflow_resolution_target))
        self._seeds = np.random.SeedSequence(seed)
        self._clock = itertools.count(1)
        self._tables: dict[str, _Table] = {}
        self._tables_lock = threading.Lock()
        self._closed = False
        #: Whether rows evict by policy (kept in partitions) or never (a det storage per table).
        self.evicts = overflow_margin != NO_OVERFLOW_LIMIT
        threads = parallel and num_partitions > 1 and self.evicts
        self._pool = ThreadPoolExecutor(min(num_partitions, _POOL_THREADS), "hps-hash-map") if threads else None

    @classmethod
    def from_config(cls, cfg: VolatileDBConfig) -> HashMapTier:
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

    def _groups(self, keys: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """``(partition, positions in keys)`` for each partition that has keys (work in the number of
        keys, not of partitions)."""
        parts = partition_of(keys, self.num_partitions).astype(np.int64)
        order = np.argsort(parts, kind="stable")
        starts = np.flatnonzero(np.diff(parts[order], prepend=-1))
        return list(zip(parts[order[starts]].tolist(), np.split(order, starts[1:])))

    def _run(self, work, groups) -> None:
        if self._pool is None or len(groups) < 2:
            for p, g in groups:
                work(p, g)
        else:
            for future in [self._pool.submit(work, p, g) for p, g in groups]:
                future.result()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"this {self.name} is closed and holds no rows; make a new HashMapTier")

    def fetch(self, tag: str, keys: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
        self._check_open()
        table = self._tables.get(tag)
        if isinstance(table, _StoredTable) and table.dim == dim:  # its find makes the zeros of missing rows
            return table.variable.storage.find(check_keys(tag, keys, dim))
        keys, out, found = start_fetch(tag, keys, dim)
        if table is None or not len(keys):
            return out, found
        if table.dim != dim:
            raise ValueError(f"{tag}: the {self.name} holds rows of dim {table.dim}, asked for dim {dim}")
        now = next(self._clock)

        def work(p: int, positions: np.ndarray) -> None:
            part = table.partitions.get(p)
            if part is None:  # no row has reached partition p yet
                return
            with part.lock:
                slots = part.slots(keys[positions])
                hit = slots >= 0
                hit_slots = slots[hit]
                out[positions[hit]] = part.values[hit_slots]
                part.last_access[hit_slots] = now
                part.access_count[hit_slots] += 1
            found[positions[hit]] = True

        self._run(work, self._groups(keys))
        return out, found

    def insert(self, tag: str, keys: np.ndarray, values: np.ndarray) -> None:
        self._check_open()
        keys, values = check_rows(tag, keys, values)
        table = self._table(tag, values.shape[1])
        if isinstance(table, _StoredTable):
            if len(keys):  # for a key repeated in keys the storage keeps the last row
                table.variable.storage.insert_or_assign(keys, values)
            return
        for first in range(0, len(keys), self.max_batch_size):
            chunk_keys = keys[first : first + self.max_batch_size]
            chunk_values = values[first : first + self.max_batch_size]
            # The last row of a repeated key wins.
            _, last = np.unique(chunk_keys[::-1], return_index=True)
            last = len(chunk_keys) - 1 - last
            chunk_keys, chunk_values = chunk_keys[last], chunk_values[last]
            now = next(self._clock)

            def work(p: int, positions: np.ndarray, ck=chunk_keys, cv=chunk_values, now=now) -> None:
                part = table.partition(p)
                part_keys = ck[positions]
                with part.lock:
                    slots = part.slots(part_keys)
                    new = slots < 0
                    if new.any():
                        slots[new] = part.add(part_keys[new])
                        part.access_count[slots[new]] = 0
                    part.values[slots] = cv[positions]
                    part.last_access[slots] = now
                    if len(part) > self.overflow_margin:
                        gone = part.evict(self.keep_rows, self.overflow_policy)
                        log.debug("%s: partition %d of %s overflowed; evicted %d rows", self.name, p, tag, gone)

            self._run(work, self._groups(chunk_keys))

    def _table(self, tag: str, dim: int) -> _Table | _StoredTable:
        table = self._tables.get(tag)
        if table is None:
            with self._tables_lock:
                table = self._tables.get(tag)
                if table is None and self.evicts:
                    growth = max(1, self.allocation_rate // (4 * dim))
                    table = self._tables[tag] = _Table(dim, growth, self._seeds.spawn(1)[0])
                elif table is None:
                    table = self._tables[tag] = _StoredTable(tag, dim)
        if table.dim != dim:
            raise ValueError(f"{tag}: the {self.name} holds rows of dim {table.dim}, got rows of dim {dim}")
        return table

    def graph_table(self, tag: str, dim: int) -> DynamicVariable | None:
        """The CPU storage that holds the rows of ``tag`` (made empty if the tier has none yet), for
        lookups in the graph: ``SokFind`` on its ``table_inputs`` (int64 keys) gives the rows and a
        found mask, zeros where missing. None when the tier evicts by policy (``overflow_margin``
        set): its rows are in Python; fetch them with :meth:`fetch`.

        Raises:
            ValueError: the tier holds ``tag`` with another ``dim``.
            RuntimeError: the tier is closed.

        Example::

            table = HashMapTier().graph_table("hps_et.m.t", 8)
            values, found = tf_ops.library().sok_find(*table.table_inputs, tf.constant([3, 42], tf.int64),
                                                      col_begin=0, col_end=8)
        """
        self._check_open()
        if self.evicts:
            return None
        table = self._table(tag, dim)
        return table.variable if isinstance(table, _StoredTable) else None

    def partition_contents(self, tag: str) -> dict[int, PartitionContents]:
        """What each partition of ``tag`` that has rows holds, by number; empty for a tag the tier
        does not hold, and for every tag of a tier that never evicts (its rows are in one det
        storage per table, not in partitions).

        Raises:
            RuntimeError: the tier is closed.
        """
        self._check_open()
        table = self._tables.get(tag)
        if not isinstance(table, _Table):
            return {}
        out = {}
        for p, part in sorted(list(table.partitions.items())):  # a copy: inserts may add partitions
            with part.lock:
                out[p] = PartitionContents(part.skeys.copy(), part.access_count[part.sslots], part.high)
        return out

    def size(self, tag: str) -> int:
        self._check_open()
        table = self._tables.get(tag)
        if table is None:
            return 0
        if isinstance(table, _StoredTable):
            return table.variable.storage.size()
        return sum(len(p) for p in list(table.partitions.values()))  # a copy: inserts may add partitions

    def close(self) -> None:
        """Drop every row and stop the thread pool; later calls raise RuntimeError."""
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        with self._tables_lock:
            self._tables.clear()
