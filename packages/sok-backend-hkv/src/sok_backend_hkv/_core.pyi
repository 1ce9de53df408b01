"""Type stub of the native extension, built from sok-core's sok/python_table.hpp."""

from typing import Any

from sparse_operation_kit.storage import NativeTable as Table

__all__ = ["BUILD_INFO", "Table", "storage_api"]

BUILD_INFO: dict[str, Any]

def storage_api() -> Any:
    """The ``sok_storage_api`` function table as a PyCapsule."""
