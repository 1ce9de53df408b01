"""Registers the hkv backend with sok-core (entry point ``sok.backends: hkv``)."""

from sparse_operation_kit.plugins import BackendSpec, Capabilities, hookimpl

from sok_backend_hkv import __version__


@hookimpl
def sok_register_backends(registry):
    registry.register(
        BackendSpec(
            name="hkv",
            var_types=("hybrid",),
            factory="sok_backend_hkv._core:Table",
            capabilities=Capabilities(
                eviction=True,
                export_if=True,
                host_memory=True,
                devices=("cpu", "cuda"),
                eviction_policies=("lru", "lfu", "epoch_lru", "epoch_lfu", "custom"),
            ),
            package="sok-backend-hkv",
            version=__version__,
            build_info="sok_backend_hkv._core:BUILD_INFO",
            c_api="sok_backend_hkv._core:storage_api",
        )
    )
