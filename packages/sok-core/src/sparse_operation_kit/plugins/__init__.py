"""Plugin layer of SparseOperationKit: hookspecs, the ``hookimpl`` marker and the registry.

Example::

    from sparse_operation_kit.plugins import get_registry
    print(get_registry().var_types())     # ['hbm', 'hybrid'] with both backends installed
"""

from __future__ import annotations

import pluggy

from sparse_operation_kit.plugins.hookspecs import PROJECT_NAME
from sparse_operation_kit.plugins.registry import (
    ENTRY_POINT_GROUP,
    FIRST_PARTY,
    STORAGE_API_VERSION,
    BackendLoadError,
    BackendNotInstalledError,
    BackendRegistry,
    BackendSpec,
    Capabilities,
    LoadedBackend,
    NativeTableFactory,
    UnknownVarTypeError,
    get_registry,
)

#: Marks a plugin's hook implementations: ``@hookimpl def sok_register_backends(registry): ...``
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

__all__ = [
    "ENTRY_POINT_GROUP",
    "FIRST_PARTY",
    "STORAGE_API_VERSION",
    "BackendLoadError",
    "BackendNotInstalledError",
    "BackendRegistry",
    "BackendSpec",
    "Capabilities",
    "LoadedBackend",
    "NativeTableFactory",
    "UnknownVarTypeError",
    "get_registry",
    "hookimpl",
]
