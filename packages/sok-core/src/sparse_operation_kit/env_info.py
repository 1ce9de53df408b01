"""Environment facts for bug reports: ``sok info`` and :func:`print_environment_info`."""

from __future__ import annotations

import os
import platform
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Any, TextIO

from sparse_operation_kit.plugins.registry import STORAGE_API_VERSION, get_registry, import_path

#: Distribution names TensorFlow is published under (CPU, GPU and vendor builds).
TF_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "intel-tensorflow", "tf-nightly")


def _dist_version(*names: str) -> str | None:
    for name in names:
        try:
            return f"{version(name)} ({name})"
        except PackageNotFoundError:
            continue
    return None


def _cuda_devices(backends: list[dict[str, Any]]) -> list[str]:
    """The CUDA devices each CUDA build of a backend sees (through sok-core's binding of the C ABI,
    ``sparse_operation_kit._table``, which drives its tables)."""
    found = []
    for backend in backends:
        path = backend["build_path"]
        if not backend["build"].get("cuda") or not isinstance(path, str):
            continue
        try:
            count = import_path("sparse_operation_kit._table:cuda_device_count")()
        except Exception as error:  # reported, not raised: this feeds bug reports
            found.append(f"CUDA ({backend['name']} build): unavailable: {type(error).__name__}: {error}")
            continue
        found.append(f"CUDA ({backend['name']} build): {count} device(s)")
    return found


def _devices(with_tensorflow: bool) -> list[str]:
    devices = [f"CPU: {os.cpu_count()} logical cores"]
    if with_tensorflow:
        try:
            import tensorflow as tf

            devices += [
                f"TensorFlow {d.device_type}: {d.name}"
                for d in tf.config.list_physical_devices()
                if d.device_type != "CPU"
            ]
        except Exception as error:  # a broken TF install is a fact worth reporting, not a crash
            devices.append(f"TensorFlow devices unavailable: {type(error).__name__}: {error}")
    return devices


def _tf_gpu_kernels() -> str:
    """Whether sok-core's TensorFlow op library has its GPU kernels (and for which CUDA)."""
    from sparse_operation_kit import tf_ops

    built = tf_ops.gpu_build()
    if built is None:
        return "no TensorFlow op library in this build"
    return "not built (no CUDA toolkit at build time)" if built == "none" else f"built for CUDA {built}"


def _nccl_exchange() -> str:
    """Whether sok-core has its own NCCL collectives for the lookup's exchange on GPU ranks."""
    from sparse_operation_kit import tf_ops

    if tf_ops.nccl_built():
        return "built (the lookup's exchange on GPU ranks uses them unless SOK_EXCHANGE=horovod)"
    return "not built (no NCCL at build time: the lookup's exchange uses Horovod's collectives)"


def _serving_libraries() -> str:
    """The op libraries a C++ server loads to run SOK's ops (``tf_ops.serving_libraries``)."""
    from sparse_operation_kit import tf_ops

    return " ".join(tf_ops.serving_libraries()) or "none (no TensorFlow op library in this build)"


def _table_homes(var_types: list[str]) -> dict[str, str]:
    """Where a new DynamicVariable's table of each var_type goes by default (needs TensorFlow)."""
    homes = {}
    for var_type in var_types:
        try:
            from sparse_operation_kit import placement, tf_ops

            tf_ops.library()
            homes[var_type] = placement.default_home(var_type)
        except Exception as error:  # reported, not raised: this feeds bug reports
            homes[var_type] = f"unknown: {type(error).__name__}: {error}"
    return homes


def environment_info(with_tensorflow: bool = True) -> dict[str, Any]:
    """Facts as a dict: versions, backends (with build facts) and devices.

    ``with_tensorflow=False`` skips importing TensorFlow (it is slow to import).
    """
    from sparse_operation_kit import __version__

    registry = get_registry()
    backends = []
    for spec in registry.backends():
        backends.append(
            {
                "name": spec.name,
                "var_types": list(spec.var_types),
                "package": spec.package,
                "version": spec.version,
                "capabilities": spec.capabilities.__dict__,
                "build": registry.build_info(spec),
                "build_path": spec.build_info,
            }
        )
    return {
        "python": f"{platform.python_version()} ({sys.executable})",
        "platform": platform.platform(),
        "sok-core": __version__,
        "storage_api_version": STORAGE_API_VERSION,
        "numpy": _dist_version("numpy"),
        "tensorflow": _dist_version(*TF_DISTRIBUTIONS),
        "horovod": _dist_version("horovod"),
        "pluggy": _dist_version("pluggy"),
        "backends": backends,
        "var_types": registry.var_types(),
        "devices": _devices(with_tensorflow) + _cuda_devices(backends),
        "tf_gpu_kernels": _tf_gpu_kernels(),
        "nccl_exchange": _nccl_exchange(),
        "serving_libraries": _serving_libraries(),
        "table_homes": _table_homes(registry.var_types()) if with_tensorflow else {},
    }


def print_environment_info(file: TextIO | None = None, with_tensorflow: bool = True) -> None:
    """Print :func:`environment_info` as aligned text."""
    out = file or sys.stdout
    info = environment_info(with_tensorflow)
    for key in (
        "python",
        "platform",
        "sok-core",
        "storage_api_version",
        "numpy",
        "tensorflow",
        "horovod",
        "pluggy",
        "tf_gpu_kernels",
        "nccl_exchange",
        "serving_libraries",
    ):
        print(f"{key:<20} {info[key] if info[key] is not None else 'not installed'}", file=out)
    print(
        f"{'var_types':<20} {', '.join(info['var_types']) or 'none (install sok-core[det] or sok-core[hkv])'}", file=out
    )
    for backend in info["backends"]:
        build = backend["build"]
        if "error" in build:
            build_text = f"failed to load: {build['error']}"
        else:
            cuda = f"CUDA (archs {build.get('cuda_archs')})" if build.get("cuda") else "CPU only"
            build_text = f"{cuda}, storage API v{build.get('api_version', '?')}"
        caps = backend["capabilities"]
        print(
            f"{'backend ' + backend['name']:<20} var_types={','.join(backend['var_types'])} "
            f"{backend['package']} {backend['version']}: {build_text}; eviction={caps['eviction']} "
            f"export_if={caps['export_if']} host_memory={caps['host_memory']} "
            f"devices={','.join(caps['devices'])} keys={','.join(caps['key_dtypes'])}",
            file=out,
        )
    for device in info["devices"]:
        print(f"{'device':<20} {device}", file=out)
    for var_type, home in info["table_homes"].items():
        print(f"{'tables ' + var_type:<20} {home} by default (tf.device chooses)", file=out)
