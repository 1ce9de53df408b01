"""sok-core's TensorFlow op library: loading it, checking it, and the op wrappers.

The library is compiled against the TensorFlow present when sok-core was built; loading it under
another TensorFlow version fails with a message naming both versions and the fix.
"""

from __future__ import annotations

import functools
import os
from typing import Any

_LIB_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib")
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
    path = os.path.join(_LIB_DIR, "libsok_tf_ops.so")
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
    try:
        return tf.load_op_library(path)
    except Exception as error:  # the loader's message is the useful part: keep it
        raise OpLibraryError(f"loading {path} failed: {error}. Rebuild it: {_REBUILD}") from error
