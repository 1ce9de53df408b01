"""hkv's storage as a plain shared library: ``libsok_hkv_storage.so`` beside the Python module, for
processes with no Python (sok-hps's C++ server, which reaches it by ``dlopen``).

The library's C entry point ``sok_hkv_storage_api()`` must give the very function table the module's
capsule holds (one implementation, the module linking the library), and a table made through it
must store, evict and find rows with no Python in the calls.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest
import sok_backend_hkv
from sok_backend_hkv import _core

LIBRARY = os.path.join(os.path.dirname(sok_backend_hkv.__file__), "libsok_hkv_storage.so")


def entry_point() -> int:
    library = ctypes.CDLL(LIBRARY)
    library.sok_hkv_storage_api.restype = ctypes.c_void_p
    library.sok_hkv_storage_api.argtypes = []
    return library.sok_hkv_storage_api()


def capsule_pointer() -> int:
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype = ctypes.c_void_p
    get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return get_pointer(_core.storage_api(), b"sok_storage_api")


class Config(ctypes.Structure):
    _fields_ = [  # sok_storage_config
        ("struct_size", ctypes.c_uint32),
        ("key_type", ctypes.c_int32),
        ("row_width", ctypes.c_int32),
        ("device_type", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
        ("num_options", ctypes.c_int32),
        ("option_names", ctypes.POINTER(ctypes.c_char_p)),
        ("option_values", ctypes.POINTER(ctypes.c_char_p)),
    ]


class Context(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32), ("stream", ctypes.c_void_p)]


_status, _handle, _pointer = ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p


class Api(ctypes.Structure):
    """The first fields of sok_storage_api (sok/storage_api.h), as far as insert_or_assign."""

    _fields_ = [
        ("api_version", ctypes.c_uint32),
        ("struct_size", ctypes.c_uint32),
        ("backend_name", ctypes.c_char_p),
        ("create", ctypes.CFUNCTYPE(_status, ctypes.POINTER(Config), ctypes.POINTER(_handle))),
        ("destroy", ctypes.CFUNCTYPE(None, _handle)),
        ("last_error", ctypes.CFUNCTYPE(ctypes.c_char_p, _handle)),
        ("size", ctypes.CFUNCTYPE(_status, _handle, ctypes.POINTER(Context), ctypes.POINTER(ctypes.c_int64))),
        ("capacity", ctypes.CFUNCTYPE(_status, _handle, ctypes.POINTER(ctypes.c_int64))),
        ("find", ctypes.CFUNCTYPE(
            _status, _handle, ctypes.POINTER(Context), ctypes.c_int64, _pointer, ctypes.c_int32, ctypes.c_int32,
            _pointer, _pointer, _pointer,
        )),
        ("find_or_insert", ctypes.CFUNCTYPE(_status)),  # placeholder: only its place in the table matters here
        ("insert_or_assign", ctypes.CFUNCTYPE(
            _status, _handle, ctypes.POINTER(Context), ctypes.c_int64, _pointer, ctypes.c_int32, ctypes.c_int32,
            _pointer, _pointer, _pointer, ctypes.c_int32,
        )),
    ]  # fmt: skip


def test_the_library_is_installed_beside_the_module():
    assert os.path.exists(LIBRARY), os.listdir(os.path.dirname(LIBRARY))


def test_its_entry_point_gives_the_function_table_of_the_modules_capsule():
    assert entry_point() == capsule_pointer()


def test_its_table_names_the_backend_and_version_of_the_capsule():
    library, capsule = Api.from_address(entry_point()), Api.from_address(capsule_pointer())
    assert library.backend_name == capsule.backend_name == b"hkv"
    assert library.api_version == capsule.api_version == _core.BUILD_INFO["api_version"]
    assert library.struct_size == capsule.struct_size


@pytest.fixture
def api() -> Api:
    return Api.from_address(entry_point())


CPU = Context(0, 0, None)
WIDTH = 3


def create(api: Api, **options: str) -> ctypes.c_void_p:
    """A CPU table of int64 keys and WIDTH floats a row, with hkv's options as the C ABI's strings."""
    names = (ctypes.c_char_p * len(options))(*(name.encode() for name in options))
    values = (ctypes.c_char_p * len(options))(*(value.encode() for value in options.values()))
    config = Config(ctypes.sizeof(Config), 0, WIDTH, 0, 0, len(options), names, values)
    table = ctypes.c_void_p()
    assert api.create(ctypes.byref(config), ctypes.byref(table)) == 0, api.last_error(None)
    return table


def rows_of(keys: np.ndarray) -> np.ndarray:
    """Each key's row, told apart from every other key's: (n, WIDTH)."""
    return np.stack([keys, keys + 0.5, -keys], axis=1).astype(np.float32)


def insert_or_assign(api: Api, table: ctypes.c_void_p, keys: np.ndarray) -> None:
    rows = rows_of(keys)
    done = api.insert_or_assign(table, CPU, len(keys), keys.ctypes.data, 0, WIDTH, rows.ctypes.data, None, None, 0)
    assert done == 0, api.last_error(table)


def find(api: Api, table: ctypes.c_void_p, keys: np.ndarray, default: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    values = np.empty((len(keys), WIDTH), np.float32)
    found = np.empty(len(keys), np.uint8)
    done = api.find(table, CPU, len(keys), keys.ctypes.data, 0, WIDTH, values.ctypes.data, default.ctypes.data,
                    found.ctypes.data)  # fmt: skip
    assert done == 0, api.last_error(table)
    return values, found


def size_and_capacity(api: Api, table: ctypes.c_void_p) -> tuple[int, int]:
    size, capacity = ctypes.c_int64(), ctypes.c_int64()
    assert api.size(table, CPU, ctypes.byref(size)) == 0, api.last_error(table)
    assert api.capacity(table, ctypes.byref(capacity)) == 0, api.last_error(table)
    return size.value, capacity.value


def test_a_table_made_through_the_entry_point_finds_what_it_stored(api):
    """create, insert_or_assign, find (a miss reads the default row), destroy."""
    table = create(api, init_capacity="128", max_capacity="256", evict_strategy="lru")
    try:
        keys = np.array([5, -7, 1 << 40], np.int64)
        insert_or_assign(api, table, keys)
        default = np.full(WIDTH, 0.25, np.float32)
        values, found = find(api, table, np.array([1 << 40, 6, 5], np.int64), default)
        rows = rows_of(keys)
        np.testing.assert_array_equal(values, np.stack([rows[2], default, rows[0]]))
        np.testing.assert_array_equal(found, [1, 0, 1])
        assert size_and_capacity(api, table) == (3, 128)
    finally:
        api.destroy(table)


def test_inserting_beyond_max_capacity_evicts_and_keeps_the_rows_of_the_keys_left(api):
    """lru at max_capacity: the table grows to max_capacity, then evicts; every key it still holds
    reads the row written for it, and the keys found are as many as its size."""
    table = create(api, init_capacity="128", max_capacity="256", evict_strategy="lru")
    try:
        written = np.arange(1, 1025, dtype=np.int64)  # 4x max_capacity, in batches of 128
        for batch in np.split(written, 8):
            insert_or_assign(api, table, batch)
        size, capacity = size_and_capacity(api, table)
        assert capacity == 256
        assert 0 < size <= capacity
        default = np.full(WIDTH, np.nan, np.float32)
        values, found = find(api, table, written, default)
        hits = found.astype(bool)
        assert hits.sum() == size
        np.testing.assert_array_equal(values[hits], rows_of(written[hits]))
        assert np.isnan(values[~hits]).all()  # the evicted keys read the default row
    finally:
        api.destroy(table)
