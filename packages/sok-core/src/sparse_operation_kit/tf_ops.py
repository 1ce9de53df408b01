"""sok-core's TensorFlow op library: loading it, checking it, and the op wrappers.

The library is compiled against the TensorFlow present when sok-core was built; loading it under
another TensorFlow version fails with a message naming both versions and the fix. Its GPU kernels
are a second library (``libsok_tf_ops_gpu.so``, built when a CUDA toolkit was found), loaded only by
a CUDA build of TensorFlow. The ops whose kernels call Python are a third (``libsok_tf_python.so``,
:func:`python_library`), and the ops of SavedModels exported with NVIDIA's HPS plugin a fourth
(``libsok_tf_hps_compat.so``, :func:`hps_compat_library`). SOK's own NCCL collectives, for the
lookup's exchange on GPU ranks, are a fifth (``libsok_tf_nccl.so``, built where NCCL was found;
:func:`nccl_library`).
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
HPS_COMPAT_LIBRARY = "libsok_tf_hps_compat.so"
NCCL_LIBRARY = "libsok_tf_nccl.so"
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
    stamp = os.path.join(_LIB_DIR, "tf_build.txt")
    if not os.path.exists(path):
        raise OpLibraryError(
            f"sok-core was built without its TensorFlow op library (no {path}); TensorFlow was not "
            f"importable when it was built. Rebuild it now that TensorFlow {tf.__version__} is installed: {_REBUILD}"
        )
    with open(stamp) as f:
        built_for = f.read().strip()
    if built_for != tf.__version__:
        raise OpLibraryError(
            f"sok-core's op library was built for TensorFlow {built_for} but TensorFlow {tf.__version__} is "
            f"installed; rebuild it: {_REBUILD}"
        )
    lib = _load(tf, path)
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
    """The loaded library of the ops that call Python by name (``SokPyCall``, ``SokResolveTable``;
    :mod:`sparse_operation_kit.python_ops`), after :func:`library` and its checks."""
    return _load_beside(PYTHON_LIBRARY)


@functools.cache
def hps_compat_library() -> Any:
    """The loaded library of the two ops of SavedModels exported with NVIDIA's HPS plugin (``Init``,
    ``Lookup``, with the plugin's signatures; their kernels call ``hierarchical_parameter_server``)."""
    return _load_beside(HPS_COMPAT_LIBRARY)


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


def _load_beside(name: str) -> Any:
    """``tf.load_op_library`` of ``lib/<name>``, after :func:`library` and its checks."""
    import tensorflow as tf

    library()
    path = os.path.join(_LIB_DIR, name)
    if not os.path.exists(path):
        raise OpLibraryError(f"sok-core was built without {path}; rebuild it: {_REBUILD}")
    return _load(tf, path)


def _load(tf: Any, path: str) -> Any:
    """``tf.load_op_library(path)``; a failure raises OpLibraryError with the loader's message."""
    try:
        return tf.load_op_library(path)
    except Exception as error:  # the loader's message is the useful part: keep it
        raise OpLibraryError(f"loading {path} failed: {error}. Rebuild it: {_REBUILD}") from error


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
