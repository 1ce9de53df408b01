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

__all__ = ["field_offset", "function_fields", "struct_fields"]


@functools.cache
def _struct_body(name: str) -> str | None:
    """The body of ``typedef struct <name> { ... } <name>;`` in ``sok/storage_api.h`` without its
    comments, or None where the header declares no such struct."""
    header = Path(sparse_operation_kit.get_include(), "sok", "storage_api.h").read_text()
    match = re.search(rf"typedef struct {name} \{{(.*?)\}} {name};", header, re.S)
    return None if match is None else re.sub(r"/\*.*?\*/", "", match.group(1), flags=re.S)


@functools.cache
def function_fields() -> tuple[str, ...]:
    """The function-pointer fields of ``sok_storage_api`` in declaration order."""
    body = _struct_body("sok_storage_api")
    if body is None:
        raise RuntimeError("storage_api.h declares no `typedef struct sok_storage_api { ... } sok_storage_api;`")
    return tuple(re.findall(r"\(\*(\w+)\)\s*\(", body))


def struct_fields(name: str) -> tuple[str, ...]:
    """The field names of ``typedef struct <name> { ... } <name>;`` in ``sok/storage_api.h``, in
    order: what a ``ctypes`` mirror of the struct must list (``testing.storage_library``)."""
    body = _struct_body(name)
    if body is None:
        raise ValueError(f"storage_api.h declares no `typedef struct {name} {{ ... }} {name};`")
    return tuple(re.findall(r"(\w+)\s*;", body))


def field_offset(name: str) -> int:
    """The byte offset of function field ``name`` in ``sok_storage_api`` (two uint32 fields and the
    backend name's pointer come first; every function pointer is one pointer wide)."""
    fields = function_fields()
    if name not in fields:
        raise ValueError(f"sok_storage_api has no function field {name!r}; it has {', '.join(fields)}")
    word = ctypes.sizeof(ctypes.c_void_p)
    return 8 + word + fields.index(name) * word
