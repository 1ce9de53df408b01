"""The storage conformance suite, registration and identity: the var_type is in the registry, the
backend's ``Capabilities`` hold together (key dtypes, eviction policies, devices), a storage reports
its backend, row width, key dtype and device, bad devices and GPU storages of a backend without
``"cuda"`` in ``Capabilities.devices`` are refused, and a new storage is empty.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from sparse_operation_kit.device_arrays import parse_device
from sparse_operation_kit.dtypes import KEY_DTYPES
from sparse_operation_kit.plugins.registry import BackendSpec, get_registry
from sparse_operation_kit.storage import Storage
from sparse_operation_kit.testing.conformance.base import ConformanceFixtures, MakeStorage

__all__ = ["RegistrationConformance"]


class RegistrationConformance(ConformanceFixtures):
    """A storage knows its backend and device, and the backend's capabilities hold together: a concern
    of :class:`StorageConformance`, also usable alone."""

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
