"""A backend's storage library (``lib<name>.so``, its C entry point returning the function table of
``sok/storage_api.h``) driven through ``ctypes``, with no Python module of the backend in the calls:
what a process with no Python (sok-hps's C++ server) does with det's and hkv's libraries.

``Config`` and ``Context`` mirror ``sok_storage_config`` and ``sok_exec_context`` (sok-core's tests
hold them to the header's fields, ``abi_fields.struct_fields``); the functions are found by name
where the header places them (:mod:`.abi_fields`).

Example::

    library = StorageLibrary(path_to_libsok_det_storage_so, "sok_det_storage_api")
    table = library.create(width=3, init_capacity="128")
    library.insert_or_assign(table, keys, rows)
    values, found = library.find(table, keys, width=3, default=np.zeros(3, np.float32))
    library.destroy(table)
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from sparse_operation_kit.testing.abi_fields import field_offset

__all__ = ["CPU", "Config", "Context", "StorageLibrary", "capsule_address"]

_status, _handle, _pointer = ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p


class Config(ctypes.Structure):
    """``sok_storage_config``."""

    _fields_ = [
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
    """``sok_exec_context``."""

    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32), ("stream", ctypes.c_void_p)]


CPU = Context(0, 0, None)  # SOK_DEVICE_CPU


def capsule_address(core: Any) -> int:
    """The function table's address in a backend module's capsule (``core.storage_api()``)."""
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype = ctypes.c_void_p
    get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return get_pointer(core.storage_api(), b"sok_storage_api")


class StorageLibrary:
    """The library at ``path``, its table from the entry point ``symbol``; int64 keys, CPU calls."""

    def __init__(self, path: str, symbol: str) -> None:
        library = ctypes.CDLL(path)
        entry = getattr(library, symbol)
        entry.restype = ctypes.c_void_p
        entry.argtypes = []
        self.address: int = entry()
        self.api_version = ctypes.c_uint32.from_address(self.address).value
        self.struct_size = ctypes.c_uint32.from_address(self.address + 4).value
        self.backend_name = ctypes.c_char_p.from_address(self.address + 8).value
        context = ctypes.POINTER(Context)
        rows_call = (_status, _handle, context, ctypes.c_int64, _pointer, ctypes.c_int32, ctypes.c_int32)
        self._create = self.function("create", _status, ctypes.POINTER(Config), ctypes.POINTER(_handle))
        self._destroy = self.function("destroy", None, _handle)
        self._last_error = self.function("last_error", ctypes.c_char_p, _handle)
        self._size = self.function("size", _status, _handle, context, ctypes.POINTER(ctypes.c_int64))
        self._capacity = self.function("capacity", _status, _handle, ctypes.POINTER(ctypes.c_int64))
        self._find = self.function("find", *rows_call, _pointer, _pointer, _pointer)
        self._insert = self.function("insert_or_assign", *rows_call, _pointer, _pointer, _pointer, ctypes.c_int32)

    def function(self, name: str, restype: Any, *argtypes: Any) -> Any:
        """The function field ``name`` of the table, as a ``ctypes`` function."""
        pointer = ctypes.c_void_p.from_address(self.address + field_offset(name)).value
        return ctypes.CFUNCTYPE(restype, *argtypes)(pointer)

    def create(self, width: int, **options: str) -> ctypes.c_void_p:
        """A CPU table of int64 keys and ``width`` floats a row, with the backend's options."""
        names = (ctypes.c_char_p * len(options))(*(name.encode() for name in options))
        values = (ctypes.c_char_p * len(options))(*(value.encode() for value in options.values()))
        config = Config(ctypes.sizeof(Config), 0, width, 0, 0, len(options), names, values)
        table = ctypes.c_void_p()
        assert self._create(ctypes.byref(config), ctypes.byref(table)) == 0, self._last_error(None)
        return table

    def destroy(self, table: ctypes.c_void_p) -> None:
        self._destroy(table)

    def insert_or_assign(self, table: ctypes.c_void_p, keys: np.ndarray, rows: np.ndarray) -> None:
        keys, rows = np.ascontiguousarray(keys, np.int64), np.ascontiguousarray(rows, np.float32)
        width = rows.shape[1]
        done = self._insert(table, CPU, len(keys), keys.ctypes.data, 0, width, rows.ctypes.data, None, None, 0)
        assert done == 0, self._last_error(table)

    def find(
        self, table: ctypes.c_void_p, keys: np.ndarray, width: int, default: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(values [n, width], found [n])``: a miss reads ``default``."""
        keys, default = np.ascontiguousarray(keys, np.int64), np.ascontiguousarray(default, np.float32)
        values = np.empty((len(keys), width), np.float32)
        found = np.empty(len(keys), np.uint8)
        arrays = (keys.ctypes.data, 0, width, values.ctypes.data, default.ctypes.data, found.ctypes.data)
        done = self._find(table, CPU, len(keys), *arrays)
        assert done == 0, self._last_error(table)
        return values, found

    def size_and_capacity(self, table: ctypes.c_void_p) -> tuple[int, int]:
        size, capacity = ctypes.c_int64(), ctypes.c_int64()
        assert self._size(table, CPU, ctypes.byref(size)) == 0, self._last_error(table)
        assert self._capacity(table, ctypes.byref(capacity)) == 0, self._last_error(table)
        return size.value, capacity.value
