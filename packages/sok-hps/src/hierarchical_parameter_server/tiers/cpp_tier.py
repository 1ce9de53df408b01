"""What the Python faces of the C++ tiers share: :class:`CppTier` (fetch, insert, size, close) and
:class:`CppSharedTier` (the :class:`~.base.SharedTier` methods), each a call of the bound C++ tier
(``self._tier``, a class of :mod:`hierarchical_parameter_server._tiers`) after base.py's checks of
the arrays. Subclasses make ``self._tier`` and set ``name``; the C++ tiers release the GIL for the
whole call.

Example::

    class CppFooTier(CppTier):
        def __init__(self) -> None:
            self._tier = _tiers.FooTier()
            self.name = self._tier.name
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import check_keys, check_rows

__all__ = ["CppSharedTier", "CppTier"]


class CppTier:
    """A :class:`~.base.Tier` over a bound C++ tier (``self._tier``)."""

    name: str
    _tier: Any

    def fetch(self, tag: str, keys: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
        """The rows of ``keys``: ``(float32 [n, dim], zeros where missing; bool [n] found)``."""
        return self._tier.fetch(tag, check_keys(tag, keys, dim), dim)

    def insert(self, tag: str, keys: np.ndarray, values: np.ndarray) -> None:
        """Insert or overwrite rows; for a key repeated in ``keys`` the last row wins."""
        self._tier.insert(tag, *check_rows(tag, keys, values))

    def size(self, tag: str) -> int:
        """Rows the tier holds for ``tag`` (0 for an unknown tag)."""
        return self._tier.size(tag)

    def close(self) -> None:
        """Release what the tier holds open (see the subclass); later calls raise RuntimeError."""
        self._tier.close()


class CppSharedTier(CppTier):
    """A :class:`~.base.SharedTier` over a bound C++ tier (``self._tier``)."""

    @property
    def location(self) -> str:
        """Where the rows are (a RocksDB path, Redis addresses), for messages."""
        return self._tier.location

    def stored_dim(self, tag: str) -> int | None:
        """The recorded width of ``tag``, else the size of one of its rows, else None."""
        return self._tier.stored_dim(tag)

    def set_stored_dim(self, tag: str, dim: int) -> None:
        """Record ``dim`` as the row width of ``tag``."""
        self._tier.set_stored_dim(tag, dim)

    def retain_only(self, tag: str, keys: np.ndarray) -> int:
        """Erase the rows of ``tag`` whose key is not in ``keys`` (see the subclass for what else);
        returns how many were erased."""
        return self._tier.retain_only(tag, check_keys(tag, keys, 1))
