"""hps_cpp.py on CPU: a --quick run of two batch sizes, every setup and graph form, three paths."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("hierarchical_parameter_server")
import hps_cpp  # noqa: E402

SCRIPT = Path(hps_cpp.__file__)


def test_quick_run_serves_every_setup_from_python_and_cpp_against_gather(tmp_path: Path) -> None:
    out = tmp_path / "hps_cpp.json"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join([str(SCRIPT.parent), *sys.path])
    command = [sys.executable, str(SCRIPT), "--quick", "--batches", "1", "64", "--iters", "3", "--json", str(out)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads(out.read_text())["results"]
    names = {f"{s}/{f}" for s in hps_cpp.SETUPS for f in hps_cpp.FORMS}
    assert set(results["paths"]) == names
    if results["skipped_cpp"]:  # no compiler or no C API here: the Python paths still ran
        assert f"C++: skipped ({results['skipped_cpp']})" in done.stdout
        assert all(set(paths) == {"python", "gather"} for paths in results["paths"].values())
        return
    assert all(set(paths) == {"python", "gather", "C++", "gather C++"} for paths in results["paths"].values())
    assert all(served["libpython"] == "absent" for served in results["cpp"].values())
    assert "PASS: no Python in the C++ process (libpython never mapped)" in done.stdout
    # The graph forms reach the C++ server by their own ops: the whole lookup, or the tables' finds.
    lookup_ops = {name: set(served["models"][0]["ops"]["64"]) for name, served in results["cpp"].items()}
    assert all("SokPyCall" in lookup_ops[f"{s}/before_init"] for s in hps_cpp.SETUPS)
    assert all("SokPyCall" not in lookup_ops[f"{s}/running"] for s in hps_cpp.SETUPS)
    assert "SokFindOrDefault" in lookup_ops["cache/running"]
