"""Registers the det backend with sok-core (entry point ``sok.backends: det``)."""

from sparse_operation_kit.plugins import BackendSpec, Capabilities, hookimpl

from sok_backend_det import __version__


@hookimpl
def sok_register_backends(registry):
    registry.register(
        BackendSpec(
            name="det",
            var_types=("hbm",),
            capabilities=Capabilities(
                eviction=False, export_if=True, host_memory=False, devices=("cpu", "cuda"), distinct_lookups=True
            ),
            package="sok-backend-det",
            version=__version__,
            build_info="sok_backend_det._core:BUILD_INFO",
            c_api="sok_backend_det._core:storage_api",
        )
    )
