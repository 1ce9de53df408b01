"""SparseOperationKit: sparse embeddings for TensorFlow 2 with Horovod, on CPU and GPU.

Storage backends are plugins chosen by ``var_type`` (``"hbm"``: det, ``"hybrid"``: hkv). This
module stays light: importing it loads neither TensorFlow nor any backend.

Example::

    >>> import sparse_operation_kit as sok
    >>> sok.print_environment_info()        # versions, backends, devices
"""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("sok-core")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0+unknown"


def get_include() -> str:
    """The directory of sok-core's C headers (``sok/storage_api.h``) for building backends."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "include")


def get_cmake_dir() -> str:
    """The directory of ``SokStorageApi.cmake``, the CMake helper for backends."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "cmake")


def print_environment_info(file=None) -> None:
    """Print Python, TensorFlow, Horovod, every backend's version and build, and the devices."""
    from sparse_operation_kit.env_info import print_environment_info as _print

    _print(file=file)


__all__ = ["__version__", "get_include", "get_cmake_dir", "print_environment_info"]
