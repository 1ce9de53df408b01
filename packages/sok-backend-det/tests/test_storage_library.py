"""det's storage as a plain shared library: ``libsok_det_storage.so`` beside the Python module, for
processes with no Python (sok-hps's C++ server, which reaches it by ``dlopen``).

The library's C entry point ``sok_det_storage_api()`` must give the very function table the module's
capsule holds (one implementation, the module linking the library), and a table made through it
must store and find rows with no Python in the calls.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np
import sok_backend_det
from sok_backend_det import _core
from sparse_operation_kit.testing.abi_fields import field_offset

LIBRARY = os.path.join(os.path.dirname(sok_backend_det.__file__), "libsok_det_storage.so")


def entry_point() -> ctypes.c_void_p:
    library = ctypes.CDLL(LIBRARY)
    library.sok_det_storage_api.restype = ctypes.c_void_p
    library.sok_det_storage_api.argtypes = []
    return library.sok_det_storage_api()


def test_the_library_is_installed_beside_the_module():
    assert os.path.exists(LIBRARY), os.listdir(os.path.dirname(LIBRARY))


def test_its_entry_point_gives_the_function_table_of_the_modules_capsule():
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype = ctypes.c_void_p
    get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    assert entry_point() == get_pointer(_core.storage_api(), b"sok_storage_api")


class Config(ctypes.Structure):
    _fields_ = [  # sok_storage_config
        ("struct_size", ctypes.c_uint32),
        ("key_type", ctypes.c_int32),
        ("row_width", ctypes.c_int32),
        ("device_type", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
        ("num_options", ctypes.c_int32),
        ("option_names", ctypes.c_void_p),
        ("option_values", ctypes.c_void_p),
    ]


class Context(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32), ("stream", ctypes.c_void_p)]


def function(api: int, name: str, restype: object, *argtypes: object) -> object:
    """The function field ``name`` of the function table at ``api``, found where ``sok/storage_api.h``
    places it (``abi_fields``)."""
    return ctypes.CFUNCTYPE(restype, *argtypes)(ctypes.c_void_p.from_address(api + field_offset(name)).value)


def test_a_table_made_through_the_entry_point_finds_what_it_stored():
    """create, insert_or_assign, find (a miss reads the default row), destroy, called through ctypes."""
    status, handle, pointer = ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p
    address = entry_point()
    create = function(address, "create", status, ctypes.POINTER(Config), ctypes.POINTER(handle))
    destroy = function(address, "destroy", None, handle)
    last_error = function(address, "last_error", ctypes.c_char_p, handle)
    rows_call = (status, handle, ctypes.POINTER(Context), ctypes.c_int64, pointer, ctypes.c_int32, ctypes.c_int32)
    find = function(address, "find", *rows_call, pointer, pointer, pointer)
    insert_or_assign = function(address, "insert_or_assign", *rows_call, pointer, pointer, pointer, ctypes.c_int32)
    backend_name = ctypes.c_char_p.from_address(address + 8).value  # after api_version and struct_size

    assert backend_name == b"det"
    config = Config(ctypes.sizeof(Config), 0, 3, 0, 0, 0, None, None)  # int64 keys, width 3, CPU
    table = handle()
    assert create(ctypes.byref(config), ctypes.byref(table)) == 0, last_error(None)
    try:
        cpu = Context(0, 0, None)
        keys = np.array([5, -7, 1 << 40], np.int64)
        rows = np.arange(9, dtype=np.float32).reshape(3, 3)
        done = insert_or_assign(table, cpu, 3, keys.ctypes.data, 0, 3, rows.ctypes.data, None, None, 0)
        assert done == 0, last_error(table)
        asked = np.array([1 << 40, 6, 5], np.int64)
        values = np.empty((3, 3), np.float32)
        default = np.full(3, 0.5, np.float32)
        found = np.empty(3, np.uint8)
        done = find(table, cpu, 3, asked.ctypes.data, 0, 3, values.ctypes.data, default.ctypes.data, found.ctypes.data)
        assert done == 0, last_error(table)
        np.testing.assert_array_equal(values, np.stack([rows[2], default, rows[0]]))
        np.testing.assert_array_equal(found, [1, 0, 1])
    finally:
        destroy(table)
