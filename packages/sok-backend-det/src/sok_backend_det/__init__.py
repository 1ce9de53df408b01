"""det: the dynamic embedding table of SparseOperationKit, var_type ``"hbm"``.

A growing open-addressing hash table; all rows in one memory (device memory on a GPU, host memory
on the CPU). Every 64-bit key value is valid. Use it through ``sparse_operation_kit``:

Example::

    >>> from sparse_operation_kit.storage import create_storage
    >>> table = create_storage("hbm", row_width=16, init_capacity=1 << 20)

Its native module ``sok_backend_det._core`` exports the C ABI (``storage_api()``), which sok-core's
binding drives; importing this package does not load it.
"""

from sparse_operation_kit.plugins import package_version

__version__ = package_version("sok-backend-det")
