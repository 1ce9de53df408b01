"""The GPU kernels' library (libsok_tf_ops_gpu.so), checked as a build product.

No machine here has a CUDA build of TensorFlow, so its kernels never run in these tests. They check
that it was built when the build found a CUDA toolkit (``lib/gpu_build.txt``), that it has a kernel
for every op, that it depends on no other SOK library, and how the loader treats it.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

tf = pytest.importorskip("tensorflow")

from sparse_operation_kit import tf_ops  # noqa: E402

# Ops without a GPU kernel (the placer would run them on the CPU): none, every op has one.
CPU_ONLY_OPS: set[str] = set()
# Ops whose DEVICE_GPU kernels (inputs and outputs in host memory) libsok_tf_ops.so registers itself
# (csrc/tf_ops/call_ops.cc): the functions they name run on the host in every process.
HOST_KERNEL_OPS = {"SokPyCall", "SokResolveTable"}


def _gpu_library() -> Path:
    """The installed GPU library; skips when the build recorded that it was not built."""
    build = tf_ops.gpu_build()
    if build is None:
        pytest.skip("sok-core was built without its TensorFlow op library (TensorFlow was not importable)")
    if build == "none":
        pytest.skip("no CUDA toolkit was found when sok-core was built (gpu_build.txt: none): no GPU kernels")
    return Path(tf_ops._LIB_DIR) / tf_ops.GPU_LIBRARY


def _tool_output(tool: str, *args: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} (binutils) is not installed")
    return subprocess.run([path, *args], check=True, capture_output=True, text=True).stdout


def test_gpu_library_is_built_when_a_cuda_toolkit_was_found():
    path = _gpu_library()
    assert path.is_file(), f"gpu_build.txt says CUDA {tf_ops.gpu_build()} but {path} is missing"


def test_gpu_library_has_a_kernel_for_every_storage_op():
    path = _gpu_library()
    # Each *_gpu.cc holds a kernel table, a string made from the same list as its registrations.
    tables = re.findall(rb"sok_tf_ops_gpu kernels: ([A-Za-z,]*)\x00", path.read_bytes())
    assert tables, f"{path} holds no kernel table"
    kernels = {name.decode() for table in tables for name in table.split(b",") if name}
    ops = {name for name in dir(tf_ops.library()) if re.fullmatch("Sok[A-Za-z]+", name)}
    assert kernels == ops - CPU_ONLY_OPS - HOST_KERNEL_OPS
    from tensorflow.python.framework import kernels as registry

    for op in HOST_KERNEL_OPS:
        devices = {kernel.device_type for kernel in registry.get_registered_kernels_for_op(op).kernel}
        assert "GPU" in devices, (op, devices)


def test_gpu_library_needs_only_tensorflow_and_system_libraries():
    path = str(_gpu_library())
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", _tool_output("readelf", "-d", path))
    assert "libtensorflow_framework.so.2" in needed
    # No SOK library, and no libcudart (the CUDA runtime is linked statically).
    assert not [name for name in needed if "sok" in name or "cudart" in name], needed
    undefined = _tool_output("nm", "-D", "--undefined-only", path)
    assert not [line for line in undefined.splitlines() if "sok" in line.lower()]


def test_cpu_tensorflow_never_loads_the_gpu_library():
    if tf.test.is_built_with_cuda():
        pytest.skip("TensorFlow is built with CUDA")
    if not os.path.exists("/proc/self/maps"):
        pytest.skip("no /proc/self/maps to list the loaded libraries")
    tf_ops.library()
    assert tf_ops.GPU_LIBRARY not in Path("/proc/self/maps").read_text()


def test_gpu_library_that_fails_to_load_raises_with_the_file_and_the_fix(tmp_path, monkeypatch):
    broken = tmp_path / tf_ops.GPU_LIBRARY
    broken.write_bytes(b"not a shared library")
    (tmp_path / "gpu_build.txt").write_text("13.0.88\n")
    monkeypatch.setattr(tf_ops, "_LIB_DIR", str(tmp_path))
    with pytest.raises(tf_ops.OpLibraryError, match="pip install --no-build-isolation") as error:
        tf_ops._load_gpu_kernels(tf)
    assert str(broken) in str(error.value)
    assert "CUDA 13.0.88" in str(error.value)


def test_missing_gpu_library_under_cuda_tensorflow_logs_the_fix(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(tf_ops, "_LIB_DIR", str(tmp_path))
    with caplog.at_level(logging.WARNING, logger=tf_ops.__name__):
        tf_ops._load_gpu_kernels(tf)
    assert "rebuild sok-core" in caplog.text
