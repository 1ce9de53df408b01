"""The fixtures and helpers every concern of the storage conformance suite shares.

:class:`ConformanceFixtures` is the base of every concern class of
:mod:`sparse_operation_kit.testing.conformance`: it holds the one fixture a backend must override,
``var_type``, the optional ones below, and those the tests derive from them (``spec``,
``make_storage``, ``storage``). A fixture overridden on a subclass of
:class:`~sparse_operation_kit.testing.StorageConformance`, or of any one concern, reaches every test
of that subclass.

Optional fixtures to override (defaults in brackets):

- ``device`` [``"cpu"``]: where every storage of the suite lives, passed to ``create_storage``
  (``"cuda:0"`` runs the whole suite on a GPU: inputs stay NumPy arrays, so every call goes
  through the host-data path of :class:`~sparse_operation_kit.storage.CudaStorage`; device-array
  inputs are tested by :mod:`sparse_operation_kit.testing.device_conformance`).
- ``storage_options`` [``{}``]: backend options passed to every ``create_storage`` call.
- ``small_capacity_options`` [``{"init_capacity": 128}``]: options of a table that must grow.
- ``one_bucket_options`` [``init_capacity = max_capacity = max_bucket_size = 128``]: options of
  an evicting table of one :data:`BUCKET_SLOTS`-slot bucket (eviction backends only).
- ``no_eviction_options`` [``{"max_capacity": 65536}`` for eviction backends, else ``{}``]: a
  table big enough that the model checks see no eviction.

Example::

    import pytest
    from sparse_operation_kit.testing import StorageConformance

    class TestMyBackend(StorageConformance):
        @pytest.fixture
        def var_type(self):
            return "mine"

        @pytest.fixture
        def small_capacity_options(self):
            return {"initial_slots": 64}  # the option of "mine" that sets the initial capacity
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from sparse_operation_kit import initializers as inits
from sparse_operation_kit.plugins.registry import BackendSpec, get_registry
from sparse_operation_kit.storage import Storage, create_storage

__all__ = ["BUCKET_SLOTS", "ConformanceFixtures", "MakeStorage"]

#: ``make_storage(**create_storage_kwargs) -> Storage`` (the ``make_storage`` fixture).
MakeStorage = Callable[..., Storage]

#: The slots of the one-bucket table of the eviction tests (``one_bucket_options``).
BUCKET_SLOTS = 128

#: The random initializer of the tests that compare new rows with ``init_rows``.
_RANDOM = inits.uniform(-0.05, 0.05, seed=1234)


def _rows_for(keys: np.ndarray, width: int) -> np.ndarray:
    """Distinct, exactly representable rows derived from keys: ``[k % 1000 + c / 4]``."""
    base = (np.asarray(keys).astype(np.float64) % 1000.0).reshape(-1, 1)
    return (base + np.arange(width, dtype=np.float64) / 4.0).astype(np.float32)


def _keys(values: Any, dtype: str = "int64") -> np.ndarray:
    return np.array(values, dtype=dtype)


def _sleep_past_clock() -> None:
    """Let the ns clock move on so scores before and after a time differ."""
    time.sleep(0.002)


def _skip_unless_key_dtype(spec: BackendSpec, key_dtype: str) -> None:
    """Skip the calling test where the backend does not take ``key_dtype`` keys."""
    if key_dtype not in spec.capabilities.key_dtypes:
        pytest.skip(f"backend {spec.name!r} does not take {key_dtype} keys")


class ConformanceFixtures:
    """The fixtures of the conformance suite. Subclasses override ``var_type`` (and optionally the
    fixtures listed in the module docstring)."""

    @pytest.fixture
    def var_type(self) -> str:
        """The var_type under test: override this in the subclass."""
        raise NotImplementedError(f"{type(self).__name__} must override the var_type fixture")

    @pytest.fixture
    def device(self) -> str:
        """Where the suite's storages live: ``"cpu"``, or ``"cuda:N"`` in a backend's GPU tests."""
        return "cpu"

    @pytest.fixture
    def storage_options(self) -> dict[str, Any]:
        """Backend options for every storage of the suite."""
        return {}

    @pytest.fixture
    def small_capacity_options(self) -> dict[str, Any]:
        """Options of a table whose initial capacity the growth tests overflow."""
        return {"init_capacity": 128}

    @pytest.fixture
    def one_bucket_options(self) -> dict[str, Any]:
        """Options of an evicting table with one bucket of :data:`BUCKET_SLOTS` slots."""
        return {"init_capacity": BUCKET_SLOTS, "max_capacity": BUCKET_SLOTS, "max_bucket_size": BUCKET_SLOTS}

    @pytest.fixture
    def no_eviction_options(self, spec: BackendSpec) -> dict[str, Any]:
        """Options of a table large enough that nothing the model checks insert is evicted."""
        return {"max_capacity": 1 << 16} if spec.capabilities.eviction else {}

    @pytest.fixture
    def spec(self, var_type: str) -> BackendSpec:
        """The registry entry of the backend under test."""
        return get_registry().spec(var_type)

    @pytest.fixture
    def make_storage(self, var_type: str, device: str, storage_options: dict[str, Any]) -> MakeStorage:
        """``make(**kwargs)``: ``create_storage(var_type, device=device, **storage_options, **kwargs)``."""

        def make(**kwargs: Any) -> Storage:
            return create_storage(var_type, **{"device": device, **storage_options, **kwargs})

        return make

    @pytest.fixture
    def storage(self, make_storage: MakeStorage) -> Storage:
        """An empty int64-keyed storage of width 4 whose new rows are zeros."""
        return make_storage(row_width=4)
