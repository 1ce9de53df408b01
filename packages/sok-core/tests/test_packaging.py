"""The monorepo's packages: lockstep versions, extras, entry points, headers."""

from __future__ import annotations

import importlib.resources
import os
import shutil
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import sparse_operation_kit
import tomllib
from sparse_operation_kit import tf_ops

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


def test_sok_core_builds_nothing_of_sok_hps():
    """sok-hps builds its own op library (NVIDIA's plugin ops) with sok-core's CMake package: no
    source sok-core compiles names its Python, and sok-core installs only the libraries tf_ops names."""
    core = ROOT / "packages" / "sok-core"
    sources = [core / "CMakeLists.txt", *sorted((core / "csrc").rglob("*.*"))]
    naming = [str(path.relative_to(core)) for path in sources if "hierarchical_parameter_server" in path.read_text()]
    assert naming == []
    own = {tf_ops.LIBRARY, tf_ops.GPU_LIBRARY, tf_ops.PYTHON_LIBRARY, tf_ops.NCCL_LIBRARY}
    installed = {name for name in os.listdir(tf_ops._LIB_DIR) if name.endswith(".so")}
    assert installed <= own, sorted(installed - own)


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
    "tf/python_call.h",  # for the op libraries whose kernels call Python (sok-core's, sok-hps's)
]


@pytest.mark.parametrize("header", HEADERS)
def test_headers_ship_with_the_package(header):
    assert (Path(sparse_operation_kit.get_include()) / "sok" / header).is_file()


def test_cmake_package_ships_with_the_package():
    """The backends' find_package(SokCore): the config, and the version file sok-core's build writes."""
    cmake_dir = Path(sparse_operation_kit.get_cmake_dir())
    assert (cmake_dir / "SokCoreConfig.cmake").is_file()
    version_file = (cmake_dir / "SokCoreConfigVersion.cmake").read_text()
    assert f'set(PACKAGE_VERSION "{sparse_operation_kit.__version__}")' in version_file


@pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake on PATH")
def test_cmake_finds_the_installed_package_through_the_entry_point(tmp_path):
    """scikit-build-core sets <name>_ROOT from each entry point of the group cmake.root, as here."""
    roots = {ep.name: ep for ep in entry_points(group="cmake.root")}
    assert "SokCore" in roots, roots
    root = importlib.resources.files(roots["SokCore"].load())
    version = sparse_operation_kit.__version__
    (tmp_path / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.18...3.31)\n"
        "project(probe LANGUAGES NONE)\n"
        f"find_package(SokCore {version} EXACT CONFIG REQUIRED)\n"
        'message(STATUS "SokCore ${SokCore_VERSION} at ${SokCore_DIR}")\n'
    )
    configure = subprocess.run(
        ["cmake", "-S", str(tmp_path), "-B", str(tmp_path / "build"), f"-DSokCore_ROOT={root}"],
        capture_output=True,
        text=True,
    )
    assert configure.returncode == 0, configure.stderr
    assert f"SokCore {version} at {sparse_operation_kit.get_cmake_dir()}" in configure.stdout


@pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake on PATH")
@pytest.mark.parametrize("importable", [True, False], ids=["tensorflow", "no-tensorflow"])
def test_sok_find_tensorflow_reads_the_build_pythons_tensorflow(tmp_path, importable):
    """The one home of the TensorFlow flags of every package with TensorFlow ops (sok-core's
    CMakeLists.txt, sok-hps's): TF_FOUND, and where TensorFlow imports its version."""
    if importable:
        tf = pytest.importorskip("tensorflow")
        python, expected = sys.executable, f"TRUE {tf.__version__} flags"
    else:
        python, expected = shutil.which("false"), "FALSE  "
    (tmp_path / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.18...3.31)\n"
        "project(probe LANGUAGES NONE)\n"
        "find_package(SokCore CONFIG REQUIRED)\n"
        "sok_find_tensorflow()\n"
        "if(TF_COMPILE_FLAGS AND TF_LINK_FLAGS)\n  set(flags flags)\nendif()\n"
        'message(STATUS "probe: ${TF_FOUND} ${TF_VERSION} ${flags}")\n'
    )
    configure = subprocess.run(
        [
            "cmake",
            "-S",
            str(tmp_path),
            "-B",
            str(tmp_path / "build"),
            f"-DSokCore_DIR={sparse_operation_kit.get_cmake_dir()}",
            f"-DPython_EXECUTABLE={python}",
        ],
        capture_output=True,
        text=True,
    )
    assert configure.returncode == 0, configure.stderr
    assert f"probe: {expected}\n" in configure.stdout


def test_contract_level_holds_only_the_contract():
    """sok/ itself holds the plain-C contract a third-party backend needs; C++ lives below it."""
    top = sorted(p.name for p in (Path(sparse_operation_kit.get_include()) / "sok").iterdir() if p.is_file())
    assert top == ["storage_api.h", "table_ref.h"]


def test_hps_package_imports():
    import hierarchical_parameter_server as hps

    assert hps.__version__ == sparse_operation_kit.__version__
