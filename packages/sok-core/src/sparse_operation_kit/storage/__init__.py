"""Storages: one embedding-table shard in one process, over any backend.

:func:`create_storage` picks the backend by ``var_type`` through the registry and returns a
:class:`Storage`, which turns what the user gives (lists, arrays of other dtypes, slices, numbers)
into what every table takes and then calls the backend's *table*. A table follows the protocol
:class:`Table` (arrays in, caller-allocated arrays out); native backends' tables are sok-core's
binding of the C ABI (``sparse_operation_kit._table``), and a pure-Python backend implements the
protocol directly.

Intake, one owner per check:

- this facade: conversions (lists and other integer dtypes to the key dtype, with the values that
  do not fit named; values to float32; ``columns`` as a slice or pair; initializers; the outputs it
  allocates) and the checks of what it converts (shapes of the user's arrays, the column range
  against the row, offsets), which are all a pure-Python table gets; where a backend can put
  tables (``Capabilities.devices``, declared by the backend);
- the binding (``csrc/table/py_table.hpp``): Python objects to (pointer, count): dtype, C order,
  writability, device and stream of each array (NumPy, ``__cuda_array_interface__``, ``__dlpack__``:
  read there and nowhere else) and the matching lengths of the arrays of one call;
- the ABI adapter (``sok/kit/abi_adapter.hpp``) of a first-party backend: the semantic checks of
  every C ABI call, whoever the caller (counts, column ranges, initializers, scores against the
  eviction policy, the execution context's device).

A row holds ``row_width`` floats: ``[embedding | optimizer state]``. Reads and writes name a
column range (``columns=(begin, end)``, default the whole row) so a lookup never touches optimizer
state. Every value of the key dtype is a valid key.

A storage lives on the CPU (the default) or on a GPU: ``create_storage(..., device="cuda:0")``
returns a :class:`CudaStorage`, whose methods take NumPy arrays, lists or device arrays (CuPy,
Torch CUDA tensors, anything with ``__cuda_array_interface__`` or ``__dlpack__``) and need CuPy.

Example::

    >>> import numpy as np
    >>> from sparse_operation_kit.storage import create_storage
    >>> s = create_storage("hbm", row_width=4, initializer="13")
    >>> values, found = s.find_or_insert(np.array([0, 1, 2**40]))
    >>> values[:, 0], found, s.size()
    (array([13., 13., 13.], dtype=float32), array([False, False, False]), 3)
"""

from __future__ import annotations

from sparse_operation_kit.storage.create import create_storage
from sparse_operation_kit.storage.cuda import CudaStorage
from sparse_operation_kit.storage.facade import Storage
from sparse_operation_kit.storage.table import MAX_ROW_WIDTH, NativeTable, Table

__all__ = ["MAX_ROW_WIDTH", "CudaStorage", "NativeTable", "Storage", "Table", "create_storage"]
