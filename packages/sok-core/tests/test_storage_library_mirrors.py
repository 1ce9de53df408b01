"""The ctypes mirrors of the storage C ABI's structs (``sparse_operation_kit.testing.storage_library``,
which the backends' library tests drive) have the fields of ``sok/storage_api.h``, in order."""

from __future__ import annotations

import ctypes

from sparse_operation_kit.testing.abi_fields import struct_fields
from sparse_operation_kit.testing.storage_library import Config, Context


def test_config_mirrors_sok_storage_config():
    assert tuple(name for name, _ in Config._fields_) == struct_fields("sok_storage_config")


def test_context_mirrors_sok_exec_context():
    assert tuple(name for name, _ in Context._fields_) == struct_fields("sok_exec_context")
    assert ctypes.sizeof(Context) == 16  # two int32 and a pointer


def test_an_unknown_struct_is_refused_by_name():
    try:
        struct_fields("sok_no_such_struct")
    except ValueError as error:
        assert "sok_no_such_struct" in str(error)
    else:
        raise AssertionError("struct_fields accepted a struct the header does not declare")
