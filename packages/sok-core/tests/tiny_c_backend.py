"""tiny: a third-party native backend in plain C99 (``c_backend/tiny_table.c``), as a plugin.

It proves that the contract headers alone make a backend: :func:`build` compiles the C file with
only ``sok/storage_api.h`` on the include path (copied alone into a fresh directory), :func:`load`
opens the library with ctypes and wraps its function table as a ``"sok_storage_api"`` PyCapsule,
and the plugin hook registers a :class:`~sparse_operation_kit.plugins.BackendSpec` that names
nothing but that capsule (``c_api``): sok-core's binding makes its tables.

Example::

    library = tiny_c_backend.build(tmp_path)          # None without a C compiler
    tiny_c_backend.load(library)
    get_registry().register_plugin(tiny_c_backend, name="tiny")
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import sparse_operation_kit
from sparse_operation_kit.plugins import BackendSpec, Capabilities, hookimpl

VAR_TYPE = "tiny"
SOURCE = Path(__file__).parent / "c_backend" / "tiny_table.c"

SPEC = BackendSpec(
    name="tiny",
    var_types=(VAR_TYPE,),
    c_api=f"{__name__}:storage_api",
    capabilities=Capabilities(eviction=False, export_if=True, devices=("cpu",)),
    package="sok-core tests",
    version="0",
)

_library: ctypes.CDLL | None = None


def compiler() -> str | None:
    """The C compiler (``cc``, ``gcc`` or ``clang``), or None."""
    return next((path for name in ("cc", "gcc", "clang") if (path := shutil.which(name))), None)


def build(directory: Path) -> Path:
    """Compile ``tiny_table.c`` as C99 against a copy of ``sok/storage_api.h`` alone; the library's path.

    Raises:
        RuntimeError: no C compiler, or the build failed (with the compiler's output).
    """
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler (cc, gcc or clang) on PATH")
    include = directory / "include"
    (include / "sok").mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(sparse_operation_kit.get_include()) / "sok" / "storage_api.h", include / "sok")
    library = directory / "libtiny.so"
    command = [cc, "-std=c99", "-pedantic", "-Werror", "-Wall", "-shared", "-fPIC", "-O2", "-pthread"]
    command += [f"-I{include}", str(SOURCE), "-o", str(library), "-lm"]
    built = subprocess.run(command, capture_output=True, text=True)
    if built.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{built.stderr}")
    return library


def load(library: Path) -> None:
    """Open the compiled backend (kept open for the process)."""
    global _library
    _library = ctypes.CDLL(str(library))
    _library.tiny_storage_api.restype = ctypes.c_void_p


def storage_api() -> object:
    """The backend's ``sok_storage_api`` as a PyCapsule (what a native module's ``storage_api()`` gives)."""
    if _library is None:
        raise RuntimeError("the tiny backend is not loaded; call tiny_c_backend.load(build(directory)) first")
    new_capsule = ctypes.pythonapi.PyCapsule_New
    new_capsule.restype = ctypes.py_object
    new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return new_capsule(_library.tiny_storage_api(), b"sok_storage_api", None)


@hookimpl
def sok_register_backends(registry) -> None:
    """Register the tiny backend."""
    registry.register(SPEC)
