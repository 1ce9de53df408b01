"""A C++ serving program for tests: a SavedModel served with no Python in the process.

``serve_savedmodel.cc`` (beside this module) is a server in 100 lines on TensorFlow's C API: it
loads the op libraries it is given (``TF_LoadLibrary``), a SavedModel's ``serve`` graph and
variables, serves one batch of int64 ids through the serving signature, writes the output's floats
and prints whether libpython was ever mapped into it. :func:`build` compiles it against the
TensorFlow wheel (``libtensorflow_cc.so.2``); :func:`serve` runs it. sok-core's and sok-hps's tests
hold its outputs bit for bit against Python's.

Example::

    program = serving_cpp.build(tmp_path)              # None where this TensorFlow has no C API
    done = serving_cpp.serve(program, saved, ids, tmp_path, tf_ops.serving_libraries())
    assert "libpython: absent" in done.stdout
    rows = np.fromfile(tmp_path / "out.bin", np.float32)
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np

__all__ = ["PROGRAM", "build", "serve"]

PROGRAM = Path(__file__).with_name("serve_savedmodel.cc")


def build(directory: Path) -> tuple[Path | None, str]:
    """``(program, "")`` compiled into ``directory`` against this TensorFlow's headers and
    libraries, or ``(None, why not)`` where there is no C++ compiler or no C API in the wheel.

    Raises:
        AssertionError: the compiler failed (its messages in the error)."""
    import tensorflow as tf

    compiler = shutil.which("g++") or shutil.which("c++")
    include, lib = Path(tf.sysconfig.get_include()), Path(tf.sysconfig.get_lib())
    if compiler is None or not (include / "tensorflow" / "c" / "c_api.h").exists():
        return None, "no C++ compiler, or this TensorFlow has no C API headers"
    if not (lib / "libtensorflow_cc.so.2").exists():
        return None, f"no libtensorflow_cc.so.2 in {lib}"
    binary = directory / "serve_savedmodel"
    command = [compiler, "-std=c++17", "-O1", str(PROGRAM), f"-I{include}", f"-L{lib}", "-l:libtensorflow_cc.so.2"]
    command += ["-l:libtensorflow_framework.so.2", f"-Wl,-rpath,{lib}", "-o", str(binary)]
    built = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    return binary, ""


def serve(program: Path, path: Path, ids: np.ndarray, tmp: Path, libraries: list[str]) -> subprocess.CompletedProcess:
    """``program``'s run on ``ids`` (int64 ``[rows, cols]``) through the SavedModel at ``path``'s
    serving signature, loading ``libraries`` first, with no ``PYTHON*`` variable in its environment;
    its output lands in ``tmp / "out.bin"``."""
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((path / "saved_model.pb").read_bytes())
    definition = saved.meta_graphs[0].signature_def["serving_default"]
    input_name = next(iter(definition.inputs.values())).name
    output_name = next(iter(definition.outputs.values())).name
    ids.astype(np.int64).tofile(tmp / "ids.bin")
    command = [str(program), str(path), input_name, output_name, str(tmp / "ids.bin"), *map(str, ids.shape)]
    command += [str(tmp / "out.bin"), *libraries]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")} | {"TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
