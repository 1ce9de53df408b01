"""The backend registry: var_type names, lazy loading, errors that say how to fix them."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import sparse_operation_kit
from sparse_operation_kit.plugins import (
    FIRST_PARTY,
    STORAGE_API_VERSION,
    BackendLoadError,
    BackendNotInstalledError,
    BackendRegistry,
    BackendSpec,
    Capabilities,
    UnknownVarTypeError,
    get_registry,
    hookimpl,
)
from sparse_operation_kit.plugins.registry import capsule_api_version, import_path
from sparse_operation_kit.storage import create_storage


def test_first_party_var_types_are_installed():
    assert {"hbm", "hybrid"} <= set(get_registry().var_types())


def test_hbm_is_det_and_hybrid_is_hkv():
    registry = get_registry()
    assert registry.spec("hbm").name == "det"
    assert registry.spec("hybrid").name == "hkv"
    assert registry.spec("hybrid").capabilities.eviction
    assert not registry.spec("hbm").capabilities.eviction


def test_unknown_var_type_names_it_and_lists_installed():
    with pytest.raises(UnknownVarTypeError) as info:
        create_storage("hbn", row_width=4)
    message = str(info.value)
    assert "'hbn'" in message
    for var_type in get_registry().var_types():
        assert repr(var_type) in message


def test_var_type_must_be_a_string():
    with pytest.raises(TypeError, match="var_type must be a string"):
        get_registry().spec(3)


@pytest.mark.parametrize("backend", FIRST_PARTY, ids=lambda b: b.name)
def test_uninstalled_first_party_backend_says_how_to_install(backend):
    empty = BackendRegistry()  # no entry points loaded: as if no backend were installed
    with pytest.raises(BackendNotInstalledError) as info:
        empty.spec(backend.var_types[0])
    message = str(info.value)
    assert f"pip install 'sok-core[{backend.extra}]'" in message
    assert backend.package in message
    assert "Installed var_types: none" in message


def test_backends_load_lazily():
    """Loading the registry imports no native backend module; a var_type imports only its own."""
    code = (
        "import sys\n"
        "from sparse_operation_kit.plugins import get_registry\n"
        "registry = get_registry()\n"
        "assert {'hbm', 'hybrid'} <= set(registry.var_types())\n"
        "assert 'sok_backend_det._core' not in sys.modules and 'sok_backend_hkv._core' not in sys.modules\n"
        "assert 'tensorflow' not in sys.modules\n"
        "registry.factory('hbm')\n"
        "assert 'sok_backend_det._core' in sys.modules and 'sok_backend_hkv._core' not in sys.modules\n"
    )
    import subprocess

    subprocess.run([sys.executable, "-c", code], check=True)


def _spec(name="extra", var_types=("extra",), **kwargs):
    return BackendSpec(name=name, var_types=var_types, factory=lambda *a: None, **kwargs)


def test_register_refuses_a_taken_var_type():
    registry = BackendRegistry()
    registry.register(_spec("a", ("x",)))
    with pytest.raises(ValueError, match="var_type 'x' of backend 'b' is already served by backend 'a'"):
        registry.register(_spec("b", ("x",)))


def test_register_refuses_another_api_version():
    registry = BackendRegistry()
    with pytest.raises(
        BackendLoadError, match=f"version {STORAGE_API_VERSION + 1}.*speaks version {STORAGE_API_VERSION}"
    ):
        registry.register(_spec(api_version=STORAGE_API_VERSION + 1))


def test_register_refuses_unknown_key_dtypes():
    registry = BackendRegistry()
    with pytest.raises(ValueError, match="unknown key dtypes"):
        registry.register(_spec(capabilities=Capabilities(key_dtypes=("float32",))))


def test_a_factory_that_fails_to_import_says_which_and_how_to_fix():
    registry = BackendRegistry()
    registry.register(
        BackendSpec(
            name="broken", var_types=("broken",), factory="no_such_module_xyz:Table", package="sok-backend-broken"
        )
    )
    with pytest.raises(BackendLoadError, match="no_such_module_xyz.*pip install --force-reinstall sok-backend-broken"):
        registry.factory("broken")


def test_plugin_registered_at_run_time_serves_its_var_type():
    registry = BackendRegistry()

    class Plugin:
        @hookimpl
        def sok_register_backends(self, registry):
            registry.register(_spec("runtime", ("runtime",)))

    registry.register_plugin(Plugin())
    assert registry.var_types() == ["runtime"]
    registry.unregister("runtime")
    assert registry.var_types() == []


def test_native_capsules_carry_this_api_version():
    for var_type in ("hbm", "hybrid"):
        spec = get_registry().spec(var_type)
        assert capsule_api_version(import_path(spec.c_api)()) == STORAGE_API_VERSION


def test_python_and_c_api_versions_agree():
    header = Path(sparse_operation_kit.get_include(), "sok", "storage_api.h").read_text()
    match = re.search(r"#define SOK_STORAGE_API_VERSION (\d+)", header)
    assert match and int(match.group(1)) == STORAGE_API_VERSION


def test_native_backends_are_tables_of_the_one_binding():
    """A native backend (c_api, no factory) gets sok-core's _table.Table over its capsule."""
    from sparse_operation_kit import _table
    from sparse_operation_kit.plugins import NativeTableFactory

    for var_type in ("hbm", "hybrid"):
        assert get_registry().spec(var_type).factory is None
        make = get_registry().factory(var_type)
        assert isinstance(make, NativeTableFactory)
        table = make("int64", 3, {})
        assert type(table) is _table.Table
        assert (table.key_dtype, table.row_width, table.device) == ("int64", 3, "cpu")


def test_the_c_api_is_loaded_once_and_its_address_kept(monkeypatch):
    """load() imports the capsule once; later loads, tables and table references reuse its address."""
    from sparse_operation_kit import table_ref
    from sparse_operation_kit.plugins import registry as registry_module
    from sparse_operation_kit.plugins.registry import capsule_pointer

    registry = get_registry()
    loaded = registry.load("hbm")
    assert loaded.api_address == capsule_pointer(import_path(loaded.spec.c_api)(), b"sok_storage_api")
    storage = create_storage("hbm", row_width=2)

    def no_import(path):
        raise AssertionError(f"imported {path!r} again")

    monkeypatch.setattr(registry_module, "import_path", no_import)
    assert registry.load("hbm") is loaded
    ref = table_ref.TableRef(storage)
    ref.swap(create_storage("hbm", row_width=4))
    assert table_ref.native_pointers(storage)[0] == loaded.api_address


def test_a_spec_needs_a_factory_or_a_c_api():
    with pytest.raises(ValueError, match="neither a factory .* nor a c_api"):
        BackendRegistry().register(BackendSpec(name="empty", var_types=("empty",)))


def test_a_c_api_of_another_version_is_refused_when_the_backend_loads(tmp_path, monkeypatch):
    """The capsule's api_version is read once, at load, with a message that says how to fix it."""
    import ctypes

    table = (ctypes.c_uint32 * 64)(STORAGE_API_VERSION + 1)
    capsule_new = ctypes.pythonapi.PyCapsule_New
    capsule_new.restype = ctypes.py_object
    capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    capsule = capsule_new(ctypes.addressof(table), b"sok_storage_api", None)
    module = type(sys)("old_native_backend")
    module.storage_api = lambda: capsule
    monkeypatch.setitem(sys.modules, "old_native_backend", module)
    registry = BackendRegistry()
    registry.register(BackendSpec(name="old", var_types=("old",), c_api="old_native_backend:storage_api", package="p"))
    with pytest.raises(
        BackendLoadError, match=f"implements storage API version {STORAGE_API_VERSION + 1}.*pip install"
    ):
        registry.factory("old")


def _plugins_imports(module_file: str) -> set[str]:
    """The modules under sparse_operation_kit.plugins that a plugins source file imports, anywhere in it
    (``if TYPE_CHECKING:`` blocks included)."""
    import ast

    from sparse_operation_kit import plugins

    tree = ast.parse(Path(plugins.__file__).with_name(module_file).read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sparse_operation_kit.plugins"):
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("sparse_operation_kit.plugins"))
    return found


def test_the_plugin_modules_are_layered_without_a_circle():
    """spec <- hookspecs <- registry: the contract's types import no plugin module, the hooks not the registry."""
    assert _plugins_imports("spec.py") == set()
    assert not {m for m in _plugins_imports("hookspecs.py") if m.endswith(".registry")}


def test_the_hook_annotations_resolve_at_run_time():
    """Documentation tools and typing.get_type_hints see the hook's registry type and what it may call."""
    import typing

    from sparse_operation_kit.plugins import hookspecs

    assert typing.get_type_hints(hookspecs.sok_register_backends)["registry"] is hookspecs.BackendRegistrar
    assert typing.get_type_hints(hookspecs.BackendRegistrar.register)["spec"] is BackendSpec


def test_the_contract_types_are_one_class_on_every_import_path():
    import pickle

    from sparse_operation_kit.plugins import registry as registry_module
    from sparse_operation_kit.plugins import spec as spec_module

    assert registry_module.BackendSpec is spec_module.BackendSpec is BackendSpec
    assert registry_module.Capabilities is spec_module.Capabilities is Capabilities
    assert registry_module.STORAGE_API_VERSION == spec_module.STORAGE_API_VERSION == STORAGE_API_VERSION
    spec = BackendSpec(name="p", var_types=("p",), c_api="m:f", capabilities=Capabilities(eviction=True))
    assert pickle.loads(pickle.dumps(spec)) == spec
    # a pickle written when the classes were defined in registry.py names them there, and still loads
    old = pickle.dumps(spec, protocol=2).replace(
        b"sparse_operation_kit.plugins.spec\n", b"sparse_operation_kit.plugins.registry\n"
    )
    assert b"plugins.registry\n" in old and pickle.loads(old) == spec
