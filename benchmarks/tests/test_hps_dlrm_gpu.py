"""hps_dlrm_gpu.py on CPU: the DLRM inference served from Python, then from C++ with no Python.

One ``--device cpu --cpp`` run on a tiny table (a module fixture, about 20 s on 2 cores, half of it
compiling the driver); skipped, with the reason, where the C++ driver cannot be built or the
serving libraries are missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("hierarchical_parameter_server")
import hps_cpp  # noqa: E402
import hps_dlrm_gpu  # noqa: E402

SCRIPT = Path(hps_dlrm_gpu.__file__)
BATCHES = (8, 64)


def cpp_missing() -> str:
    return hps_cpp.driver_missing() or hps_cpp.serving_libraries()[1]


def script_env() -> dict[str, str]:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join([str(SCRIPT.parent), *sys.path])
    return env


@pytest.fixture(scope="module")
def cpp_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, dict[str, Any]]:
    missing = cpp_missing()
    if missing:
        pytest.skip(f"no C++ path here: {missing}")
    out = tmp_path_factory.mktemp("hps_dlrm") / "hps_dlrm.json"
    command = [sys.executable, str(SCRIPT), "--device", "cpu", "--cpp", "--rows", "4096", "--iters", "3"]
    command += ["--warmup", "1", "--batches", *map(str, BATCHES), "--json", str(out)]
    done = subprocess.run(command, env=script_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done, json.loads(out.read_text())["results"]


def test_cpp_serves_the_dlrm_without_python(cpp_run) -> None:
    done, results = cpp_run
    cpp = results["cpp"]
    assert cpp["libpython"] == "absent"
    assert "libpython absent" in done.stdout
    for b in map(str, BATCHES):
        assert cpp["hps"][b]["p50_ms"] > 0 and cpp["gather"][b]["p50_ms"] > 0
        # The HPS model's lookup ran in the C++ process: its traced calls hold the cache's find.
        assert "SokFind" in cpp["ops"][b]


def test_cpp_outputs_equal_python(cpp_run) -> None:
    _, results = cpp_run
    for b in BATCHES:
        python = results["python_checksum"][str(b)]
        assert python > 0  # sigmoid outputs: a sum of B values in (0, 1)
        want = pytest.approx(python, rel=hps_dlrm_gpu.SUM_RTOL, abs=hps_dlrm_gpu.SUM_ATOL_PER_SAMPLE * b)
        for model in ("hps", "gather"):  # before the warmup and after the timed calls
            assert results["cpp"][model][str(b)]["checksum"] == want
            assert results["cpp"][model][str(b)]["checksum_after"] == want


def test_without_a_gpu_the_default_device_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    import tensorflow as tf

    if tf.config.list_logical_devices("GPU"):
        pytest.skip("TensorFlow sees a GPU here")
    assert hps_dlrm_gpu.main(["--rows", "4096"]) == 2
    assert "needs a GPU" in capsys.readouterr().err


def test_check_with_cpp_fails_above_the_published_figure_from_1024() -> None:
    # 256: below the C++ goal's batches; 1,024 at the figure (849 us) passes; 2,048 above (1,059 us)
    # fails; 3,000: no figure.
    p50_ms = {256: 10.0, 1024: 0.849, 2048: 1.2, 3000: 99.0}
    assert hps_dlrm_gpu.slower_than_published(p50_ms, hps_dlrm_gpu.CPP_CHECK_MIN_BATCH) == [
        "B=2048: 1.200 ms > 1.059 ms"
    ]
    assert hps_dlrm_gpu.slower_than_published(p50_ms, hps_dlrm_gpu.PYTHON_CHECK_MIN_BATCH) == []


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> str:
    missing = cpp_missing()
    if missing:
        pytest.skip(f"no C++ driver here: {missing}")
    program, why_not = hps_cpp.build_driver(str(tmp_path_factory.mktemp("driver")))
    assert program is not None, why_not
    return program


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--dense", "d", "--model", "m", "i", "o"], "--dense NAME names an input of the --model before it"),
        (["--model", "m", "i", "o", "--dense", "d"], "--dense needs --floats FILE and --float-cols D"),
        (["--model", "m", "i", "o", "--floats", "f", "--float-cols", "13"], "no --model has one"),
        (["--model", "m", "i", "o", "--dense", "d", "--dense", "e"], "--dense is given twice for --model m"),
        (["--model", "m", "i", "o", "--ids-dtype", "int16"], "--ids-dtype takes int64 or int32, not 'int16'"),
    ],
)
def test_driver_refuses_a_wrong_dense_or_ids_option(driver: str, arguments: list[str], message: str) -> None:
    command = [driver, "--ids", "ids.bin", "--cols", "26", "--batches", "8", *arguments]
    done = subprocess.run(command, env=script_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert message in done.stderr
