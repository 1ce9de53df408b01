"""The backend registry: the one source of truth for var_type names, backends and capabilities.

Backends arrive through pluggy (entry-point group ``sok.backends``, see :mod:`.hookspecs`). The
registry maps each ``var_type`` to a :class:`BackendSpec` and loads the backend only when that
``var_type`` is used (:meth:`BackendRegistry.load`): a native backend's ``sok_storage_api`` capsule
is imported once, its version checked, and kept with its address in a :class:`LoadedBackend`;
its tables are ``sparse_operation_kit._table.Table`` objects over that capsule (sok-core's one
binding of the C ABI), and the TensorFlow ops' table references use the same address. Unknown
names and missing backends raise errors that say what is installed and how to install the rest.

Example::

    >>> from sparse_operation_kit.plugins import get_registry
    >>> "hbm" in get_registry().var_types()   # with sok-backend-det installed
    True
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pluggy

from sparse_operation_kit.dtypes import KEY_DTYPES
from sparse_operation_kit.plugins import hookspecs
from sparse_operation_kit.plugins.spec import STORAGE_API_VERSION, BackendSpec
from sparse_operation_kit.plugins.spec import Capabilities as Capabilities  # re-exported: it was defined here

logger = logging.getLogger(__name__)

#: The entry-point group backends register under.
ENTRY_POINT_GROUP = "sok.backends"


@dataclass(frozen=True)
class FirstPartyBackend:
    """A backend this project ships, so an error can say how to install it."""

    name: str
    var_types: tuple[str, ...]
    package: str
    extra: str

    @property
    def install_command(self) -> str:
        return f"pip install 'sok-core[{self.extra}]'   (or: pip install {self.package})"


#: The backends of this project: var_type names and how to install each.
FIRST_PARTY: tuple[FirstPartyBackend, ...] = (
    FirstPartyBackend("det", ("hbm",), "sok-backend-det", "det"),
    FirstPartyBackend("hkv", ("hybrid",), "sok-backend-hkv", "hkv"),
)


class UnknownVarTypeError(ValueError):
    """A var_type that no installed or known backend provides."""


class BackendNotInstalledError(ImportError):
    """A var_type of a first-party backend whose package is not installed."""


class BackendLoadError(ImportError):
    """A backend is registered but its factory could not be imported or is incompatible."""


class NativeTableFactory:
    """The table factory of a native backend: ``sparse_operation_kit._table.Table`` objects over
    the backend's ``sok_storage_api`` capsule, loaded once by the registry.

    Example::

        >>> make = get_registry().factory("hbm")
        >>> table = make("int64", 8, {"init_capacity": "1024"})            # a CPU table
        >>> gpu_table = make("int64", 8, {}, device="cuda:0")            # a CUDA build's GPU table
    """

    def __init__(self, backend: str, api: object) -> None:
        from sparse_operation_kit import _table  # the binding: imported with the first native backend

        self.backend = backend
        self._api = api
        self._table_class = _table.Table

    def __call__(self, key_dtype: str, row_width: int, options: Mapping[str, str], device: str = "cpu") -> Any:
        """A new table: ``Table(api, key_dtype, row_width, options, device)``."""
        return self._table_class(self._api, key_dtype, row_width, dict(options), device)

    def __repr__(self) -> str:
        return f"NativeTableFactory({self.backend!r})"


@dataclass(frozen=True)
class LoadedBackend:
    """A backend whose code is imported: what :meth:`BackendRegistry.load` keeps per backend.

    Args:
        spec: its registry entry.
        factory: its table factory (the spec's, or a :class:`NativeTableFactory`).
        api: its ``sok_storage_api`` PyCapsule, version-checked (None for Python backends).
        api_address: the address of that function table (None for Python backends).
    """

    spec: BackendSpec
    factory: Callable[..., Any]
    api: object | None = None
    api_address: int | None = None


def capsule_pointer(capsule: object, name: bytes) -> int:
    """The address a PyCapsule named ``name`` holds (ValueError for another name)."""
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype = ctypes.c_void_p
    get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return get_pointer(capsule, name)


def capsule_api_version(capsule: object) -> int:
    """The ``api_version`` field of a ``sok_storage_api`` capsule (its first uint32)."""
    return ctypes.c_uint32.from_address(capsule_pointer(capsule, b"sok_storage_api")).value


def import_path(path: str) -> Any:
    """The object named ``"module:attribute"`` (or the module for ``"module"``), imported now."""
    module_name, _, attribute = path.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attribute) if attribute else module


class BackendRegistry:
    """var_type → backend, filled by the ``sok_register_backends`` hook of every plugin."""

    def __init__(self) -> None:
        self._specs: dict[str, BackendSpec] = {}
        self._by_var_type: dict[str, BackendSpec] = {}
        self._loaded: dict[str, LoadedBackend] = {}
        self._lock = threading.RLock()
        self.plugin_manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.plugin_manager.add_hookspecs(hookspecs)

    # -- registration ---------------------------------------------------------------------------
    def register(self, spec: BackendSpec) -> None:
        """Add a backend. Raises ValueError on a clash or a malformed spec."""
        if not isinstance(spec, BackendSpec):
            raise TypeError(f"register() takes a BackendSpec, got {type(spec).__name__}")
        if spec.api_version != STORAGE_API_VERSION:
            raise BackendLoadError(
                f"backend {spec.name!r} ({spec.package} {spec.version}) was built for storage API "
                f"version {spec.api_version}, but this sok-core speaks version {STORAGE_API_VERSION}; "
                f"install matching versions, e.g. pip install -U sok-core {spec.package or spec.name}"
            )
        if not spec.var_types or not all(isinstance(v, str) and v for v in spec.var_types):
            raise ValueError(f"backend {spec.name!r} must name at least one non-empty var_type")
        if spec.factory is None and spec.c_api is None:
            raise ValueError(
                f"backend {spec.name!r} gives neither a factory (a Python backend) nor a c_api (a native "
                f"backend); pass one of them to BackendSpec"
            )
        unknown = set(spec.capabilities.key_dtypes) - set(KEY_DTYPES)
        if unknown:
            raise ValueError(
                f"backend {spec.name!r} declares unknown key dtypes {sorted(unknown)}; valid: {KEY_DTYPES}"
            )
        with self._lock:
            if spec.name in self._specs:
                raise ValueError(
                    f"a backend named {spec.name!r} is already registered ({self._specs[spec.name].package})"
                )
            for var_type in spec.var_types:
                if var_type in self._by_var_type:
                    other = self._by_var_type[var_type]
                    raise ValueError(
                        f"var_type {var_type!r} of backend {spec.name!r} is already served by backend {other.name!r}"
                    )
            self._specs[spec.name] = spec
            for var_type in spec.var_types:
                self._by_var_type[var_type] = spec
        logger.debug("registered backend %s for var_types %s", spec.name, spec.var_types)

    def register_plugin(self, plugin: object, name: str | None = None) -> None:
        """Register a plugin object (module or instance with ``@hookimpl`` functions) at run time.

        Entry points are the usual way; this serves plugins defined in a program or a test.
        """
        self.plugin_manager.register(plugin, name=name)
        self.plugin_manager.check_pending()
        caller = self.plugin_manager.subset_hook_caller(
            "sok_register_backends",
            remove_plugins=[p for p in self.plugin_manager.get_plugins() if p is not plugin],
        )
        caller(registry=self)

    def unregister(self, name: str) -> None:
        """Remove the backend ``name`` (and its var_types)."""
        with self._lock:
            spec = self._specs.pop(name)
            for var_type in spec.var_types:
                self._by_var_type.pop(var_type, None)
            self._loaded.pop(name, None)

    def load_entry_points(self) -> None:
        """Load every plugin of the ``sok.backends`` entry-point group and collect its backends."""
        count = self.plugin_manager.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
        self.plugin_manager.check_pending()
        logger.debug("loaded %d backend plugins from entry points", count)
        self.plugin_manager.hook.sok_register_backends(registry=self)

    # -- lookups --------------------------------------------------------------------------------
    def var_types(self) -> list[str]:
        """Every installed var_type, sorted."""
        return sorted(self._by_var_type)

    def backends(self) -> list[BackendSpec]:
        """Every installed backend, by name."""
        return [self._specs[name] for name in sorted(self._specs)]

    def spec(self, var_type: str) -> BackendSpec:
        """The backend serving ``var_type``, or an error that says what is installed and how to
        install the missing one."""
        if not isinstance(var_type, str):
            raise TypeError(f"var_type must be a string, got {type(var_type).__name__} {var_type!r}")
        spec = self._by_var_type.get(var_type)
        if spec is not None:
            return spec
        installed = ", ".join(repr(v) for v in self.var_types()) or "none"
        for known in FIRST_PARTY:
            if var_type in known.var_types:
                raise BackendNotInstalledError(
                    f"var_type {var_type!r} needs the {known.name} backend (package {known.package}), "
                    f"which is not installed; install it with: {known.install_command}. "
                    f"Installed var_types: {installed}"
                )
        raise UnknownVarTypeError(f"unknown var_type {var_type!r}; installed var_types: {installed}")

    def load(self, var_type: str) -> LoadedBackend:
        """The backend serving ``var_type``, imported on first use: its factory and, for a native
        backend, its ``sok_storage_api`` capsule (imported once, version checked)."""
        spec = self.spec(var_type)
        with self._lock:
            loaded = self._loaded.get(spec.name)
            if loaded is not None:
                return loaded
            api = address = None
            if spec.c_api is not None:
                api, address = self._load_c_api(spec)
            if spec.factory is None:
                try:
                    factory: Callable[..., Any] = NativeTableFactory(spec.name, api)
                except ImportError as error:
                    raise BackendLoadError(
                        f"backend {spec.name!r} is native, but this sok-core has no binding of the C ABI "
                        f"(sparse_operation_kit._table): {error}; reinstall sok-core: "
                        f"pip install --force-reinstall sok-core"
                    ) from error
            elif callable(spec.factory):
                factory = spec.factory
            else:
                try:
                    factory = import_path(spec.factory)
                except (ImportError, AttributeError) as error:
                    raise BackendLoadError(
                        f"backend {spec.name!r} is registered but its factory {spec.factory!r} "
                        f"failed to import: {error}; reinstall it: pip install --force-reinstall "
                        f"{spec.package or spec.name}"
                    ) from error
            loaded = LoadedBackend(spec, factory, api, address)
            self._loaded[spec.name] = loaded
            return loaded

    def factory(self, var_type: str) -> Callable[..., Any]:
        """The table factory of ``var_type``'s backend, importing the backend on first use:
        ``factory(key_dtype, row_width, options)`` (and ``device="cuda:N"`` where the backend's
        capabilities list ``"cuda"``)."""
        return self.load(var_type).factory

    @staticmethod
    def _load_c_api(spec: BackendSpec) -> tuple[object, int]:
        """The backend's ``sok_storage_api`` capsule and its address, checked for this API version."""
        try:
            capsule = import_path(spec.c_api)()
            address = capsule_pointer(capsule, b"sok_storage_api")
            version = capsule_api_version(capsule)
        except Exception as error:
            raise BackendLoadError(
                f"backend {spec.name!r} has no readable storage API capsule ({spec.c_api}): {error}"
            ) from error
        if version != STORAGE_API_VERSION:
            raise BackendLoadError(
                f"backend {spec.name!r}'s native code implements storage API version {version}, but this "
                f"sok-core speaks version {STORAGE_API_VERSION}; rebuild or upgrade it: "
                f"pip install --force-reinstall {spec.package or spec.name}"
            )
        return capsule, address

    def build_info(self, spec: BackendSpec) -> dict:
        """The backend's build facts (imports the backend); errors become an ``error`` entry."""
        if spec.build_info is None:
            return {}
        try:
            info = spec.build_info() if callable(spec.build_info) else import_path(spec.build_info)
            return dict(info)
        except Exception as error:  # reported, not raised: this feeds bug reports
            return {"error": f"{type(error).__name__}: {error}"}


_registry: BackendRegistry | None = None
_registry_lock = threading.Lock()


def get_registry() -> BackendRegistry:
    """The process-wide registry, built from the entry points on first use."""
    global _registry
    with _registry_lock:
        if _registry is None:
            registry = BackendRegistry()
            registry.load_entry_points()
            _registry = registry
        return _registry
