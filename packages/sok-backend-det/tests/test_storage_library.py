"""det's storage as a plain shared library: ``libsok_det_storage.so`` beside the Python module, for
processes with no Python (sok-hps's C++ server, which reaches it by ``dlopen``).

The library's C entry point ``sok_det_storage_api()`` must give the very function table the module's
capsule holds (one implementation, the module linking the library), and a table made through it
must store and find rows with no Python in the calls.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import sok_backend_det
from sok_backend_det import _core
from sparse_operation_kit.testing.storage_library import StorageLibrary, capsule_address

LIBRARY = os.path.join(os.path.dirname(sok_backend_det.__file__), "libsok_det_storage.so")
WIDTH = 3


@pytest.fixture
def library() -> StorageLibrary:
    return StorageLibrary(LIBRARY, "sok_det_storage_api")


def test_the_library_is_installed_beside_the_module():
    assert os.path.exists(LIBRARY), os.listdir(os.path.dirname(LIBRARY))


def test_its_entry_point_gives_the_function_table_of_the_modules_capsule(library):
    assert library.address == capsule_address(_core)
    assert library.backend_name == b"det"
    assert library.api_version == _core.BUILD_INFO["api_version"]


def test_a_table_made_through_the_entry_point_finds_what_it_stored(library):
    """create, insert_or_assign, find (a miss reads the default row), destroy, called through ctypes."""
    table = library.create(WIDTH)
    try:
        keys = np.array([5, -7, 1 << 40], np.int64)
        rows = np.arange(9, dtype=np.float32).reshape(3, WIDTH)
        library.insert_or_assign(table, keys, rows)
        default = np.full(WIDTH, 0.5, np.float32)
        values, found = library.find(table, np.array([1 << 40, 6, 5], np.int64), WIDTH, default)
        np.testing.assert_array_equal(values, np.stack([rows[2], default, rows[0]]))
        np.testing.assert_array_equal(found, [1, 0, 1])
    finally:
        library.destroy(table)
