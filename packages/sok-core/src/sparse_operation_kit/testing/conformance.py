"""The storage conformance suite: one abstract pytest class every backend's tests subclass.

:class:`StorageConformance` checks a backend black-box, through
:func:`~sparse_operation_kit.storage.create_storage`, against oracles: NumPy,
:class:`~sparse_operation_kit.testing.model.DictModel` and
:func:`~sparse_operation_kit.initializers.init_rows`. A backend's test module subclasses it and
overrides one fixture, ``var_type``::

    # packages/my-backend/tests/test_conformance.py
    import pytest
    from sparse_operation_kit.testing import StorageConformance

    class TestMyBackend(StorageConformance):
        @pytest.fixture
        def var_type(self):
            return "mine"

Optional fixtures to override (defaults in brackets):

- ``device`` [``"cpu"``]: where every storage of the suite lives, passed to ``create_storage``
  (``"cuda:0"`` runs the whole suite on a GPU: inputs stay NumPy arrays, so every call goes
  through the host-data path of :class:`~sparse_operation_kit.storage.CudaStorage`; device-array
  inputs are tested by :mod:`sparse_operation_kit.testing.device_conformance`). A backend's GPU
  module subclasses the suite again with this fixture, skipped where CUDA tables cannot be made
  (:func:`sparse_operation_kit.testing.device.cuda_skip_reason`)::

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

- ``storage_options`` [``{}``]: backend options passed to every ``create_storage`` call.
- ``small_capacity_options`` [``{"init_capacity": 128}``]: options of a table that must grow.
- ``one_bucket_options`` [``init_capacity = max_capacity = max_bucket_size = 128``]: options of
  an evicting table of one 128-slot bucket (eviction backends only).
- ``no_eviction_options`` [``{"max_capacity": 65536}`` for eviction backends, else ``{}``]: a
  table big enough that the model checks see no eviction.

Tests about eviction run only when the backend's ``Capabilities.eviction`` is True, and each
policy's tests only when the policy is in ``Capabilities.eviction_policies``; they are skipped
(with the reason) otherwise.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from sparse_operation_kit import initializers as inits
from sparse_operation_kit.device_arrays import parse_device
from sparse_operation_kit.dtypes import KEY_DTYPES, SCORE_DTYPE
from sparse_operation_kit.plugins.registry import BackendSpec, get_registry
from sparse_operation_kit.storage import Storage, create_storage
from sparse_operation_kit.testing.model import DictModel, assert_same_contents, snapshot

__all__ = ["StorageConformance", "EXTREME_KEYS", "MakeStorage"]

#: ``make_storage(**create_storage_kwargs) -> Storage`` (the ``make_storage`` fixture).
MakeStorage = Callable[..., Storage]

#: Keys at the edges of each key dtype (and keys equal in their low 32 bits): every one is valid.
EXTREME_KEYS: dict[str, list[int]] = {
    "int64": [0, 1, -1, 2**31 - 1, -(2**31), 2**32, 2**32 + 1, 2**63 - 1, -(2**63)],
    "uint64": [0, 1, 2**32, 2**32 + 1, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1],
    "int32": [0, 1, -1, 2**31 - 1, -(2**31), 65536, -65536],
}

#: The slots of the one-bucket table of the eviction tests (``one_bucket_options``).
BUCKET_SLOTS = 128

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


def _run_threads(count: int, work: Callable[[int], Any]) -> list[Any]:
    """Run ``work(i)`` for ``i < count`` in as many threads, started together; re-raise errors."""
    barrier = threading.Barrier(count)

    def start(i: int) -> Any:
        barrier.wait()
        return work(i)

    with ThreadPoolExecutor(count) as pool:
        return [f.result() for f in [pool.submit(start, i) for i in range(count)]]


class StorageConformance:
    """Behaviour every storage backend shares. Subclass it and override the ``var_type`` fixture.

    Each test checks one behaviour of the :class:`~sparse_operation_kit.storage.Storage` made by
    ``create_storage(var_type, ...)``; see the module docstring for the optional fixtures.
    """

    # -- fixtures -------------------------------------------------------------------------------
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

    @pytest.fixture
    def one_bucket(
        self, spec: BackendSpec, make_storage: MakeStorage, one_bucket_options: dict[str, Any]
    ) -> Callable[..., Storage]:
        """``make(policy, row_width=2, **kwargs)``: a one-bucket evicting table, or a skip when the
        backend does not evict or lacks ``policy``."""

        def make(policy: str, row_width: int = 2, **kwargs: Any) -> Storage:
            if not spec.capabilities.eviction:
                pytest.skip(f"backend {spec.name!r} does not evict")
            if policy not in spec.capabilities.eviction_policies:
                pytest.skip(f"backend {spec.name!r} has no eviction policy {policy!r}")
            return make_storage(row_width=row_width, evict_strategy=policy, **{**one_bucket_options, **kwargs})

        return make

    # -- registration and capabilities ----------------------------------------------------------
    def test_var_type_is_registered(self, var_type: str, spec: BackendSpec) -> None:
        assert var_type in get_registry().var_types()
        assert var_type in spec.var_types

    def test_capabilities_are_consistent(self, spec: BackendSpec) -> None:
        caps = spec.capabilities
        assert set(caps.key_dtypes) <= set(KEY_DTYPES)
        assert "int64" in caps.key_dtypes
        if not caps.eviction:
            assert caps.eviction_policies == ()

    def test_storage_reports_its_backend(self, var_type: str, spec: BackendSpec, storage: Storage) -> None:
        assert storage.spec == spec
        assert storage.var_type == var_type
        assert storage.row_width == 4
        assert storage.key_dtype == np.dtype("int64")
        assert isinstance(storage.describe(), str) and storage.describe()

    def test_storage_reports_its_device(self, spec: BackendSpec, device: str, storage: Storage) -> None:
        kind, index = parse_device(device)
        assert storage.device == ("cpu" if kind == "cpu" else f"cuda:{index}")
        assert kind in spec.capabilities.devices, (
            f"backend {spec.name!r} made a storage on {storage.device!r}, but its Capabilities.devices "
            f"is {spec.capabilities.devices}"
        )

    @pytest.mark.parametrize("bad", ["gpu", "CUDA", "cuda:", "cuda:-1", "cuda:x", "cpu:0", " cuda", 0, None])
    def test_bad_device_is_refused(self, make_storage: MakeStorage, bad: Any) -> None:
        with pytest.raises(ValueError, match=f"device {re.escape(repr(bad))} is not valid"):
            make_storage(row_width=1, device=bad)

    def test_gpu_storage_of_a_backend_without_cuda_is_refused(
        self, spec: BackendSpec, make_storage: MakeStorage
    ) -> None:
        if "cuda" in spec.capabilities.devices:
            pytest.skip(f"backend {spec.name!r} lists 'cuda' in its Capabilities.devices")
        try:
            storage = make_storage(row_width=1, device="cuda")
        except (NotImplementedError, ValueError) as error:
            assert re.search("cuda|gpu", str(error), re.IGNORECASE), error
        else:
            pytest.fail(
                f"backend {spec.name!r} made a storage on {storage.device!r}, but its Capabilities.devices is "
                f"{spec.capabilities.devices}: list 'cuda' there"
            )

    def test_new_storage_is_empty(self, storage: Storage) -> None:
        keys, values, scores = storage.export()
        assert storage.size() == len(storage) == 0
        assert storage.capacity() >= 1
        assert keys.size == 0 and values.shape == (0, 4) and scores.size == 0

    # -- find -----------------------------------------------------------------------------------
    def test_find_missing_keys_reads_zeros_and_not_found(self, storage: Storage) -> None:
        values, found = storage.find(_keys([1, 2, 3]))
        np.testing.assert_array_equal(values, np.zeros((3, 4), np.float32))
        np.testing.assert_array_equal(found, [False, False, False])
        assert values.dtype == np.float32 and found.dtype == np.bool_

    def test_find_missing_keys_reads_default_row(self, storage: Storage) -> None:
        default = np.array([1.5, -2.0, 3.25, 4.0], np.float32)
        storage.insert_or_assign(_keys([7]), _rows_for([7], 4))
        values, found = storage.find(_keys([1, 7, 2]), default=default)
        np.testing.assert_array_equal(values, [default, _rows_for([7], 4)[0], default])
        np.testing.assert_array_equal(found, [False, True, False])

    def test_find_default_row_takes_the_column_range(self, storage: Storage) -> None:
        values, _ = storage.find(_keys([1]), columns=(1, 3), default=[8.0, 9.0])
        np.testing.assert_array_equal(values, [[8.0, 9.0]])

    def test_find_returns_stored_rows(self, storage: Storage) -> None:
        keys = _keys([10, 20, 30])
        storage.insert_or_assign(keys, _rows_for(keys, 4))
        values, found = storage.find(_keys([30, 10, 20, 30]))
        np.testing.assert_array_equal(values, _rows_for([30, 10, 20, 30], 4))
        assert found.all()

    def test_find_does_not_insert(self, storage: Storage) -> None:
        storage.find(_keys([1, 2]))
        assert storage.size() == 0
        assert not storage.find(_keys([1, 2]))[1].any()

    def test_find_does_not_change_scores(self, storage: Storage) -> None:
        keys = _keys([1, 2, 3])
        storage.insert_or_assign(keys, _rows_for(keys, 4))
        before = storage.export()
        _sleep_past_clock()
        storage.find(keys)
        after = storage.export()
        np.testing.assert_array_equal(before[0], after[0])
        np.testing.assert_array_equal(before[2], after[2])

    # -- find_hits ------------------------------------------------------------------------------
    def test_find_hits_writes_present_rows_and_leaves_missing_ones(self, storage: Storage) -> None:
        storage.insert_or_assign(_keys([7, 9]), _rows_for([7, 9], 4))
        out = np.full((4, 4), -1.5, np.float32)
        found = storage.find_hits(_keys([1, 7, 2, 9]), out)
        np.testing.assert_array_equal(found, [False, True, False, True])
        np.testing.assert_array_equal(out, [[-1.5] * 4, _rows_for([7], 4)[0], [-1.5] * 4, _rows_for([9], 4)[0]])
        assert found.dtype == np.bool_

    def test_find_hits_agrees_with_find_on_every_key(self, storage: Storage) -> None:
        keys = _keys(np.arange(0, 600, 3))
        storage.insert_or_assign(keys, _rows_for(keys, 4))
        query = _keys(np.r_[np.arange(0, 300), keys[::-1], keys[:5]])  # misses, hits, duplicates
        out = np.full((query.size, 4), 7.25, np.float32)
        found = storage.find_hits(query, out)
        values, expected_found = storage.find(query)
        np.testing.assert_array_equal(found, expected_found)
        np.testing.assert_array_equal(out[found], values[found])
        assert (out[~found] == 7.25).all()

    def test_find_hits_takes_the_column_range(self, storage: Storage) -> None:
        storage.insert_or_assign(_keys([5]), _rows_for([5], 4))
        out = np.zeros((2, 2), np.float32) + 3.0
        found = storage.find_hits(_keys([5, 6]), out, columns=(1, 3))
        np.testing.assert_array_equal(out, [_rows_for([5], 4)[0, 1:3], [3.0, 3.0]])
        np.testing.assert_array_equal(found, [True, False])

    def test_find_hits_does_not_insert_or_change_scores(self, storage: Storage) -> None:
        keys = _keys([1, 2, 3])
        storage.insert_or_assign(keys, _rows_for(keys, 4))
        before = storage.export()
        _sleep_past_clock()
        storage.find_hits(_keys([1, 2, 3, 4]), np.zeros((4, 4), np.float32))
        after = storage.export()
        assert storage.size() == 3
        np.testing.assert_array_equal(before[0], after[0])
        np.testing.assert_array_equal(before[2], after[2])

    def test_find_hits_of_an_empty_batch(self, storage: Storage) -> None:
        found = storage.find_hits(_keys([]), np.zeros((0, 4), np.float32))
        assert found.shape == (0,)

    @pytest.mark.parametrize(
        ("out", "error", "message"),
        [
            (np.zeros((2, 3), np.float32), ValueError, r"shape \(2, 4\)"),
            (np.zeros((2, 4), np.float64), TypeError, "float32"),
            (np.zeros((4, 4), np.float32)[::2], ValueError, "C-contiguous"),
            ([[0.0] * 4] * 2, TypeError, "NumPy"),
        ],
        ids=["shape", "dtype", "strided", "list"],
    )
    def test_find_hits_refuses_an_out_it_cannot_write_in_place(
        self, storage: Storage, out: Any, error: type, message: str
    ) -> None:
        storage.insert_or_assign(_keys([1]), _rows_for([1], 4))
        with pytest.raises(error, match=message):
            storage.find_hits(_keys([1, 2]), out)

    # -- find_or_insert -------------------------------------------------------------------------
    def test_find_or_insert_fills_new_rows_with_constant(self, make_storage: MakeStorage) -> None:
        storage = make_storage(row_width=3, initializer=2.5)
        values, _ = storage.find_or_insert(_keys([4, 5]))
        np.testing.assert_array_equal(values, inits.init_rows(_keys([4, 5]), [inits.constant(2.5)], 3))

    def test_find_or_insert_fills_new_rows_with_uniform_exactly(self, make_storage: MakeStorage) -> None:
        keys = _keys(np.arange(-50, 50) * 7919)
        storage = make_storage(row_width=5, initializer=_RANDOM)
        values, _ = storage.find_or_insert(keys)
        np.testing.assert_array_equal(values, inits.init_rows(keys, [_RANDOM], 5))

    def test_find_or_insert_random_string_is_the_reference_uniform(self, make_storage: MakeStorage) -> None:
        keys = _keys(np.arange(64))
        storage = make_storage(row_width=3, initializer="random", seed=99)
        values, _ = storage.find_or_insert(keys)
        np.testing.assert_array_equal(values, inits.init_rows(keys, [inits.from_string("random", seed=99)], 3))

    @pytest.mark.parametrize(
        "initializer",
        [inits.normal(0.5, 2.0, seed=7), inits.truncated_normal(-1.0, 0.5, seed=8)],
        ids=["normal", "truncated_normal"],
    )
    def test_find_or_insert_fills_new_rows_with_normal(
        self, make_storage: MakeStorage, initializer: inits.Initializer
    ) -> None:
        keys = _keys(np.arange(500) * 104729 - 3)
        storage = make_storage(row_width=4, initializer=initializer)
        values, _ = storage.find_or_insert(keys)
        np.testing.assert_allclose(values, inits.init_rows(keys, [initializer], 4), rtol=1e-5, atol=1e-6)

    def test_truncated_normal_stays_within_two_stddev(self, make_storage: MakeStorage) -> None:
        storage = make_storage(row_width=8, initializer=inits.truncated_normal(1.0, 0.5, seed=3))
        values, _ = storage.find_or_insert(_keys(np.arange(1000)))
        assert values.min() >= 1.0 - 1.0 - 1e-6 and values.max() <= 1.0 + 1.0 + 1e-6

    def test_find_or_insert_initializers_fill_their_columns(self, make_storage: MakeStorage) -> None:
        chosen = [inits.constant(3.0, columns=(0, 2)), inits.uniform(-1, 1, seed=5, columns=(3, 5))]
        storage = make_storage(row_width=6, initializer=chosen)
        keys = _keys([1, 2**40, -9])
        values, _ = storage.find_or_insert(keys)
        expected = inits.init_rows(keys, chosen, 6)
        np.testing.assert_array_equal(values, expected)
        np.testing.assert_array_equal(expected[:, [2, 5]], np.zeros((3, 2)))

    def test_find_or_insert_initializers_argument_overrides(self, make_storage: MakeStorage) -> None:
        storage = make_storage(row_width=2, initializer=1.0)
        values, _ = storage.find_or_insert(_keys([3]), initializers=[inits.constant(-4.0)])
        np.testing.assert_array_equal(values, [[-4.0, -4.0]])

    def test_find_or_insert_new_keys_are_not_found(self, storage: Storage) -> None:
        _, found = storage.find_or_insert(_keys([5, 5, 7, 5]))
        np.testing.assert_array_equal(found, [False, False, False, False])

    def test_find_or_insert_existing_keys_are_found(self, storage: Storage) -> None:
        storage.find_or_insert(_keys([5, 7]))
        _, found = storage.find_or_insert(_keys([5, 8, 8, 7]))
        np.testing.assert_array_equal(found, [True, False, False, True])

    def test_find_or_insert_inserts_each_key_once(self, storage: Storage) -> None:
        storage.find_or_insert(_keys([5, 5, 7, 5]))
        assert storage.size() == 2

    def test_find_or_insert_returns_existing_rows_unchanged(self, make_storage: MakeStorage) -> None:
        storage = make_storage(row_width=4, initializer=_RANDOM)
        keys = _keys([11, 12])
        storage.insert_or_assign(keys, _rows_for(keys, 4))
        values, found = storage.find_or_insert(_keys([12, 11]))
        np.testing.assert_array_equal(values, _rows_for([12, 11], 4))
        assert found.all()

    def test_find_or_insert_duplicates_of_a_new_key_read_the_same_row(self, make_storage: MakeStorage) -> None:
        storage = make_storage(row_width=3, initializer=_RANDOM)
        values, _ = storage.find_or_insert(_keys([9, 4, 9, 9]))
        np.testing.assert_array_equal(values[[0, 2, 3]], np.repeat(values[:1], 3, axis=0))

    def test_find_or_insert_reads_only_the_column_range(self, make_storage: MakeStorage) -> None:
        storage = make_storage(row_width=4, initializer=_RANDOM)
        keys = _keys([1, 2])
        values, _ = storage.find_or_insert(keys, columns=(1, 3))
        np.testing.assert_array_equal(values, inits.init_rows(keys, [_RANDOM], 4)[:, 1:3])
        np.testing.assert_array_equal(storage.find(keys)[0], inits.init_rows(keys, [_RANDOM], 4))

    # -- insert_or_assign -----------------------------------------------------------------------
    def test_insert_or_assign_inserts_rows(self, storage: Storage) -> None:
        keys = _keys([3, 1, 2])
        storage.insert_or_assign(keys, _rows_for(keys, 4))
        assert storage.size() == 3
        np.testing.assert_array_equal(storage.find(keys)[0], _rows_for(keys, 4))

    def test_insert_or_assign_overwrites_existing_rows(self, storage: Storage) -> None:
        keys = _keys([3, 1])
        storage.insert_or_assign(keys, _rows_for(keys, 4))
        storage.insert_or_assign(keys, -_rows_for(keys, 4))
        np.testing.assert_array_equal(storage.find(keys)[0], -_rows_for(keys, 4))
        assert storage.size() == 2

    def test_insert_or_assign_last_duplicate_wins(self, storage: Storage) -> None:
        keys = _keys([6, 8, 6, 6])
        values = np.arange(16, dtype=np.float32).reshape(4, 4)
        storage.insert_or_assign(keys, values)
        np.testing.assert_array_equal(storage.find(_keys([6, 8]))[0], values[[3, 1]])

    def test_insert_or_assign_column_range_leaves_other_columns(self, make_storage: MakeStorage) -> None:
        storage = make_storage(row_width=6)
        keys = _keys([1, 2])
        storage.insert_or_assign(keys, _rows_for(keys, 6))
        storage.insert_or_assign(keys, np.full((2, 2), -1.0, np.float32), columns=(2, 4))
        expected = _rows_for(keys, 6)
        expected[:, 2:4] = -1.0
        np.testing.assert_array_equal(storage.find(keys)[0], expected)

    def test_insert_or_assign_column_range_of_new_key_initializes_the_rest(self, make_storage: MakeStorage) -> None:
        storage = make_storage(row_width=6, initializer=_RANDOM)
        keys = _keys([1, 2])
        storage.insert_or_assign(keys, np.full((2, 2), -1.0, np.float32), columns=slice(2, 4))
        expected = inits.init_rows(keys, [_RANDOM], 6)
        expected[:, 2:4] = -1.0
        np.testing.assert_array_equal(storage.find(keys)[0], expected)

    def test_insert_or_assign_converts_values_to_float32(self, storage: Storage) -> None:
        storage.insert_or_assign(_keys([1]), np.array([[1, 2, 3, 4]], dtype=np.int64))
        np.testing.assert_array_equal(storage.find(_keys([1]))[0], [[1, 2, 3, 4]])

    # -- accum_or_assign ------------------------------------------------------------------------
    def test_accum_or_assign_adds_to_existing_rows(self, storage: Storage) -> None:
        keys = _keys([1, 2])
        storage.insert_or_assign(keys, _rows_for(keys, 4))
        storage.accum_or_assign(keys, np.full((2, 4), 0.5, np.float32))
        np.testing.assert_array_equal(storage.find(keys)[0], _rows_for(keys, 4) + np.float32(0.5))

    def test_accum_or_assign_duplicates_accumulate(self, storage: Storage) -> None:
        storage.insert_or_assign(_keys([1]), np.ones((1, 4), np.float32))
        storage.accum_or_assign(_keys([1, 1, 1]), np.array([[1.0] * 4, [2.0] * 4, [4.0] * 4], np.float32))
        np.testing.assert_array_equal(storage.find(_keys([1]))[0], [[8.0] * 4])

    def test_accum_or_assign_new_key_gets_the_sum(self, make_storage: MakeStorage) -> None:
        storage = make_storage(row_width=2, initializer=100.0)
        storage.accum_or_assign(_keys([5, 5, 6]), np.array([[1, 2], [3, 4], [5, 6]], np.float32))
        np.testing.assert_array_equal(storage.find(_keys([5, 6]))[0], [[4, 6], [5, 6]])

    def test_accum_or_assign_column_range_of_new_key_initializes_the_rest(self, make_storage: MakeStorage) -> None:
        storage = make_storage(row_width=4, initializer=_RANDOM)
        keys = _keys([5, 5])
        storage.accum_or_assign(keys, np.array([[1, 2], [3, 4]], np.float32), columns=(2, 4))
        expected = inits.init_rows(_keys([5]), [_RANDOM], 4)
        expected[:, 2:4] = [4, 6]
        np.testing.assert_array_equal(storage.find(_keys([5]))[0], expected)

    def test_accum_or_assign_column_range_leaves_other_columns(self, make_storage: MakeStorage) -> None:
        storage = make_storage(row_width=6)
        keys = _keys([1, 2])
        storage.insert_or_assign(keys, _rows_for(keys, 6))
        storage.accum_or_assign(keys, np.full((2, 2), 10.0, np.float32), columns=(2, 4))
        expected = _rows_for(keys, 6)
        expected[:, 2:4] += 10.0
        np.testing.assert_array_equal(storage.find(keys)[0], expected)

    # -- erase ----------------------------------------------------------------------------------
    def test_erase_returns_the_number_of_present_keys(self, storage: Storage) -> None:
        storage.find_or_insert(_keys([1, 2, 3]))
        assert storage.erase(_keys([2, 3, 4, 5])) == 2

    def test_erase_counts_a_duplicated_key_once(self, storage: Storage) -> None:
        storage.find_or_insert(_keys([1, 2]))
        assert storage.erase(_keys([1, 1, 1])) == 1
        assert storage.size() == 1

    def test_erase_removes_rows(self, storage: Storage) -> None:
        storage.find_or_insert(_keys([1, 2, 3]))
        storage.erase(_keys([1, 3]))
        assert storage.size() == 1
        np.testing.assert_array_equal(storage.find(_keys([1, 2, 3]))[1], [False, True, False])
        np.testing.assert_array_equal(storage.export()[0], [2])

    def test_erase_is_idempotent(self, storage: Storage) -> None:
        storage.find_or_insert(_keys([1, 2]))
        assert storage.erase(_keys([1])) == 1
        assert storage.erase(_keys([1])) == 0
        assert storage.size() == 1

    def test_erased_key_comes_back_with_a_fresh_row(self, make_storage: MakeStorage) -> None:
        storage = make_storage(row_width=2, initializer=_RANDOM)
        storage.insert_or_assign(_keys([4]), [[9.0, 9.0]])
        storage.erase(_keys([4]))
        values, found = storage.find_or_insert(_keys([4]))
        np.testing.assert_array_equal(values, inits.init_rows(_keys([4]), [_RANDOM], 2))
        assert not found[0]

    # -- export ---------------------------------------------------------------------------------
    def test_export_batch_over_all_slots_returns_every_row_once(self, make_storage: MakeStorage) -> None:
        storage = make_storage(row_width=3)
        keys = _keys(np.arange(300) * 31 - 4000)
        storage.insert_or_assign(keys, _rows_for(keys, 3))
        parts = [storage.export_batch(offset, 97) for offset in range(0, storage.capacity(), 97)]
        got_keys = np.concatenate([p[0] for p in parts])
        got_values = np.concatenate([p[1] for p in parts])
        assert got_keys.dtype == np.int64 and got_values.dtype == np.float32
        assert sorted(got_keys.tolist()) == sorted(keys.tolist())
        np.testing.assert_array_equal(got_values, _rows_for(got_keys, 3))

    def test_export_batch_past_the_last_slot_is_empty(self, storage: Storage) -> None:
        storage.find_or_insert(_keys([1, 2]))
        keys, values, scores = storage.export_batch(storage.capacity(), 100)
        assert keys.size == 0 and values.shape == (0, 4) and scores.size == 0

    def test_export_batch_returns_at_most_limit_rows(self, storage: Storage) -> None:
        storage.find_or_insert(_keys(np.arange(50)))
        counts = [storage.export_batch(offset, 5)[0].size for offset in range(0, storage.capacity(), 5)]
        assert max(counts) <= 5 and sum(counts) == 50

    def test_export_reads_the_column_range(self, storage: Storage) -> None:
        keys = _keys([1, 2, 3])
        storage.insert_or_assign(keys, _rows_for(keys, 4))
        got_keys, got_values, _ = storage.export(columns=(1, 3))
        np.testing.assert_array_equal(got_values, _rows_for(got_keys, 4)[:, 1:3])

    def test_export_skips_erased_rows(self, storage: Storage) -> None:
        storage.find_or_insert(_keys(np.arange(20)))
        storage.erase(_keys(np.arange(0, 20, 2)))
        assert sorted(storage.export()[0].tolist()) == list(range(1, 20, 2))

    def test_import_batch_stores_the_given_scores(self, storage: Storage) -> None:
        keys = _keys(np.arange(1, 6))
        scores = np.array([7, 2**63, 5, 0, 2**64 - 1], dtype=np.uint64)
        storage.import_batch(keys, _rows_for(keys, storage.row_width), scores)
        exported, values, got = storage.export()
        order = np.argsort(exported)
        np.testing.assert_array_equal(exported[order], keys)
        np.testing.assert_array_equal(got[order], scores)
        np.testing.assert_array_equal(values[order], _rows_for(keys, storage.row_width))
        storage.import_batch(keys[:2], _rows_for(keys[:2], storage.row_width), np.array([1, 1], np.uint64))
        assert sorted(storage.export_if(2)[0].tolist()) == [3, 5]

    def test_scores_are_times_of_the_last_write(self, spec: BackendSpec, storage: Storage) -> None:
        if not spec.capabilities.export_if:
            pytest.skip(f"backend {spec.name!r} keeps no scores")
        before = time.time_ns()
        storage.insert_or_assign(_keys([1, 2]), np.zeros((2, 4), np.float32))
        after = time.time_ns()
        scores = storage.export()[2]
        assert scores.dtype == np.uint64
        assert ((scores >= before) & (scores <= after)).all(), (before, scores, after)

    def test_export_if_returns_rows_written_since_a_time(self, spec: BackendSpec, storage: Storage) -> None:
        if not spec.capabilities.export_if:
            pytest.skip(f"backend {spec.name!r} keeps no scores")
        storage.insert_or_assign(_keys([1, 2, 3]), _rows_for([1, 2, 3], 4))
        storage.find_or_insert(_keys([4]))
        _sleep_past_clock()
        since = time.time_ns()
        _sleep_past_clock()
        storage.insert_or_assign(_keys([2, 5]), _rows_for([2, 5], 4))
        storage.accum_or_assign(_keys([3]), np.ones((1, 4), np.float32))
        storage.find_or_insert(_keys([6]))
        keys, values, scores = storage.export_if(since)
        assert sorted(keys.tolist()) == [2, 3, 5, 6]
        assert (scores >= since).all()
        expected = dict(zip([2, 3, 5, 6], storage.find(_keys([2, 3, 5, 6]))[0], strict=True))
        np.testing.assert_array_equal(values, [expected[int(k)] for k in keys])

    def test_find_or_insert_refreshes_the_scores_of_existing_keys(self, spec: BackendSpec, storage: Storage) -> None:
        if not spec.capabilities.export_if:
            pytest.skip(f"backend {spec.name!r} keeps no scores")
        storage.find_or_insert(_keys([1, 2]))
        _sleep_past_clock()
        since = time.time_ns()
        storage.find_or_insert(_keys([2]))
        np.testing.assert_array_equal(storage.export_if(since)[0], [2])

    def test_export_if_threshold_zero_returns_every_row(self, spec: BackendSpec, storage: Storage) -> None:
        if not spec.capabilities.export_if:
            pytest.skip(f"backend {spec.name!r} keeps no scores")
        storage.find_or_insert(_keys(np.arange(10)))
        assert sorted(storage.export_if(0)[0].tolist()) == list(range(10))

    # -- insert_and_evict -----------------------------------------------------------------------
    def test_insert_and_evict_with_room_evicts_nothing(
        self, make_storage: MakeStorage, no_eviction_options: dict[str, Any]
    ) -> None:
        storage = make_storage(row_width=3, **no_eviction_options)
        keys = _keys(np.arange(200))
        evicted_keys, evicted_rows, evicted_scores = storage.insert_and_evict(keys, _rows_for(keys, 3))
        assert evicted_keys.size == 0 and evicted_rows.shape == (0, 3) and evicted_scores.size == 0
        assert evicted_keys.dtype == np.int64 and evicted_scores.dtype == np.dtype(SCORE_DTYPE)
        np.testing.assert_array_equal(storage.find(keys)[0], _rows_for(keys, 3))

    def test_insert_and_evict_reports_every_displaced_row(
        self, spec: BackendSpec, one_bucket: Callable[..., Storage]
    ) -> None:
        policy = next((p for p in ("lru", "lfu") if p in spec.capabilities.eviction_policies), "lru")
        storage = one_bucket(policy, row_width=4, initializer=7.0)
        old = _keys(np.arange(BUCKET_SLOTS))
        storage.insert_or_assign(old, _rows_for(old, 4))
        new = _keys(np.arange(1000, 1064))
        evicted_keys, evicted_rows, _ = storage.insert_and_evict(new, -np.ones((64, 2), np.float32), columns=(0, 2))
        stored = storage.export()[0]
        assert storage.size() == BUCKET_SLOTS
        assert len(evicted_keys) == 64
        assert set(evicted_keys.tolist()).isdisjoint(stored.tolist())
        assert sorted(evicted_keys.tolist() + stored.tolist()) == sorted(old.tolist() + new.tolist())
        # Evicted rows are whole rows (optimizer columns included) as they were stored.
        written = {int(k): row for k, row in zip(old, _rows_for(old, 4), strict=True)}
        written.update({int(k): np.array([-1, -1, 7, 7], np.float32) for k in new})
        np.testing.assert_array_equal(evicted_rows, [written[int(k)] for k in evicted_keys])

    # -- size, capacity, clear ------------------------------------------------------------------
    def test_size_counts_distinct_keys(self, storage: Storage) -> None:
        storage.find_or_insert(_keys([1, 2, 2]))
        storage.insert_or_assign(_keys([2, 3, 3]), np.zeros((3, 4), np.float32))
        storage.accum_or_assign(_keys([4, 1]), np.zeros((2, 4), np.float32))
        assert storage.size() == 4

    def test_capacity_holds_the_rows(self, storage: Storage) -> None:
        storage.find_or_insert(_keys(np.arange(1000)))
        assert storage.capacity() >= storage.size() == 1000

    def test_clear_removes_every_row(self, storage: Storage) -> None:
        storage.find_or_insert(_keys(np.arange(100)))
        storage.clear()
        assert storage.size() == 0
        assert storage.export()[0].size == 0
        assert not storage.find(_keys(np.arange(100)))[1].any()

    def test_clear_keeps_the_capacity(self, storage: Storage) -> None:
        storage.find_or_insert(_keys(np.arange(1000)))
        capacity = storage.capacity()
        storage.clear()
        assert storage.capacity() == capacity

    def test_storage_works_after_clear(self, make_storage: MakeStorage) -> None:
        storage = make_storage(row_width=2, initializer=_RANDOM)
        storage.insert_or_assign(_keys([1, 2]), np.ones((2, 2), np.float32))
        storage.clear()
        values, found = storage.find_or_insert(_keys([2, 3]))
        np.testing.assert_array_equal(values, inits.init_rows(_keys([2, 3]), [_RANDOM], 2))
        assert not found.any() and storage.size() == 2

    # -- key dtypes and key values --------------------------------------------------------------
    @pytest.mark.parametrize("key_dtype", KEY_DTYPES)
    def test_extreme_keys_are_valid(self, spec: BackendSpec, make_storage: MakeStorage, key_dtype: str) -> None:
        if key_dtype not in spec.capabilities.key_dtypes:
            pytest.skip(f"backend {spec.name!r} does not take {key_dtype} keys")
        storage = make_storage(row_width=2, key_dtype=key_dtype)
        keys = _keys(EXTREME_KEYS[key_dtype], key_dtype)
        rows = np.arange(2 * keys.size, dtype=np.float32).reshape(-1, 2)
        storage.insert_or_assign(keys, rows)
        assert storage.size() == keys.size
        values, found = storage.find(keys)
        assert found.all()
        np.testing.assert_array_equal(values, rows)
        exported, exported_rows, _ = storage.export()
        assert exported.dtype == np.dtype(key_dtype)
        order = np.argsort(exported)
        np.testing.assert_array_equal(exported[order], np.sort(keys))
        np.testing.assert_array_equal(exported_rows[order], rows[np.argsort(keys)])

    @pytest.mark.parametrize("key_dtype", KEY_DTYPES)
    def test_extreme_keys_get_the_reference_initial_rows(
        self, spec: BackendSpec, make_storage: MakeStorage, key_dtype: str
    ) -> None:
        if key_dtype not in spec.capabilities.key_dtypes:
            pytest.skip(f"backend {spec.name!r} does not take {key_dtype} keys")
        storage = make_storage(row_width=3, key_dtype=key_dtype, initializer=_RANDOM)
        keys = _keys(EXTREME_KEYS[key_dtype], key_dtype)
        values, found = storage.find_or_insert(keys)
        np.testing.assert_array_equal(values, inits.init_rows(keys, [_RANDOM], 3))
        assert not found.any()

    @pytest.mark.parametrize("key_dtype", KEY_DTYPES)
    def test_erase_extreme_keys(self, spec: BackendSpec, make_storage: MakeStorage, key_dtype: str) -> None:
        if key_dtype not in spec.capabilities.key_dtypes:
            pytest.skip(f"backend {spec.name!r} does not take {key_dtype} keys")
        storage = make_storage(row_width=1, key_dtype=key_dtype)
        keys = _keys(EXTREME_KEYS[key_dtype], key_dtype)
        storage.find_or_insert(keys)
        assert storage.erase(keys[::2]) == keys[::2].size
        np.testing.assert_array_equal(storage.find(keys)[1], np.arange(keys.size) % 2 == 1)

    def test_keys_of_another_integer_dtype_are_converted(self, make_storage: MakeStorage) -> None:
        storage = make_storage(row_width=1, key_dtype="int64")
        storage.insert_or_assign(np.array([5, -5], np.int32), [[1.0], [2.0]])
        values, found = storage.find(np.array([5, 2**40], np.uint64))
        np.testing.assert_array_equal(found, [True, False])
        np.testing.assert_array_equal(storage.find([-5])[0], [[2.0]])

    # -- empty batches and row widths -----------------------------------------------------------
    @pytest.mark.parametrize(
        "op", ["find", "find_or_insert", "insert_or_assign", "accum_or_assign", "erase", "insert_and_evict"]
    )
    def test_empty_batches_are_no_ops(self, storage: Storage, op: str) -> None:
        storage.insert_or_assign(_keys([1]), np.ones((1, 4), np.float32))
        before = snapshot(storage)
        empty = _keys([])
        args = (
            (np.zeros((0, 4), np.float32),) if op in ("insert_or_assign", "accum_or_assign", "insert_and_evict") else ()
        )
        result = getattr(storage, op)(empty, *args)
        if op == "erase":
            assert result == 0
        elif op in ("find", "find_or_insert"):
            assert result[0].shape == (0, 4) and result[1].shape == (0,)
        elif op == "insert_and_evict":
            assert [r.shape for r in result] == [(0,), (0, 4), (0,)]
        assert_same_contents(snapshot(storage), before)

    @pytest.mark.parametrize("row_width", [1, 129])
    def test_row_width(self, make_storage: MakeStorage, row_width: int) -> None:
        storage = make_storage(row_width=row_width, initializer=_RANDOM)
        keys = _keys(np.arange(40))
        values, _ = storage.find_or_insert(keys)
        np.testing.assert_array_equal(values, inits.init_rows(keys, [_RANDOM], row_width))
        storage.insert_or_assign(keys[:20], _rows_for(keys[:20], row_width))
        last = (row_width - 1, row_width)
        storage.accum_or_assign(keys[:20], np.ones((20, 1), np.float32), columns=last)
        expected = _rows_for(keys[:20], row_width)
        expected[:, -1] += 1.0
        np.testing.assert_array_equal(storage.find(keys[:20])[0], expected)
        np.testing.assert_array_equal(storage.find(keys[:20], columns=last)[0], expected[:, -1:])

    # -- growth ---------------------------------------------------------------------------------
    def test_growth_past_the_initial_capacity_keeps_every_row(
        self, make_storage: MakeStorage, small_capacity_options: dict[str, Any]
    ) -> None:
        storage = make_storage(row_width=2, **small_capacity_options)
        initial = storage.capacity()
        keys = _keys(np.arange(6000) * 2654435761 % (2**61) - 2**60)
        for batch in np.array_split(keys, 12):
            storage.insert_or_assign(batch, _rows_for(batch, 2))
        assert storage.size() == keys.size
        assert storage.capacity() > initial
        values, found = storage.find(keys)
        assert found.all()
        np.testing.assert_array_equal(values, _rows_for(keys, 2))

    def test_growth_inside_one_batch_keeps_every_row(
        self, make_storage: MakeStorage, small_capacity_options: dict[str, Any]
    ) -> None:
        storage = make_storage(row_width=2, initializer=_RANDOM, **small_capacity_options)
        keys = _keys(np.arange(3000))
        values, found = storage.find_or_insert(keys)
        assert not found.any()
        np.testing.assert_array_equal(values, inits.init_rows(keys, [_RANDOM], 2))
        np.testing.assert_array_equal(storage.find(keys)[0], values)

    @pytest.mark.parametrize("key_dtype", KEY_DTYPES)
    def test_large_batches_match_the_reference(
        self,
        spec: BackendSpec,
        make_storage: MakeStorage,
        key_dtype: str,
        small_capacity_options: dict[str, Any],
        no_eviction_options: dict[str, Any],
    ) -> None:
        """Batches big enough for a backend's bulk (parallel) paths, with many duplicates, while
        the table grows."""
        if key_dtype not in spec.capabilities.key_dtypes:
            pytest.skip(f"backend {spec.name!r} does not take {key_dtype} keys")
        storage = make_storage(
            row_width=4, key_dtype=key_dtype, initializer=_RANDOM, **{**small_capacity_options, **no_eviction_options}
        )
        rng = np.random.default_rng(2024)

        def draw(size: int) -> np.ndarray:  # ~30000 distinct keys, at the top of the range for uint64
            keys = rng.integers(-15_000, 15_000, size=size)
            return (np.uint64(2**64 - 15_001) - keys.astype(np.uint64) if key_dtype == "uint64" else keys).astype(
                key_dtype
            )

        keys = draw(40_000)
        values, found = storage.find_or_insert(keys)
        assert not found.any()
        np.testing.assert_array_equal(values, inits.init_rows(keys, [_RANDOM], 4))
        expected = dict(zip(keys.tolist(), values, strict=True))

        written = draw(40_000)
        rows = rng.integers(-50, 50, size=(written.size, 4)).astype(np.float32)
        storage.insert_or_assign(written, rows)
        expected.update(zip(written.tolist(), rows, strict=True))  # in batch order: the last duplicate wins

        added = written[rng.integers(0, written.size, size=30_000)]
        storage.accum_or_assign(added, np.ones((added.size, 4), np.float32))
        unique, counts = np.unique(added, return_counts=True)
        for key, count in zip(unique.tolist(), counts, strict=True):
            expected[key] = expected[key] + np.float32(count)  # integer rows: the sums are exact

        model_keys = np.array(sorted(expected), dtype=key_dtype)
        assert storage.size() == model_keys.size
        assert_same_contents(snapshot(storage), (model_keys, np.array([expected[k] for k in model_keys.tolist()])))

    # -- eviction -------------------------------------------------------------------------------
    def _fill_one_by_one(self, storage: Storage, keys: range, **kwargs: Any) -> None:
        """One call per key, so every key gets its own (later) score."""
        for key in keys:
            storage.insert_or_assign(_keys([key]), _rows_for([key], storage.row_width), **kwargs)

    def test_eviction_keeps_size_at_the_maximum(self, spec: BackendSpec, one_bucket: Callable[..., Storage]) -> None:
        policy = next((p for p in ("lru", "lfu") if p in spec.capabilities.eviction_policies), "lru")
        storage = one_bucket(policy)
        keys = _keys(np.arange(3 * BUCKET_SLOTS))
        storage.insert_or_assign(keys, _rows_for(keys, 2))
        assert storage.size() == BUCKET_SLOTS
        assert storage.capacity() == BUCKET_SLOTS

    def test_unknown_eviction_policy_is_refused(self, spec: BackendSpec, make_storage: MakeStorage) -> None:
        if not spec.capabilities.eviction:
            pytest.skip(f"backend {spec.name!r} does not evict")
        with pytest.raises(ValueError, match="no_such_policy"):
            make_storage(row_width=2, evict_strategy="no_such_policy")

    def test_lru_evicts_the_least_recently_written(self, one_bucket: Callable[..., Storage]) -> None:
        storage = one_bucket("lru")
        self._fill_one_by_one(storage, range(BUCKET_SLOTS))
        storage.insert_or_assign(_keys([0]), _rows_for([0], 2))
        evicted, rows, _ = storage.insert_and_evict(_keys([1000]), _rows_for([1000], 2))
        np.testing.assert_array_equal(evicted, [1])
        np.testing.assert_array_equal(rows, _rows_for([1], 2))
        evicted, _, _ = storage.insert_and_evict(_keys([1001]), _rows_for([1001], 2))
        np.testing.assert_array_equal(evicted, [2])
        np.testing.assert_array_equal(
            storage.find(_keys([0, 1, 2, 3, 1000, 1001]))[1], [True, False, False, True, True, True]
        )

    def test_lru_find_or_insert_counts_as_use(self, one_bucket: Callable[..., Storage]) -> None:
        storage = one_bucket("lru")
        self._fill_one_by_one(storage, range(BUCKET_SLOTS))
        storage.find_or_insert(_keys([0]))
        evicted, _, _ = storage.insert_and_evict(_keys([1000]), _rows_for([1000], 2))
        np.testing.assert_array_equal(evicted, [1])

    def test_lru_find_does_not_count_as_use(self, one_bucket: Callable[..., Storage]) -> None:
        storage = one_bucket("lru")
        self._fill_one_by_one(storage, range(BUCKET_SLOTS))
        storage.find(_keys([0]))
        evicted, _, _ = storage.insert_and_evict(_keys([1000]), _rows_for([1000], 2))
        np.testing.assert_array_equal(evicted, [0])

    def test_lfu_evicts_the_least_frequently_used(self, one_bucket: Callable[..., Storage]) -> None:
        storage = one_bucket("lfu")
        keys = _keys(np.arange(BUCKET_SLOTS))
        storage.insert_or_assign(keys, _rows_for(keys, 2))
        again = keys[keys != 77]
        storage.accum_or_assign(again, np.zeros((again.size, 2), np.float32))
        storage.find_or_insert(again)
        evicted, rows, scores = storage.insert_and_evict(_keys([1000]), _rows_for([1000], 2))
        np.testing.assert_array_equal(evicted, [77])
        np.testing.assert_array_equal(rows, _rows_for([77], 2))
        np.testing.assert_array_equal(scores, [1])

    def test_lfu_counts_find_or_insert(self, one_bucket: Callable[..., Storage]) -> None:
        storage = one_bucket("lfu")
        keys = _keys(np.arange(BUCKET_SLOTS))
        storage.find_or_insert(keys)
        storage.find_or_insert(keys[keys != 5])
        storage.find(_keys([5]))  # not a use
        evicted, _, _ = storage.insert_and_evict(_keys([1000]), _rows_for([1000], 2))
        np.testing.assert_array_equal(evicted, [5])

    def test_lfu_scores_count_uses(self, one_bucket: Callable[..., Storage]) -> None:
        storage = one_bucket("lfu")
        storage.find_or_insert(_keys([1, 2]))
        storage.insert_or_assign(_keys([1]), _rows_for([1], 2))
        storage.accum_or_assign(_keys([1]), _rows_for([1], 2))
        keys, _, scores = storage.export()
        assert dict(zip(keys.tolist(), scores.tolist(), strict=True)) == {1: 3, 2: 1}

    def _custom_scores(self) -> tuple[np.ndarray, np.ndarray]:
        keys = _keys(np.arange(BUCKET_SLOTS))
        scores = (1000 + (keys * 37 + 11) % BUCKET_SLOTS).astype(np.uint64)
        return keys, scores

    def test_custom_evicts_the_lowest_caller_score(self, one_bucket: Callable[..., Storage]) -> None:
        storage = one_bucket("custom")
        keys, scores = self._custom_scores()
        storage.insert_or_assign(keys, _rows_for(keys, 2), scores=scores)
        lowest = int(keys[np.argmin(scores)])
        evicted, rows, evicted_scores = storage.insert_and_evict(_keys([5000]), _rows_for([5000], 2), scores=[2000])
        np.testing.assert_array_equal(evicted, [lowest])
        np.testing.assert_array_equal(rows, _rows_for([lowest], 2))
        np.testing.assert_array_equal(evicted_scores, [1000])
        assert storage.find(_keys([5000]))[1][0]

    def test_custom_refuses_a_newcomer_below_the_bucket_minimum(self, one_bucket: Callable[..., Storage]) -> None:
        storage = one_bucket("custom", initializer=3.0)
        keys, scores = self._custom_scores()
        storage.insert_or_assign(keys, _rows_for(keys, 2), scores=scores)
        before = snapshot(storage)
        evicted, rows, evicted_scores = storage.insert_and_evict(_keys([5000]), [[-1.0]], columns=(1, 2), scores=[999])
        np.testing.assert_array_equal(evicted, [5000])
        np.testing.assert_array_equal(rows, [[3.0, -1.0]])  # the row it would have had
        np.testing.assert_array_equal(evicted_scores, [999])
        assert not storage.find(_keys([5000]))[1][0]
        assert_same_contents(snapshot(storage), before)

    def test_custom_admits_a_newcomer_equal_to_the_bucket_minimum(self, one_bucket: Callable[..., Storage]) -> None:
        storage = one_bucket("custom")
        keys, scores = self._custom_scores()
        storage.insert_or_assign(keys, _rows_for(keys, 2), scores=scores)
        evicted, _, _ = storage.insert_and_evict(_keys([5000]), _rows_for([5000], 2), scores=[1000])
        np.testing.assert_array_equal(evicted, keys[np.argmin(scores)])
        assert storage.find(_keys([5000]))[1][0]

    def test_custom_keeps_the_highest_scores_of_one_large_batch(self, one_bucket: Callable[..., Storage]) -> None:
        """Refusals and evictions together keep the top scores: a streaming top-k per bucket."""
        storage = one_bucket("custom", row_width=1)
        keys = _keys(np.arange(20_000))
        scores = np.random.default_rng(9).permutation(keys.size).astype(np.uint64) + np.uint64(10)
        evicted, rows, evicted_scores = storage.insert_and_evict(keys, keys[:, None].astype(np.float32), scores=scores)
        stored = storage.export()[0]
        assert sorted(stored.tolist()) == sorted(keys[np.argsort(scores)[-BUCKET_SLOTS:]].tolist())
        assert sorted(evicted.tolist() + stored.tolist()) == keys.tolist()
        np.testing.assert_array_equal(evicted_scores, scores[evicted])
        np.testing.assert_array_equal(rows[:, 0], evicted)

    def test_custom_scores_are_the_caller_scores(self, one_bucket: Callable[..., Storage]) -> None:
        storage = one_bucket("custom")
        storage.insert_or_assign(_keys([1, 2]), _rows_for([1, 2], 2), scores=np.array([17, 2**64 - 1], np.uint64))
        keys, _, scores = storage.export()
        assert dict(zip(keys.tolist(), scores.tolist(), strict=True)) == {1: 17, 2: 2**64 - 1}

    def test_epoch_lru_evicts_from_the_oldest_epoch(self, one_bucket: Callable[..., Storage]) -> None:
        storage = one_bucket("epoch_lru")
        storage.set_global_epoch(1)
        keys = _keys(np.arange(BUCKET_SLOTS))
        storage.insert_or_assign(keys, _rows_for(keys, 2))
        storage.set_global_epoch(2)
        again = keys[keys != 9]
        storage.insert_or_assign(again, _rows_for(again, 2))
        evicted, _, scores = storage.insert_and_evict(_keys([1000]), _rows_for([1000], 2))
        np.testing.assert_array_equal(evicted, [9])
        assert int(scores[0]) >> 32 == 1
        assert storage.find(_keys([1000]))[1][0]

    def test_epoch_lru_refuses_a_newcomer_of_an_older_epoch(self, one_bucket: Callable[..., Storage]) -> None:
        storage = one_bucket("epoch_lru")
        storage.set_global_epoch(2)
        keys = _keys(np.arange(BUCKET_SLOTS))
        storage.insert_or_assign(keys, _rows_for(keys, 2))
        storage.set_global_epoch(1)
        evicted, _, _ = storage.insert_and_evict(_keys([1000]), _rows_for([1000], 2))
        np.testing.assert_array_equal(evicted, [1000])
        assert storage.size() == BUCKET_SLOTS and not storage.find(_keys([1000]))[1][0]

    def test_epoch_lfu_evicts_the_least_frequent_of_the_oldest_epoch(self, one_bucket: Callable[..., Storage]) -> None:
        storage = one_bucket("epoch_lfu")
        storage.set_global_epoch(1)
        keys = _keys(np.arange(BUCKET_SLOTS))
        storage.insert_or_assign(keys, _rows_for(keys, 2))
        again = keys[keys != 9]
        storage.insert_or_assign(again, _rows_for(again, 2))
        storage.set_global_epoch(2)
        evicted, _, scores = storage.insert_and_evict(_keys([1000]), _rows_for([1000], 2))
        np.testing.assert_array_equal(evicted, [9])
        np.testing.assert_array_equal(scores, [(1 << 32) | 1])

    def test_epoch_lfu_refuses_a_newcomer_of_an_older_epoch(self, one_bucket: Callable[..., Storage]) -> None:
        storage = one_bucket("epoch_lfu")
        storage.set_global_epoch(2)
        keys = _keys(np.arange(BUCKET_SLOTS))
        storage.insert_or_assign(keys, _rows_for(keys, 2))
        storage.set_global_epoch(1)
        evicted, _, _ = storage.insert_and_evict(_keys([1000]), _rows_for([1000], 2))
        np.testing.assert_array_equal(evicted, [1000])
        assert not storage.find(_keys([1000]))[1][0]

    def test_set_global_epoch_needs_an_epoch_policy(self, storage: Storage) -> None:
        with pytest.raises(NotImplementedError, match="epoch"):
            storage.set_global_epoch(1)

    # -- bad input ------------------------------------------------------------------------------
    @pytest.fixture
    def filled(self, storage: Storage) -> Storage:
        keys = _keys([1, 2, 3])
        storage.insert_or_assign(keys, _rows_for(keys, 4))
        return storage

    def _assert_refused(self, storage: Storage, error: type[Exception], match: str, call: Callable[[], Any]) -> None:
        before = snapshot(storage)
        with pytest.raises(error, match=match):
            call()
        assert_same_contents(snapshot(storage), before)

    @pytest.mark.parametrize(
        "op", ["find", "find_or_insert", "insert_or_assign", "accum_or_assign", "erase", "insert_and_evict"]
    )
    def test_float_keys_are_refused(self, filled: Storage, op: str) -> None:
        keys = np.array([4.0, 5.0])
        args = (
            (np.zeros((2, 4), np.float32),) if op in ("insert_or_assign", "accum_or_assign", "insert_and_evict") else ()
        )
        self._assert_refused(filled, TypeError, "float64", lambda: getattr(filled, op)(keys, *args))

    def test_two_dimensional_keys_are_refused(self, filled: Storage) -> None:
        self._assert_refused(filled, ValueError, r"\(2, 2\)", lambda: filled.find_or_insert(_keys([[4, 5], [6, 7]])))

    def test_wrong_value_shape_is_refused(self, filled: Storage) -> None:
        self._assert_refused(
            filled,
            ValueError,
            r"\(2, 3\)",
            lambda: filled.insert_or_assign(_keys([4, 5]), np.zeros((2, 3), np.float32)),
        )

    def test_values_for_the_wrong_column_range_are_refused(self, filled: Storage) -> None:
        self._assert_refused(
            filled,
            ValueError,
            r"\(2, 4\)",
            lambda: filled.accum_or_assign(_keys([1, 5]), np.zeros((2, 4)), columns=(0, 2)),
        )

    def test_non_numeric_values_are_refused(self, filled: Storage) -> None:
        self._assert_refused(
            filled, TypeError, "values", lambda: filled.insert_or_assign(_keys([4]), np.array([["a"] * 4]))
        )

    @pytest.mark.parametrize("columns", [(2, 5), (-1, 2), (3, 3), (3, 1)])
    def test_column_range_outside_the_row_is_refused(self, filled: Storage, columns: tuple[int, int]) -> None:
        self._assert_refused(
            filled,
            ValueError,
            f"\\({columns[0]}, {columns[1]}\\)",
            lambda: filled.insert_or_assign(_keys([1]), np.zeros((1, 1), np.float32), columns=columns),
        )

    def test_column_range_outside_the_row_is_refused_by_reads(self, filled: Storage) -> None:
        self._assert_refused(filled, ValueError, r"\(0, 9\)", lambda: filled.find_or_insert(_keys([9]), columns=(0, 9)))

    @pytest.mark.parametrize(
        ("key_dtype", "bad"),
        [("int64", 2**63), ("int64", 2**64 - 1), ("uint64", -1), ("int32", 2**31), ("int32", -(2**31) - 1)],
    )
    def test_keys_out_of_the_dtype_range_are_refused(
        self, spec: BackendSpec, make_storage: MakeStorage, key_dtype: str, bad: int
    ) -> None:
        if key_dtype not in spec.capabilities.key_dtypes:
            pytest.skip(f"backend {spec.name!r} does not take {key_dtype} keys")
        storage = make_storage(row_width=1, key_dtype=key_dtype)
        storage.find_or_insert(_keys([1, 2], key_dtype))
        keys = np.array([1, bad], dtype=np.uint64 if bad >= 2**63 else np.int64)
        self._assert_refused(storage, ValueError, str(bad), lambda: storage.insert_or_assign(keys, [[1.0], [2.0]]))

    def test_negative_scores_are_refused(self, filled: Storage) -> None:
        self._assert_refused(
            filled, ValueError, "-3", lambda: filled.insert_or_assign(_keys([4]), np.zeros((1, 4)), scores=[-3])
        )

    def test_scores_are_refused_where_the_backend_computes_them(self, filled: Storage) -> None:
        """The storage of the ``storage`` fixture (default options) computes its own scores."""
        self._assert_refused(
            filled, ValueError, "scores", lambda: filled.insert_or_assign(_keys([4]), np.zeros((1, 4)), scores=[3])
        )

    def test_unknown_option_is_refused(self, make_storage: MakeStorage) -> None:
        with pytest.raises(ValueError, match="no_such_option"):
            make_storage(row_width=2, no_such_option=1)

    def test_bad_option_value_is_refused(
        self, make_storage: MakeStorage, small_capacity_options: dict[str, Any]
    ) -> None:
        name = next(iter(small_capacity_options))
        with pytest.raises(ValueError, match=f"{name}.*not_a_number"):
            make_storage(row_width=2, **{name: "not_a_number"})

    @pytest.mark.parametrize("row_width", [0, -1, 2.5, True])
    def test_bad_row_width_is_refused(self, make_storage: MakeStorage, row_width: Any) -> None:
        with pytest.raises(ValueError, match=f"row_width.*{row_width!r}"):
            make_storage(row_width=row_width)

    @pytest.mark.parametrize("key_dtype", ["float32", "int16", "str"])
    def test_unsupported_key_dtype_is_refused(self, make_storage: MakeStorage, key_dtype: str) -> None:
        with pytest.raises(ValueError, match=key_dtype):
            make_storage(row_width=2, key_dtype=key_dtype)

    def test_bad_export_range_is_refused(self, filled: Storage) -> None:
        with pytest.raises(ValueError, match="-1"):
            filled.export_batch(-1, 10)

    # -- threads --------------------------------------------------------------------------------
    def test_threads_writing_disjoint_keys(
        self, make_storage: MakeStorage, small_capacity_options: dict[str, Any]
    ) -> None:
        storage = make_storage(row_width=2, initializer=_RANDOM, **small_capacity_options)

        def batches(t: int) -> list[np.ndarray]:
            return np.array_split(_keys(np.arange(t * 10_000, t * 10_000 + 900)), 12)

        def work(t: int) -> None:
            for batch in batches(t):
                storage.insert_or_assign(batch[::2], _rows_for(batch[::2], 2))
                storage.find_or_insert(batch)
                storage.accum_or_assign(batch[1::3], np.ones((batch[1::3].size, 2), np.float32))
                storage.erase(batch[::5])
                values, found = storage.find(batch[::2])
                np.testing.assert_array_equal(found, np.arange(0, batch.size, 2) % 5 != 0)

        _run_threads(4, work)
        model = DictModel(2, "int64", [_RANDOM])
        for t in range(4):
            for batch in batches(t):
                model.insert_or_assign(batch[::2], _rows_for(batch[::2], 2))
                model.find_or_insert(batch)
                model.accum_or_assign(batch[1::3], np.ones((batch[1::3].size, 2), np.float32))
                model.erase(batch[::5])
        assert_same_contents(snapshot(storage), model.contents())

    def test_threads_inserting_the_same_keys_create_each_once(self, make_storage: MakeStorage) -> None:
        storage = make_storage(row_width=3, initializer=_RANDOM)
        keys = _keys(np.arange(800))

        def work(t: int) -> np.ndarray:
            created = np.zeros(keys.size, np.int64)
            order = np.random.default_rng(t).permutation(keys)
            for batch in np.array_split(order, 16):
                values, found = storage.find_or_insert(batch)
                np.testing.assert_array_equal(values, inits.init_rows(batch, [_RANDOM], 3))
                created[batch[~found]] += 1
            return created

        created = sum(_run_threads(4, work))
        np.testing.assert_array_equal(created, np.ones(keys.size))
        assert storage.size() == keys.size

    def test_threads_accumulating_into_the_same_keys_lose_no_update(self, make_storage: MakeStorage) -> None:
        storage = make_storage(row_width=2)
        keys = _keys(np.arange(64))
        rounds = 40

        def work(t: int) -> None:
            for _ in range(rounds):
                storage.accum_or_assign(keys, np.ones((keys.size, 2), np.float32))

        with ThreadPoolExecutor(1) as pool:
            writers = pool.submit(_run_threads, 4, work)
            while not writers.done():  # meanwhile, every row read is whole and a count of updates
                values, found = storage.find(keys)
                seen = values[found]
                np.testing.assert_array_equal(seen[:, 0], seen[:, 1])
                assert ((seen >= 1) & (seen <= 4 * rounds)).all()
            writers.result()
        np.testing.assert_array_equal(storage.find(keys)[0], np.full((keys.size, 2), 4 * rounds))

    def test_threads_overwriting_the_same_keys_leave_whole_rows(self, make_storage: MakeStorage) -> None:
        storage = make_storage(row_width=8)
        keys = _keys(np.arange(200))

        def work(t: int) -> None:
            for _ in range(20):
                storage.insert_or_assign(keys, np.full((keys.size, 8), float(t), np.float32))

        _run_threads(4, work)
        values, found = storage.find(keys)
        assert found.all()
        np.testing.assert_array_equal(values, np.repeat(values[:, :1], 8, axis=1))
        assert set(np.unique(values).tolist()) <= {0.0, 1.0, 2.0, 3.0}

    def test_threads_with_large_batches_lose_no_update(self, make_storage: MakeStorage) -> None:
        storage = make_storage(row_width=2)
        keys = np.random.default_rng(5).integers(0, 5_000, size=20_000)

        def work(t: int) -> None:
            for _ in range(4):
                storage.accum_or_assign(keys, np.ones((keys.size, 2), np.float32))

        _run_threads(3, work)
        unique, counts = np.unique(keys, return_counts=True)
        values, found = storage.find(unique)
        assert found.all() and storage.size() == unique.size
        np.testing.assert_array_equal(values, np.repeat(12.0 * counts[:, None], 2, axis=1))

    # -- random operation sequences against the dict model ---------------------------------------
    def test_random_operations_match_the_dict_model(
        self, make_storage: MakeStorage, no_eviction_options: dict[str, Any]
    ) -> None:
        hypothesis = pytest.importorskip("hypothesis")
        from hypothesis.stateful import run_state_machine_as_test

        from sparse_operation_kit.testing.stateful import ROW_WIDTH, model_state_machine

        initializer = inits.uniform(-1.0, 1.0, seed=77)
        machine = model_state_machine(
            lambda: make_storage(row_width=ROW_WIDTH, initializer=initializer, **no_eviction_options), [initializer]
        )
        settings = hypothesis.settings(
            max_examples=50,
            stateful_step_count=25,
            deadline=None,
            database=None,
            suppress_health_check=list(hypothesis.HealthCheck),
        )
        run_state_machine_as_test(machine, settings=settings)
