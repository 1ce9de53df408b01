"""A C++ serving program for tests: a SavedModel served with no Python in the process.

``serve_savedmodel.cc`` (beside this module) is a server in 150 lines on TensorFlow's C API: it
loads the op libraries it is given (``TF_LoadLibrary``), a SavedModel's ``serve`` graph and
variables, serves one batch through the serving signature (its inputs fed from files), writes the
output's bytes and prints whether libpython was ever mapped into it. :func:`build` compiles it against the
TensorFlow wheel (``libtensorflow_cc.so.2``); :func:`serve` runs it. sok-core's and sok-hps's tests
hold its outputs bit for bit against Python's.

Example::

    program, why_not = serving_cpp.build(tmp_path)     # None, and why, where it cannot be built
    done = serving_cpp.serve(program, saved, ids, tmp_path, tf_ops.serving_libraries())
    done = serving_cpp.serve(program, saved, {"dense": x, "ids": ids}, tmp_path, libraries)
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
#: The dtypes the program feeds, by TensorFlow's DataType number (DT_FLOAT, DT_INT32, DT_INT64).
_FED = {1: "float32", 3: "int32", 9: "int64"}


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


def serve(
    program: Path,
    path: Path,
    inputs: np.ndarray | dict[str, np.ndarray],
    tmp: Path,
    libraries: list[str],
    env: dict[str, str] | None = None,
    runs: int = 1,
    pause_ms: int = 0,
    every_run: bool = False,
) -> subprocess.CompletedProcess:
    """``program``'s run through the SavedModel at ``path``'s serving signature, loading
    ``libraries`` first: ``inputs`` is the signature's only input, or its inputs by name (each cast
    to the signature's dtype: int64, int32 or float32); its output lands in ``tmp / "out.bin"``: the
    last of ``runs`` runs, ``pause_ms`` apart (time for a server's background work, such as online
    updates), or with ``every_run`` every run's output, one after the other. The environment is
    this process's without any ``PYTHON*`` variable, plus ``env``."""
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((path / "saved_model.pb").read_bytes())
    definition = saved.meta_graphs[0].signature_def["serving_default"]
    if not isinstance(inputs, dict):
        inputs = {next(iter(definition.inputs)): inputs}
    output_name = next(iter(definition.outputs.values())).name
    command = [str(program), str(path), output_name, str(tmp / "out.bin")]
    for i, (key, array) in enumerate(inputs.items()):
        dtype = _FED.get(definition.inputs[key].dtype)
        if dtype is None or not np.can_cast(np.asarray(array).dtype, dtype, casting="same_kind"):
            raise TypeError(
                f"input {key!r}: the signature's dtype {definition.inputs[key].dtype} (a DataType) from "
                f"{np.asarray(array).dtype}; the C++ server feeds int64, int32 or float32"
            )
        array = np.ascontiguousarray(array, dtype=dtype)
        file = tmp / f"feed_{i}.bin"
        array.tofile(file)
        dims = "x".join(str(d) for d in array.shape)
        command += ["--feed", definition.inputs[key].name, str(file), array.dtype.name, dims]
    for library in libraries:
        command += ["--library", library]
    command += ["--runs", str(runs), "--pause-ms", str(pause_ms)] + (["--every-run"] if every_run else [])
    env = (
        {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        | {"TF_CPP_MIN_LOG_LEVEL": "2"}
        | (env or {})
    )
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
