"""Where each field of the storage C ABI's function table lies, read from ``sok/storage_api.h``.

Tests that drive a backend's function table through ``ctypes`` (a field replaced, a struct_size cut
short) find a field by its name here, so that a field appended to the header moves no test's
arithmetic.

Example::

    offset = field_offset("insert_or_assign_hinted")
    hinted = ctypes.c_void_p.from_address(api + offset).value
"""

from __future__ import annotations

import ctypes
import functools
import re
from pathlib import Path

import sparse_operation_kit

__all__ = ["field_offset", "function_fields"]


@functools.cache
def function_fields() -> tuple[str, ...]:
    """The function-pointer fields of ``sok_storage_api`` in declaration order."""
    header = Path(sparse_operation_kit.get_include(), "sok", "storage_api.h").read_text()
    match = re.search(r"typedef struct sok_storage_api \{(.*?)\} sok_storage_api;", header, re.S)
    if match is None:
        raise RuntimeError("storage_api.h declares no `typedef struct sok_storage_api { ... } sok_storage_api;`")
    body = re.sub(r"/\*.*?\*/", "", match.group(1), flags=re.S)
    return tuple(re.findall(r"\(\*(\w+)\)\s*\(", body))


def field_offset(name: str) -> int:
    """The byte offset of function field ``name`` in ``sok_storage_api`` (two uint32 fields and the
    backend name's pointer come first; every function pointer is one pointer wide)."""
    fields = function_fields()
    if name not in fields:
        raise ValueError(f"sok_storage_api has no function field {name!r}; it has {', '.join(fields)}")
    word = ctypes.sizeof(ctypes.c_void_p)
    return 8 + word + fields.index(name) * word
