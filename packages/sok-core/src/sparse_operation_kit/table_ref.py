"""The bridge from a Storage to sok-core's TensorFlow ops: a ``sok_table_ref`` struct in memory.

The ops receive the struct's address (an int64 scalar) and call the backend through the function
table in it (``sok/table_ref.h``). The struct is built by sok-core's binding of the C ABI
(``sparse_operation_kit._table.TableRef``, C++ compiled against the header, so no Python mirror of
its layout exists) and lives as long as this object; its storage can be swapped
(:meth:`TableRef.swap`) while traced graphs keep using the same address. The function table is the
one the registry loaded and checked for the backend (:meth:`BackendRegistry.load`), not imported
again here.
"""

from __future__ import annotations

from collections.abc import Sequence

from sparse_operation_kit import _table
from sparse_operation_kit.dtypes import KEY_DTYPES
from sparse_operation_kit.initializers import Initializer
from sparse_operation_kit.plugins.registry import capsule_pointer, get_registry
from sparse_operation_kit.storage import Storage


def native_pointers(storage: Storage) -> tuple[int, int]:
    """``(api, storage)`` addresses of a storage of a native backend; TypeError for others."""
    table = storage.table
    if storage.spec.c_api is None or not hasattr(table, "handle_capsule"):
        raise TypeError(
            f"backend {storage.spec.name!r} (var_type {storage.var_type!r}) has no C ABI, so TensorFlow ops "
            f"cannot drive it; use a native backend such as 'hbm' or 'hybrid'"
        )
    api = get_registry().load(storage.var_type).api_address
    handle = capsule_pointer(table.handle_capsule(), b"sok_storage")
    return api, handle


class TableRef:
    """A ``sok_table_ref`` for ``storage``, whose new rows the ops fill with ``initializers`` (by
    default the storage's own); :attr:`address` goes to the ops."""

    def __init__(self, storage: Storage, initializers: Sequence[Initializer] | None = None) -> None:
        self._ref = _table.TableRef()
        self.storage: Storage
        self.initializers: tuple[Initializer, ...] = ()
        self.swap(storage, initializers)

    def swap(self, storage: Storage, initializers: Sequence[Initializer] | None = None) -> None:
        """Point the reference at ``storage`` (same key dtype; a wider row is fine)."""
        api, handle = native_pointers(storage)
        initializers = tuple(storage.initializers if initializers is None else initializers)
        resolved = [init.resolve(storage.row_width) for init in initializers]
        self._ref.point(api, handle, KEY_DTYPES.index(storage.key_dtype.name), storage.row_width, resolved)
        # Keep the table alive as long as the reference points at it.
        self.storage, self.initializers = storage, initializers

    @property
    def address(self) -> int:
        return self._ref.address

    def release(self) -> None:
        """Mark the reference dead: ops that still hold its address fail cleanly."""
        self._ref.release()

    def __del__(self) -> None:
        self.release()
