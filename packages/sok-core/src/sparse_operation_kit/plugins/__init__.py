"""Plugin layer of SparseOperationKit: hookspecs, the ``hookimpl`` marker, backend specs and the registry.

Example::

    from sparse_operation_kit.plugins import get_registry
    print(get_registry().var_types())     # ['hbm', 'hybrid'] with both backends installed
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import pluggy

from sparse_operation_kit.plugins.hookspecs import PROJECT_NAME
from sparse_operation_kit.plugins.registry import (
    ENTRY_POINT_GROUP,
    FIRST_PARTY,
    BackendLoadError,
    BackendNotInstalledError,
    BackendRegistry,
    LoadedBackend,
    NativeTableFactory,
    UnknownVarTypeError,
    get_registry,
)
from sparse_operation_kit.plugins.spec import STORAGE_API_VERSION, BackendSpec, Capabilities

#: Marks a plugin's hook implementations: ``@hookimpl def sok_register_backends(registry): ...``
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


def package_version(distribution: str) -> str:
    """The installed version of ``distribution``, or ``"0.0.0+unknown"`` when it is imported from a
    source tree (not installed): what a backend package reports as ``__version__`` and registers.

    Example::

        __version__ = package_version("sok-backend-det")   # "0.1.0"
    """
    try:
        return version(distribution)
    except PackageNotFoundError:
        return "0.0.0+unknown"


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
    "package_version",
    "hookimpl",
]
