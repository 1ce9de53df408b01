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
    """The directory of sok-core's C headers: ``sok/storage_api.h`` for building backends,
    ``sok/tf/python_call.h`` for other packages' TensorFlow ops whose kernels call Python."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "include")


def get_cmake_dir() -> str:
    """The directory of sok-core's CMake package for backends and other packages' TensorFlow ops
    (sok-hps's), ``SokCoreConfig.cmake`` (``find_package(SokCore)``); pip's build of such a package
    finds it by itself, other builds pass ``-DSokCore_DIR=<this directory>``."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "cmake")


def print_environment_info(file=None) -> None:
    """Print Python, TensorFlow, Horovod, every backend's version and build, and the devices."""
    from sparse_operation_kit.env_info import print_environment_info as _print

    _print(file=file)


# The TensorFlow-facing API, imported on first use so `import sparse_operation_kit` stays light.
_LAZY = {
    "DynamicVariable": "sparse_operation_kit.dynamic_variable",
    "export": "sparse_operation_kit.dynamic_variable",
    "assign": "sparse_operation_kit.dynamic_variable",
    "sparse_read_and_evict": "sparse_operation_kit.dynamic_variable",
    "DynamicSlot": "sparse_operation_kit.slot_view",
    "OptimizerWrapper": "sparse_operation_kit.optimizer",
    "SGD": "sparse_operation_kit.optimizer",
    "filter_variables": "sparse_operation_kit.optimizer",
    "RowWiseAdagrad": "sparse_operation_kit.row_wise_adagrad",
    "DynamicEmbedding": "sparse_operation_kit.layers",
    "All2AllDenseEmbedding": "sparse_operation_kit.layers",
    "Variable": "sparse_operation_kit.distributed_variable",
    "DistributedVariable": "sparse_operation_kit.distributed_variable",
    "LocalizedVariable": "sparse_operation_kit.distributed_variable",
    "lookup_sparse": "sparse_operation_kit.lookup",
    "all2all_dense_embedding": "sparse_operation_kit.lookup",
    "init": "sparse_operation_kit.communication",
    "set_comm_tool": "sparse_operation_kit.communication",
    "rank": "sparse_operation_kit.communication",
    "num_ranks": "sparse_operation_kit.communication",
    "broadcast_dense_variables": "sparse_operation_kit.dense_sync",
    "allreduce_dense_gradients": "sparse_operation_kit.dense_sync",
    "experiment": "sparse_operation_kit.experiment",
    "dump": "sparse_operation_kit.checkpoint.collective",
    "load": "sparse_operation_kit.checkpoint.collective",
    "incremental_model_dump": "sparse_operation_kit.checkpoint.collective",
}


def _tf_version() -> list[int]:
    """TensorFlow's version as NVIDIA SOK's ``sok.tf_version`` gives it: ``[2, 21, 0]`` (a pre-release
    suffix such as ``rc0`` is dropped)."""
    import re

    import tensorflow as tf

    return [int(re.match(r"\d+", part).group()) for part in tf.__version__.split(".")[:3]]


def __getattr__(name: str):
    if name == "tf_version":  # computed on first use: it imports TensorFlow
        globals()[name] = _tf_version()
        return globals()[name]
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sparse_operation_kit' has no attribute {name!r}")
    import importlib

    imported = importlib.import_module(module)
    value = imported if module.endswith("." + name) else getattr(imported, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, "tf_version"})


__all__ = ["__version__", "get_include", "get_cmake_dir", "print_environment_info", "tf_version", *_LAZY]
