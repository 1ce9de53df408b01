"""Type stub of sok-core's binding of the storage C ABI (csrc/table/module.cpp)."""

from typing import Any

from sparse_operation_kit.storage import InitTuple, NativeTable

__all__ = ["EXPORT_CHUNK_BYTES", "WITH_CUDA", "Table", "TableRef", "cuda_device_count", "export_chunk_slots"]

#: Bytes of output rows (key, values, score) one batched export call is sized for (sok/kit/export.hpp).
EXPORT_CHUNK_BYTES: int

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

def export_chunk_slots(row_bytes: int) -> int:
    """Slots one export call scans for rows of ``row_bytes`` bytes: the one export chunk size."""
