"""The storage conformance suite, key dtypes and key values: the keys at the edges of each key dtype
(:data:`EXTREME_KEYS`) are stored, read, initialized and erased like any other, and keys of another
integer dtype are converted. A dtype not in ``Capabilities.key_dtypes`` is skipped.
"""

from __future__ import annotations

import numpy as np
import pytest

from sparse_operation_kit import initializers as inits
from sparse_operation_kit.dtypes import KEY_DTYPES
from sparse_operation_kit.plugins.registry import BackendSpec
from sparse_operation_kit.testing.conformance.base import (
    _RANDOM,
    ConformanceFixtures,
    MakeStorage,
    _keys,
    _skip_unless_key_dtype,
)

__all__ = ["EXTREME_KEYS", "KeyDtypeConformance"]

#: Keys at the edges of each key dtype (and keys equal in their low 32 bits): every one is valid.
EXTREME_KEYS: dict[str, list[int]] = {
    "int64": [0, 1, -1, 2**31 - 1, -(2**31), 2**32, 2**32 + 1, 2**63 - 1, -(2**63)],
    "uint64": [0, 1, 2**32, 2**32 + 1, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1],
    "int32": [0, 1, -1, 2**31 - 1, -(2**31), 65536, -65536],
}


class KeyDtypeConformance(ConformanceFixtures):
    """Every key of every key dtype the backend takes, the extreme ones included: a concern of
    :class:`StorageConformance`, also usable alone."""

    @pytest.mark.parametrize("key_dtype", KEY_DTYPES)
    def test_extreme_keys_are_valid(self, spec: BackendSpec, make_storage: MakeStorage, key_dtype: str) -> None:
        _skip_unless_key_dtype(spec, key_dtype)
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
        _skip_unless_key_dtype(spec, key_dtype)
        storage = make_storage(row_width=3, key_dtype=key_dtype, initializer=_RANDOM)
        keys = _keys(EXTREME_KEYS[key_dtype], key_dtype)
        values, found = storage.find_or_insert(keys)
        np.testing.assert_array_equal(values, inits.init_rows(keys, [_RANDOM], 3))
        assert not found.any()

    @pytest.mark.parametrize("key_dtype", KEY_DTYPES)
    def test_erase_extreme_keys(self, spec: BackendSpec, make_storage: MakeStorage, key_dtype: str) -> None:
        _skip_unless_key_dtype(spec, key_dtype)
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
