"""Type stub of sok-core's binding of the storage C ABI (csrc/table/module.cpp)."""

from typing import Any

from sparse_operation_kit.storage import InitTuple, NativeTable

__all__ = ["WITH_CUDA", "Table", "TableRef", "cuda_device_count"]

#: Whether this build reads CUDA device arrays (built where a CUDA toolkit was found).
WITH_CUDA: bool

class Table(NativeTable):
    """A storage of the backend whose ``sok_storage_api`` capsule is ``api``."""

    def __init__(
        self, api: Any, key_dtype: str, row_width: int, options: dict[str, str], device: str = "cpu"
    ) -> None: ...

class TableRef:
    """A ``sok_table_ref`` (``sok/table_ref.h``) for the TensorFlow ops."""

    address: int

    def point(self, api: int, storage: int, key_type: int, row_width: int, inits: list[InitTuple]) -> None: ...
    def release(self) -> None: ...

def cuda_device_count() -> int:
    """The CUDA devices this process sees (0 in CPU builds)."""
