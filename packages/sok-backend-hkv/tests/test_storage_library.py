"""hkv's storage as a plain shared library: ``libsok_hkv_storage.so`` beside the Python module, for
processes with no Python (sok-hps's C++ server, which reaches it by ``dlopen``).

The library's C entry point ``sok_hkv_storage_api()`` must give the very function table the module's
capsule holds (one implementation, the module linking the library), and a table made through it
must store, evict and find rows with no Python in the calls.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import sok_backend_hkv
from sok_backend_hkv import _core
from sparse_operation_kit.testing.storage_library import StorageLibrary, capsule_address

LIBRARY = os.path.join(os.path.dirname(sok_backend_hkv.__file__), "libsok_hkv_storage.so")
WIDTH = 3
OPTIONS = {"init_capacity": "128", "max_capacity": "256", "evict_strategy": "lru"}


@pytest.fixture
def library() -> StorageLibrary:
    return StorageLibrary(LIBRARY, "sok_hkv_storage_api")


def rows_of(keys: np.ndarray) -> np.ndarray:
    """Each key's row, told apart from every other key's: (n, WIDTH)."""
    return np.stack([keys, keys + 0.5, -keys], axis=1).astype(np.float32)


def test_the_library_is_installed_beside_the_module():
    assert os.path.exists(LIBRARY), os.listdir(os.path.dirname(LIBRARY))


def test_its_entry_point_gives_the_function_table_of_the_modules_capsule(library):
    assert library.address == capsule_address(_core)
    assert library.backend_name == b"hkv"
    assert library.api_version == _core.BUILD_INFO["api_version"]


def test_a_table_made_through_the_entry_point_finds_what_it_stored(library):
    """create, insert_or_assign, find (a miss reads the default row), destroy."""
    table = library.create(WIDTH, **OPTIONS)
    try:
        keys = np.array([5, -7, 1 << 40], np.int64)
        library.insert_or_assign(table, keys, rows_of(keys))
        default = np.full(WIDTH, 0.25, np.float32)
        values, found = library.find(table, np.array([1 << 40, 6, 5], np.int64), WIDTH, default)
        rows = rows_of(keys)
        np.testing.assert_array_equal(values, np.stack([rows[2], default, rows[0]]))
        np.testing.assert_array_equal(found, [1, 0, 1])
        assert library.size_and_capacity(table) == (3, 128)
    finally:
        library.destroy(table)


def test_inserting_beyond_max_capacity_evicts_and_keeps_the_rows_of_the_keys_left(library):
    """lru at max_capacity: the table grows to max_capacity, then evicts; every key it still holds
    reads the row written for it, and the keys found are as many as its size."""
    table = library.create(WIDTH, **OPTIONS)
    try:
        written = np.arange(1, 1025, dtype=np.int64)  # 4x max_capacity, in batches of 128
        for batch in np.split(written, 8):
            library.insert_or_assign(table, batch, rows_of(batch))
        size, capacity = library.size_and_capacity(table)
        assert capacity == 256
        assert 0 < size <= capacity
        values, found = library.find(table, written, WIDTH, np.full(WIDTH, np.nan, np.float32))
        hits = found.astype(bool)
        assert hits.sum() == size
        np.testing.assert_array_equal(values[hits], rows_of(written[hits]))
        assert np.isnan(values[~hits]).all()  # the evicted keys read the default row
    finally:
        library.destroy(table)
