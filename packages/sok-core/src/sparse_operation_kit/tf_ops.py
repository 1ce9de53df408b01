"""sok-core's TensorFlow op library: loading it, checking it, and the op wrappers.

The library is compiled against the TensorFlow present when sok-core was built; loading it under
another TensorFlow version fails with a message naming both versions and the fix. Its GPU kernels
are a second library (``libsok_tf_ops_gpu.so``, built when a CUDA toolkit was found), loaded only by
a CUDA build of TensorFlow. The Python dispatch of the ops that call a function by name is a
third (``libsok_tf_python.so``, :func:`python_library`). SOK's own NCCL collectives, for the
lookup's exchange on GPU ranks, are a fourth (``libsok_tf_nccl.so``, built where NCCL was found;
:func:`nccl_library`). Other packages' op libraries, built with sok-core's CMake package
(``sok_find_tensorflow``), load with the same checks through :func:`load_op_library`.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

_log = logging.getLogger(__name__)

_LIB_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib")
#: SOK's op library (no Python in it): every graph with SOK's ops needs it.
LIBRARY = "libsok_tf_ops.so"
GPU_LIBRARY = "libsok_tf_ops_gpu.so"
PYTHON_LIBRARY = "libsok_tf_python.so"
NCCL_LIBRARY = "libsok_tf_nccl.so"
# The TensorFlow version the op libraries of a directory were built against, written beside them by
# sok_install_tensorflow_stamp (SokCoreConfig.cmake).
_TF_STAMP = "tf_build.txt"
# What the build recorded about the GPU kernels: the CUDA toolkit version, or "none".
_GPU_STAMP = "gpu_build.txt"
_REBUILD = "pip install --no-build-isolation --force-reinstall --no-deps sok-core (or: make setup in the repository)"


class OpLibraryError(ImportError):
    """sok-core's TensorFlow op library is missing or does not match the installed TensorFlow."""


@functools.cache
def library() -> Any:
    """The loaded op library module (``tf.load_op_library``)."""
    try:
        import tensorflow as tf
    except ImportError as error:
        raise OpLibraryError(
            "TensorFlow is not installed; SOK variables and lookups need it: pip install tensorflow "
            "(or tensorflow-cpu), then rebuild sok-core: " + _REBUILD
        ) from error
    path = os.path.join(_LIB_DIR, LIBRARY)
    if not os.path.exists(path):
        raise OpLibraryError(
            f"sok-core was built without its TensorFlow op library (no {path}); TensorFlow was not "
            f"importable when it was built. Rebuild it now that TensorFlow {tf.__version__} is installed: {_REBUILD}"
        )
    _check_built_for(tf, path, "sok-core", _REBUILD)
    lib = _load(tf, path, _REBUILD)
    if tf.test.is_built_with_cuda():
        _load_gpu_kernels(tf)
    return lib


def serving_libraries() -> list[str]:
    """The op libraries a process without Python loads to run the SOK ops of a SavedModel (with
    TensorFlow's C API ``TF_LoadLibrary``, TensorFlow Serving's custom op libraries, ...): SOK's op
    library, then, from a CUDA build, its GPU kernels. Neither needs Python.

    Example::

        $ python -c "from sparse_operation_kit import tf_ops; print(*tf_ops.serving_libraries())"
    """
    paths = [os.path.join(_LIB_DIR, name) for name in (LIBRARY, GPU_LIBRARY)]
    return [path for path in paths if os.path.exists(path)]


@functools.cache
def python_library() -> Any:
    """The op library of the ops that call a function by name (``SokPyCall``, ``SokResolveTable``;
    :mod:`sparse_operation_kit.python_ops`): :func:`library`, once ``libsok_tf_python.so`` has
    installed their Python dispatch into it (the Python functions registered with
    :func:`sparse_operation_kit.python_ops.register` then compute them in this process)."""
    _load_beside(PYTHON_LIBRARY)
    return library()


def nccl_built() -> bool:
    """Whether sok-core was built with its NCCL collectives (``lib/libsok_tf_nccl.so``), without
    importing TensorFlow."""
    return os.path.exists(os.path.join(_LIB_DIR, NCCL_LIBRARY))


@functools.cache
def nccl_library() -> Any | None:
    """The loaded library of SOK's NCCL collectives (``SokNcclInit``, ``SokNcclAllToAll``,
    ``SokNcclAllGather``, ``SokNcclAllReduce``; :mod:`sparse_operation_kit.lookup.exchange`), or None
    where they cannot run:
    a TensorFlow without CUDA, or sok-core built without NCCL (no ``lib/libsok_tf_nccl.so``)."""
    import tensorflow as tf

    library()
    if not tf.test.is_built_with_cuda() or not nccl_built():
        return None
    return _load_beside(NCCL_LIBRARY)


def load_op_library(path: str, *, package: str, rebuild: str) -> Any:
    """``tf.load_op_library(path)`` of an op library that the distribution ``package`` built with
    sok-core's CMake package, after :func:`library` and its checks: the library's directory holds
    the stamp of ``sok_install_tensorflow_stamp``, which must name the installed TensorFlow.

    Args:
        path: the library's file.
        package: the distribution that built it, named in the messages (``"sok-hps"``).
        rebuild: the command that rebuilds it, which ends the messages.

    Raises:
        OpLibraryError: the file is missing (``package`` was built where TensorFlow was not
            importable), it was built for another TensorFlow version, or TensorFlow's loader refused it.

    Example::

        lib = tf_ops.load_op_library(
            os.path.join(lib_dir, "libmy_ops.so"), package="my-package",
            rebuild="pip install --no-build-isolation --force-reinstall --no-deps my-package")
    """
    import tensorflow as tf

    library()
    if not os.path.exists(path):
        raise OpLibraryError(f"{package} was built without {path}; rebuild it: {rebuild}")
    _check_built_for(tf, path, package, rebuild)
    return _load(tf, path, rebuild)


def _load_beside(name: str) -> Any:
    """``tf.load_op_library`` of sok-core's ``lib/<name>``, after :func:`library` and its checks."""
    return load_op_library(os.path.join(_LIB_DIR, name), package="sok-core", rebuild=_REBUILD)


def _check_built_for(tf: Any, path: str, package: str, rebuild: str) -> None:
    """Raises OpLibraryError unless the stamp beside the op library ``path`` names ``tf.__version__``."""
    stamp = os.path.join(os.path.dirname(path), _TF_STAMP)
    try:
        with open(stamp) as f:
            built_for = f.read().strip()
    except FileNotFoundError as error:
        raise OpLibraryError(
            f"{package}'s op library {path} has no {stamp} (the TensorFlow version it was built for); "
            f"rebuild it: {rebuild}"
        ) from error
    if built_for != tf.__version__:
        raise OpLibraryError(
            f"{package}'s op library was built for TensorFlow {built_for} but TensorFlow {tf.__version__} is "
            f"installed; rebuild it: {rebuild}"
        )


def _load(tf: Any, path: str, rebuild: str) -> Any:
    """``tf.load_op_library(path)``; a failure raises OpLibraryError with the loader's message."""
    try:
        return tf.load_op_library(path)
    except Exception as error:  # the loader's message is the useful part: keep it
        raise OpLibraryError(f"loading {path} failed: {error}. Rebuild it: {rebuild}") from error


def gpu_build() -> str | None:
    """The CUDA toolkit version the GPU kernels were built with, ``"none"`` when no toolkit was found
    at build time, or None when sok-core was built without its op library."""
    try:
        with open(os.path.join(_LIB_DIR, _GPU_STAMP)) as f:
            return f.read().strip()
    except FileNotFoundError:
        return None


def _load_gpu_kernels(tf: Any) -> None:
    """Loads the DEVICE_GPU kernels into a CUDA TensorFlow (after the library that registers the ops).

    A CPU TensorFlow never loads them: it has no GPU to run them on.
    """
    path = os.path.join(_LIB_DIR, GPU_LIBRARY)
    if not os.path.exists(path):
        _log.warning(
            "TensorFlow is built with CUDA but sok-core has no GPU kernels (%s: no CUDA toolkit was found "
            "when it was built): SOK's ops run on the CPU. For GPU kernels, put the CUDA toolkit's nvcc on "
            "PATH and rebuild sok-core: %s",
            path,
            _REBUILD,
        )
        return
    try:
        tf.load_op_library(path)
    except Exception as error:  # the loader's message is the useful part: keep it
        raise OpLibraryError(
            f"loading sok-core's GPU kernels {path} (built with CUDA {gpu_build()}) into TensorFlow "
            f"{tf.__version__} failed: {error}. Rebuild sok-core on this machine, with the CUDA toolkit that "
            f"matches this TensorFlow's on PATH: {_REBUILD}"
        ) from error
