"""Test helpers for storage backends: the conformance suite and its reference model.

A backend proves it keeps the storage contract by subclassing :class:`StorageConformance` in its
tests and overriding the ``var_type`` fixture (the pattern of fsspec's abstract test classes)::

    import pytest
    from sparse_operation_kit.testing import StorageConformance

    class TestMyBackend(StorageConformance):
        @pytest.fixture
        def var_type(self):
            return "mine"

:class:`StorageConformance` combines one abstract class per concern (lookups, writes, eviction,
bad input, threads, ...), each in a module of :mod:`sparse_operation_kit.testing.conformance`: a
backend may also subclass only some of them. Backends that implement the C ABI's optional
``update_rows`` subclass :class:`UpdateRowsConformance` the same way.

Importing this package needs pytest (``pip install 'sok-core[test]'``); the random-sequence test
also uses Hypothesis and is skipped without it.
"""

from __future__ import annotations

from sparse_operation_kit.testing.conformance import EXTREME_KEYS, MakeStorage, StorageConformance
from sparse_operation_kit.testing.model import DictModel, assert_same_contents, snapshot
from sparse_operation_kit.testing.update_rows import UpdateRowsConformance, update_rows

__all__ = [
    "EXTREME_KEYS",
    "DictModel",
    "MakeStorage",
    "StorageConformance",
    "UpdateRowsConformance",
    "assert_same_contents",
    "snapshot",
    "update_rows",
]
