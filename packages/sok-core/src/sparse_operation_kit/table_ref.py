"""The bridge from a Storage to sok-core's TensorFlow ops: a ``sok_table_ref`` struct in memory.

The ops receive the struct's address (an int64 scalar) and call the backend through the function
table in it (``sok/table_ref.h``). The struct lives as long as this object; its storage can be
swapped (:meth:`TableRef.swap`) while traced graphs keep using the same address.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

from sparse_operation_kit.dtypes import KEY_DTYPES
from sparse_operation_kit.initializers import Initializer
from sparse_operation_kit.plugins.registry import capsule_pointer, import_path
from sparse_operation_kit.storage import Storage

#: "SOKTABLE", as SOK_TABLE_REF_MAGIC in sok/table_ref.h.
TABLE_REF_MAGIC = 0x534F4B5441424C45


class _CInitializer(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_int32),
        ("col_begin", ctypes.c_int32),
        ("col_end", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
        ("a", ctypes.c_double),
        ("b", ctypes.c_double),
        ("seed", ctypes.c_uint64),
    ]


class _CTableRef(ctypes.Structure):
    _fields_ = [
        ("magic", ctypes.c_uint64),
        ("api", ctypes.c_void_p),
        ("storage", ctypes.c_void_p),
        ("key_type", ctypes.c_int32),
        ("row_width", ctypes.c_int32),
        ("inits", ctypes.POINTER(_CInitializer)),
        ("num_inits", ctypes.c_int32),
    ]


def native_pointers(storage: Storage) -> tuple[int, int]:
    """``(api, storage)`` addresses of a storage of a native backend; TypeError for others."""
    table = storage.table
    c_api = storage.spec.c_api
    if c_api is None or not hasattr(table, "handle_capsule"):
        raise TypeError(
            f"backend {storage.spec.name!r} (var_type {storage.var_type!r}) has no C ABI, so TensorFlow ops "
            f"cannot drive it; use a native backend such as 'hbm' or 'hybrid'"
        )
    api = capsule_pointer(import_path(c_api)(), b"sok_storage_api")
    handle = capsule_pointer(table.handle_capsule(), b"sok_storage")
    return api, handle


class TableRef:
    """A ``sok_table_ref`` for ``storage``, whose new rows the ops fill with ``initializers`` (by
    default the storage's own); :attr:`address` goes to the ops."""

    def __init__(self, storage: Storage, initializers: Sequence[Initializer] | None = None) -> None:
        self._struct = _CTableRef()
        self.storage: Storage
        self.initializers: tuple[Initializer, ...] = ()
        self._inits = (_CInitializer * 0)()
        self.swap(storage, initializers)

    def swap(self, storage: Storage, initializers: Sequence[Initializer] | None = None) -> None:
        """Point the reference at ``storage`` (same key dtype; a wider row is fine)."""
        api, handle = native_pointers(storage)
        initializers = tuple(storage.initializers if initializers is None else initializers)
        array = (_CInitializer * max(1, len(initializers)))()
        for slot, init in zip(array, initializers, strict=False):
            kind, begin, end, a, b, seed = init.resolve(storage.row_width)
            slot.kind, slot.col_begin, slot.col_end, slot.a, slot.b, slot.seed = kind, begin, end, a, b, seed
        # Keep the table and the initializers alive as long as the reference points at them.
        self.storage, self.initializers, self._inits = storage, initializers, array
        self._struct.api = api
        self._struct.storage = handle
        self._struct.key_type = KEY_DTYPES.index(storage.key_dtype.name)
        self._struct.row_width = storage.row_width
        self._struct.inits = array
        self._struct.num_inits = len(initializers)
        self._struct.magic = TABLE_REF_MAGIC

    @property
    def address(self) -> int:
        return ctypes.addressof(self._struct)

    def release(self) -> None:
        """Mark the reference dead: ops that still hold its address fail cleanly."""
        self._struct.magic = 0

    def __del__(self) -> None:
        self.release()
