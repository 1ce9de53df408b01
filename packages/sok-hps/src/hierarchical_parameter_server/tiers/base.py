"""What every storage tier below the embedding cache provides: :class:`Tier` and :class:`TierUnavailable`.

A tier stores float32 rows per table tag (``hps_et.<model>.<table>``) by int64 key. Every tier is
safe for concurrent ``fetch`` and ``insert`` from many threads.

A tier whose rows outlive the server that wrote them (Redis, RocksDB) is also a
:class:`SharedTier`: it records each table's row width, so that a deploy of another width is
refused instead of serving rows of the wrong size, and it can drop the rows of keys a re-deployed
model no longer has (:meth:`SharedTier.retain_only`). The in-process hash map starts empty with
every server and needs neither.

Example::

    values, found = tier.fetch("hps_et.foo.sparse_embedding0", np.array([3, 9], np.int64), 16)
    values.shape, found          # (2, 16), array([ True, False]): row 9 is zeros
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
from sparse_operation_kit.validate import is_positive_int

__all__ = ["SharedTier", "Tier", "TierUnavailable", "check_keys", "check_rows", "fill_rows", "start_fetch"]


class TierUnavailable(RuntimeError):
    """The service behind a tier cannot be reached (e.g. a Redis node is down). The caller warns
    and treats the keys as missing in that tier; a later call tries again."""


@runtime_checkable
class Tier(Protocol):
    """A key-value store of embedding rows.

    Attributes:
        name: what the tier is, for logs (``"hash_map"``, ``"redis_cluster"``, ...).
    """

    name: str

    def fetch(self, tag: str, keys: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
        """The rows of ``keys`` (int64 ``[n]``): ``(float32 [n, dim] with zeros where missing,
        bool [n] found)``. A table the tier does not hold has no keys.

        Raises:
            ValueError: the tier holds the table with another ``dim``.
            TierUnavailable: the service cannot be reached.
        """
        ...

    def insert(self, tag: str, keys: np.ndarray, values: np.ndarray) -> None:
        """Insert or overwrite rows: ``keys`` int64 ``[n]``, ``values`` float32 ``[n, dim]``; for a
        key repeated in ``keys`` the last row wins.

        Raises:
            ValueError: shapes or dtypes that do not fit, or the table holds rows of another dim.
            TierUnavailable: the service cannot be reached.
        """
        ...

    def size(self, tag: str) -> int:
        """Rows the tier holds for ``tag`` (0 for an unknown tag)."""
        ...

    def close(self) -> None:
        """Release what the tier holds open (connections, files); the data of a persistent tier stay."""
        ...


@runtime_checkable
class SharedTier(Tier, Protocol):
    """A tier whose rows outlive the server (another server, process or deploy may read them).

    Attributes:
        location: where the rows are, for messages (a RocksDB path, Redis addresses).
    """

    location: str

    def stored_dim(self, tag: str) -> int | None:
        """The row width the tier records for ``tag`` (:meth:`set_stored_dim`, else the size of
        one stored row), None when it holds no row and no width of ``tag``.

        Raises:
            TierUnavailable: the service cannot be reached.
        """
        ...

    def set_stored_dim(self, tag: str, dim: int) -> None:
        """Record ``dim`` as the row width of ``tag``.

        Raises:
            PermissionError: the tier is read-only.
            TierUnavailable: the service cannot be reached.
        """
        ...

    def retain_only(self, tag: str, keys: np.ndarray) -> int:
        """Erase every row of ``tag`` whose key is not in ``keys`` (int64 ``[n]``); returns how
        many were erased. Rows of ``keys`` stay readable throughout.

        Raises:
            PermissionError: the tier is read-only.
            TierUnavailable: the service cannot be reached.
        """
        ...


def check_rows(tag: str, keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``keys`` as int64 ``[n]`` and ``values`` as C-contiguous float32 ``[n, dim]``, or ValueError
    saying what does not fit.

    Example::

        keys, values = check_rows("hps_et.m.t", [1, 2], np.zeros((2, 4)))   # int64, float32
    """
    keys = np.asarray(keys)
    values = np.asarray(values)
    if keys.ndim != 1 or keys.dtype.kind not in "iu":
        raise ValueError(f"{tag}: keys must be a 1-D integer array, got {keys.dtype} of shape {keys.shape}")
    if values.ndim != 2 or values.shape[0] != keys.shape[0] or values.shape[1] < 1:
        raise ValueError(
            f"{tag}: values must be [len(keys), dim] = [{keys.shape[0]}, dim >= 1], got shape {values.shape}"
        )
    keys = keys.view(np.int64) if keys.dtype == np.uint64 else keys.astype(np.int64, copy=False)
    return keys, np.ascontiguousarray(values, dtype=np.float32)


def check_keys(tag: str, keys: np.ndarray, dim: int) -> np.ndarray:
    """``keys`` as int64 ``[n]`` for a fetch of rows of ``dim``, or ValueError."""
    keys = np.asarray(keys)
    if keys.ndim != 1 or keys.dtype.kind not in "iu":
        raise ValueError(f"{tag}: keys must be a 1-D integer array, got {keys.dtype} of shape {keys.shape}")
    if not is_positive_int(dim):
        raise ValueError(f"{tag}: dim must be an integer >= 1, got {dim!r}")
    return keys.view(np.int64) if keys.dtype == np.uint64 else keys.astype(np.int64, copy=False)


def start_fetch(tag: str, keys: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What every ``fetch`` starts with: ``(keys, out, found)``, the keys checked by
    :func:`check_keys`, ``out`` float32 zeros ``[n, dim]`` and ``found`` all False ``[n]``.

    Example::

        keys, out, found = start_fetch("hps_et.m.t", [3, 9], 4)   # out.shape == (2, 4)
    """
    keys = check_keys(tag, keys, dim)
    return keys, np.zeros((len(keys), dim), np.float32), np.zeros(len(keys), bool)


def fill_rows(
    tier: str, tag: str, replies: list[bytes | None], positions: np.ndarray, out: np.ndarray, found: np.ndarray
) -> None:
    """Write the raw float32 rows of a store's ``replies`` (None: no such key) for the keys at
    ``positions`` into ``out`` and mark them in ``found``; ValueError when the store (``tier``)
    holds rows of another dim than ``out``'s.

    Example::

        fill_rows("rocks_db", tag, [np.ones(4, np.float32).tobytes(), None], np.array([0, 1]), out, found)
        # out[0] == 1.0, found == [True, False]
    """
    dim = out.shape[1]
    hit = np.fromiter((v is not None for v in replies), bool, count=len(replies))
    present = [v for v in replies if v is not None]
    if any(len(v) != 4 * dim for v in present):
        sizes = sorted({len(v) for v in present})
        raise ValueError(f"{tag}: {tier} holds rows of {[s // 4 for s in sizes]} floats, asked for dim {dim}")
    out[positions[hit]] = np.frombuffer(b"".join(present), np.float32).reshape(-1, dim)
    found[positions[hit]] = True
