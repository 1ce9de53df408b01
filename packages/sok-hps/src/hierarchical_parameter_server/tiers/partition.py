"""The partition of a key: the original's ``rrxmrrxmsx_0`` mix, modulo the partition count; and
:class:`PartitionContents`, what one partition of a hash map holds.

The hash map, Redis and the update files place key ``k`` of a table in partition
``partition_of(k, num_partitions)``, as the original does (reference §3.3), so data written by
either can be read by the other. Changing this function strands the rows already in Redis. The C++
tiers use the same function (``csrc/tiers/partition.hpp``).

Example::

    partition_of(np.array([0, 1, -1], np.int64), 16)    # uint64 array of three partitions < 16
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["PartitionContents", "partition_of"]

_M1 = np.uint64(0xA24BAED4963EE407)
_M2 = np.uint64(0x9FB21C651E98DF25)


def _rotr(x: np.ndarray, r: int) -> np.ndarray:
    return (x >> np.uint64(r)) | (x << np.uint64(64 - r))


def partition_of(keys: np.ndarray, num_partitions: int) -> np.ndarray:
    """The partition of each key (``uint64 [n]``, each ``< num_partitions``).

    Args:
        keys: int64 or uint64 ``[n]``; an int64 key is taken as the uint64 of the same bits.
        num_partitions: >= 1.
    """
    x = np.asarray(keys)
    x = x.view(np.uint64) if x.dtype == np.int64 else x.astype(np.uint64)
    with np.errstate(over="ignore"):
        x = x ^ _rotr(x, 25) ^ _rotr(x, 50)
        x = x * _M1
        x = x ^ _rotr(x, 24) ^ _rotr(x, 49)
        x = x * _M2
    x = x ^ (x >> np.uint64(28))
    return x % np.uint64(num_partitions)


class PartitionContents(NamedTuple):
    """What one partition of a hash-map tier holds (``partition_contents`` of the Python and the C++
    ``HashMapTier``), for tests and diagnostics.

    Attributes:
        keys: int64 ``[n]``, ascending.
        access_counts: int64 ``[n]``: the fetches of each key that the ``evict_least_used`` policy
            counts (zeros where the tier never evicts).
        rows_allocated: rows of the partition's row array ever handed out; an evicted row is reused
            before a new one is handed out.
    """

    keys: np.ndarray
    access_counts: np.ndarray
    rows_allocated: int
