"""The storage conformance suite: abstract pytest classes, one per concern, that a backend's tests
subclass.

Each concern class checks a backend black-box, through
:func:`~sparse_operation_kit.storage.create_storage`, against oracles: NumPy,
:class:`~sparse_operation_kit.testing.model.DictModel` and
:func:`~sparse_operation_kit.initializers.init_rows`. :class:`StorageConformance` combines them all:
a backend's test module subclasses it and overrides one fixture, ``var_type`` (the pattern of
fsspec's abstract test classes).

Example::

    # packages/my-backend/tests/test_conformance.py
    import pytest
    from sparse_operation_kit.testing import StorageConformance

    class TestMyBackend(StorageConformance):
        @pytest.fixture
        def var_type(self):
            return "mine"

The concerns, each a module of this package with one class that takes the same fixtures:

- :mod:`~.registration` (:class:`RegistrationConformance`): registry entry, capabilities, the
  storage's backend and device, a new storage is empty.
- :mod:`~.lookup` (:class:`LookupConformance`): ``find``, ``find_hits``, ``find_or_insert`` and the
  initializers.
- :mod:`~.writes` (:class:`WriteConformance`): ``insert_or_assign``, ``accum_or_assign``,
  ``import_batch``.
- :mod:`~.erase_export` (:class:`EraseExportConformance`): ``erase``, ``export_batch``/``export``,
  ``size``, ``capacity``, ``clear``.
- :mod:`~.scores` (:class:`ScoreConformance`): scores as times, ``export_if``.
- :mod:`~.eviction` (:class:`EvictionConformance`): ``insert_and_evict`` and each eviction policy.
- :mod:`~.key_dtypes` (:class:`KeyDtypeConformance`): every key dtype, the extreme keys.
- :mod:`~.batches` (:class:`BatchConformance`): empty batches, row widths, growth, large batches.
- :mod:`~.bad_input` (:class:`BadInputConformance`): bad arguments are refused, the table unchanged.
- :mod:`~.concurrency` (:class:`ConcurrencyConformance`): several threads on one storage.
- :mod:`~.random_sequences` (:class:`RandomSequenceConformance`): Hypothesis sequences against the
  dict model.

A backend still growing may subclass only the concerns it passes so far, and add the others (or
switch to :class:`StorageConformance`) as it grows::

    from sparse_operation_kit.testing.conformance import LookupConformance, WriteConformance

    class TestMyBackendSoFar(LookupConformance, WriteConformance):  # reads and writes only
        @pytest.fixture
        def var_type(self):
            return "mine"

The fixtures a backend may override besides ``var_type`` (``device``, ``storage_options``, ...)
are listed in :mod:`~.base`. Tests about eviction run only when the backend's
``Capabilities.eviction`` is True, and each policy's tests only when the policy is in
``Capabilities.eviction_policies``; they are skipped (with the reason) otherwise.

A backend's GPU module subclasses the suite again with the ``device`` fixture, skipped where CUDA
tables cannot be made (:func:`sparse_operation_kit.testing.device.cuda_skip_reason`)::

    pytestmark = pytest.mark.gpu
    if (reason := cuda_skip_reason(sok_backend_mine._core)) is not None:
        pytest.skip(reason, allow_module_level=True)

    class TestMyBackendCuda(StorageConformance):
        @pytest.fixture
        def var_type(self):
            return "mine"

        @pytest.fixture
        def device(self):
            return "cuda:0"
"""

from __future__ import annotations

from sparse_operation_kit.testing.conformance.bad_input import BadInputConformance
from sparse_operation_kit.testing.conformance.base import BUCKET_SLOTS, ConformanceFixtures, MakeStorage
from sparse_operation_kit.testing.conformance.batches import BatchConformance
from sparse_operation_kit.testing.conformance.concurrency import ConcurrencyConformance
from sparse_operation_kit.testing.conformance.erase_export import EraseExportConformance
from sparse_operation_kit.testing.conformance.eviction import EvictionConformance
from sparse_operation_kit.testing.conformance.key_dtypes import EXTREME_KEYS, KeyDtypeConformance
from sparse_operation_kit.testing.conformance.lookup import LookupConformance
from sparse_operation_kit.testing.conformance.random_sequences import RandomSequenceConformance
from sparse_operation_kit.testing.conformance.registration import RegistrationConformance
from sparse_operation_kit.testing.conformance.scores import ScoreConformance
from sparse_operation_kit.testing.conformance.writes import WriteConformance

__all__ = [
    "BUCKET_SLOTS",
    "EXTREME_KEYS",
    "BadInputConformance",
    "BatchConformance",
    "ConcurrencyConformance",
    "ConformanceFixtures",
    "EraseExportConformance",
    "EvictionConformance",
    "KeyDtypeConformance",
    "LookupConformance",
    "MakeStorage",
    "RandomSequenceConformance",
    "RegistrationConformance",
    "ScoreConformance",
    "StorageConformance",
    "WriteConformance",
]


class StorageConformance(
    RegistrationConformance,
    LookupConformance,
    WriteConformance,
    EraseExportConformance,
    ScoreConformance,
    EvictionConformance,
    KeyDtypeConformance,
    BatchConformance,
    BadInputConformance,
    ConcurrencyConformance,
    RandomSequenceConformance,
):
    """Behaviour every storage backend shares: every concern of the suite. Subclass it and override
    the ``var_type`` fixture.

    Each test checks one behaviour of the :class:`~sparse_operation_kit.storage.Storage` made by
    ``create_storage(var_type, ...)``; see the module docstring for the concerns and
    :mod:`~sparse_operation_kit.testing.conformance.base` for the optional fixtures.
    """
