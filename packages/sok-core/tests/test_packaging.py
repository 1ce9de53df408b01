"""The monorepo's packages: lockstep versions, extras, entry points, headers."""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path

import pytest
import sparse_operation_kit
import tomllib

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("sok-core", "sok-backend-det", "sok-backend-hkv", "sok-hps")


def _project(name):
    return tomllib.loads((ROOT / "packages" / name / "pyproject.toml").read_text())["project"]


def test_versions_are_in_lockstep():
    versions = {name: _project(name)["version"] for name in PACKAGES}
    assert len(set(versions.values())) == 1, versions


def test_extras_pin_the_same_version():
    core = _project("sok-core")
    version = core["version"]
    extras = core["optional-dependencies"]
    assert extras["det"] == [f"sok-backend-det=={version}"]
    assert extras["hkv"] == [f"sok-backend-hkv=={version}"]
    assert extras["hps"] == [f"sok-hps[all]=={version}"]  # HPS with every tier's client
    assert sorted(extras["all"]) == sorted(extras["det"] + extras["hkv"] + extras["hps"])
    for name in PACKAGES[1:]:
        assert f"sok-core=={version}" in _project(name)["dependencies"]


def test_sok_hps_adds_to_the_sok_command_by_entry_point():
    assert _project("sok-hps")["entry-points"]["sok.commands"] == {"hps": "hierarchical_parameter_server.sok_commands"}


def test_sok_core_python_imports_nothing_of_sok_hps():
    # sok-hps's parts of the sok command come through the entry-point group sok.commands.
    source = ROOT / "packages" / "sok-core" / "src" / "sparse_operation_kit"
    importing = [
        f"{path.relative_to(source)}:{number}"
        for path in sorted(source.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if line.lstrip().startswith(("import hierarchical_parameter_server", "from hierarchical_parameter_server"))
    ]
    assert importing == []


def test_backends_declare_entry_points():
    names = {ep.name: ep.value for ep in entry_points(group="sok.backends")}
    assert names["det"] == "sok_backend_det.plugin"
    assert names["hkv"] == "sok_backend_hkv.plugin"


#: The contract (sok/*.h), the implementer's kit (sok/kit/) and the GPU engine (sok/gpu_engine/).
HEADERS = [
    "storage_api.h",
    "table_ref.h",
    *(
        f"kit/{name}.hpp"
        for name in (
            "abi_adapter",
            "error",
            "export",
            "initializers",
            "keys",
            "module",
            "options",
            "parallel",
            "prefetch",
            "rows",
            "storage",
        )
    ),
    "gpu_engine/bucket_kernels.cuh",
    "gpu_engine/bucket_table.cuh",
    "gpu_engine/device_guard.hpp",
]


@pytest.mark.parametrize("header", HEADERS)
def test_headers_ship_with_the_package(header):
    assert (Path(sparse_operation_kit.get_include()) / "sok" / header).is_file()
    assert (Path(sparse_operation_kit.get_cmake_dir()) / "SokStorageApi.cmake").is_file()


def test_contract_level_holds_only_the_contract():
    """sok/ itself holds the plain-C contract a third-party backend needs; C++ lives below it."""
    top = sorted(p.name for p in (Path(sparse_operation_kit.get_include()) / "sok").iterdir() if p.is_file())
    assert top == ["storage_api.h", "table_ref.h"]


def test_hps_package_imports():
    import hierarchical_parameter_server as hps

    assert hps.__version__ == sparse_operation_kit.__version__
