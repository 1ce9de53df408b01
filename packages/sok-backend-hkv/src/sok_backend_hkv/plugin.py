"""Registers the hkv backend with sok-core (entry point ``sok.backends: hkv``)."""

from collections.abc import Mapping

from sparse_operation_kit.plugins import BackendSpec, Capabilities, hookimpl

from sok_backend_hkv import __version__

#: evict_strategy values (as hkv_table.cpp spells them) whose scores ignore repeats within a call:
#: LRU scores are the time of the call; LFU ones count every occurrence.
_REPEAT_FREE_POLICIES = ("lru", "kLru", "epoch_lru", "kEpochLru")


def _lookups_distinct(options: Mapping[str, str]) -> bool:
    """Whether a table with these options may look each distinct key of a batch up once
    (the default policy is lru)."""
    return options.get("evict_strategy", "lru") in _REPEAT_FREE_POLICIES


@hookimpl
def sok_register_backends(registry):
    registry.register(
        BackendSpec(
            name="hkv",
            var_types=("hybrid",),
            capabilities=Capabilities(
                eviction=True,
                export_if=True,
                host_memory=True,
                devices=("cpu", "cuda"),
                eviction_policies=("lru", "lfu", "epoch_lru", "epoch_lfu", "custom"),
                distinct_lookups=_lookups_distinct,
            ),
            package="sok-backend-hkv",
            version=__version__,
            build_info="sok_backend_hkv._core:BUILD_INFO",
            c_api="sok_backend_hkv._core:storage_api",
        )
    )
