"""hkv: the embedding table with eviction of SparseOperationKit, var_type ``"hybrid"``.

A bucketed hash table with per-key scores: it grows up to ``max_capacity`` and then evicts the
lowest-score row of a full bucket (policies lru, lfu, epoch_lru, epoch_lfu, custom). On a GPU,
rows past ``max_hbm_for_vectors`` GB live in pinned host memory. Use it through
``sparse_operation_kit``:

Example::

    >>> from sparse_operation_kit.storage import create_storage
    >>> table = create_storage("hybrid", row_width=16, init_capacity=1024, max_capacity=1 << 20,
    ...                        evict_strategy="lfu")

Its native module ``sok_backend_hkv._core`` exports the C ABI (``storage_api()``), which sok-core's
binding drives; importing this package does not load it.
"""

from sparse_operation_kit.plugins import package_version

__version__ = package_version("sok-backend-hkv")
