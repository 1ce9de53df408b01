"""print_environment_info and the `sok` command line."""

from __future__ import annotations

import io
import subprocess
import sys

import sparse_operation_kit as sok
from sparse_operation_kit.cli import main
from sparse_operation_kit.env_info import environment_info, print_environment_info


def test_environment_info_lists_both_backends_and_their_builds():
    info = environment_info(with_tensorflow=False)
    assert {"hbm", "hybrid"} <= set(info["var_types"])
    builds = {b["name"]: b["build"] for b in info["backends"]}
    for name in ("det", "hkv"):
        assert builds[name]["version"] == sok.__version__
        assert builds[name]["cuda"] in (True, False)
        assert "error" not in builds[name]


def test_environment_info_reports_cuda_devices_of_cuda_builds_and_the_tf_gpu_kernels():
    info = environment_info(with_tensorflow=False)
    for backend in info["backends"]:
        lines = [d for d in info["devices"] if d.startswith(f"CUDA ({backend['name']} build)")]
        if backend["build"].get("cuda"):
            assert len(lines) == 1 and lines[0].endswith("device(s)"), info["devices"]
        else:
            assert lines == []
    assert info["tf_gpu_kernels"].startswith(("built for CUDA", "not built", "no TensorFlow op library"))


def test_print_environment_info_from_a_fresh_interpreter():
    out = subprocess.run(
        [sys.executable, "-c", "import sparse_operation_kit as sok; sok.print_environment_info()"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert "var_types            hbm, hybrid" in out
    assert "tensorflow           2.21" in out
    assert "backend det" in out and "backend hkv" in out


def test_cli_info(capsys):
    assert main(["info", "--no-tensorflow"]) == 0
    assert "backend hkv" in capsys.readouterr().out


def test_cli_demo_runs_small(capsys):
    assert main(["demo", "--part", "storage", "--keys", "5000", "--storage-dim", "4", "--batch", "1000"]) == 0
    out = capsys.readouterr().out
    assert "var_type 'hbm'" in out and "var_type 'hybrid'" in out
    assert "evicted" in out


def test_cli_reports_bad_arguments_without_a_traceback(capsys):
    assert main(["demo", "--keys", "0"]) == 2
    assert "keys, dim and batch must be >= 1" in capsys.readouterr().err


def test_print_environment_info_takes_a_file():
    buffer = io.StringIO()
    sok.print_environment_info(file=buffer)
    assert "sok-core" in buffer.getvalue()


def test_environment_info_says_whether_the_nccl_exchange_was_built(tmp_path, monkeypatch):
    from sparse_operation_kit import tf_ops

    monkeypatch.setattr(tf_ops, "_LIB_DIR", str(tmp_path))
    assert environment_info(with_tensorflow=False)["nccl_exchange"].startswith("not built (no NCCL at build time")
    (tmp_path / tf_ops.NCCL_LIBRARY).write_bytes(b"")
    info = environment_info(with_tensorflow=False)
    assert info["nccl_exchange"].startswith("built (the lookup's exchange on GPU ranks uses them")
    out = io.StringIO()
    print_environment_info(out, with_tensorflow=False)
    assert "nccl_exchange        built" in out.getvalue()


def test_environment_info_names_the_libraries_a_cpp_server_loads(tmp_path, monkeypatch):
    from sparse_operation_kit import tf_ops

    monkeypatch.setattr(tf_ops, "_LIB_DIR", str(tmp_path))
    assert environment_info(with_tensorflow=False)["serving_libraries"].startswith("none (no TensorFlow op library")
    for name in (tf_ops.LIBRARY, tf_ops.GPU_LIBRARY):
        (tmp_path / name).write_bytes(b"")
    expected = f"{tmp_path / tf_ops.LIBRARY} {tmp_path / tf_ops.GPU_LIBRARY}"
    assert environment_info(with_tensorflow=False)["serving_libraries"] == expected
    out = io.StringIO()
    print_environment_info(out, with_tensorflow=False)
    assert f"serving_libraries    {expected}" in out.getvalue()
