"""Type stub of the native extension (sok-core's sok/kit/module.hpp): the backend's C ABI and build
facts; its tables are sok-core's ``sparse_operation_kit._table.Table`` over :func:`storage_api`."""

from typing import Any

__all__ = ["BUILD_INFO", "storage_api"]

BUILD_INFO: dict[str, Any]

def storage_api() -> Any:
    """The ``sok_storage_api`` function table as a PyCapsule."""
