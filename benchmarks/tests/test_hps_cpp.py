"""hps_cpp.py on CPU: one --quick run of two batch sizes, every setup and graph form, three paths.

The run is shared (a module fixture, about half a minute on 2 cores); the per-tier tests read it
and skip, with the reason, a setup whose service or C++ tier is missing here.
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

SCRIPT = Path(hps_cpp.__file__)
TIER_SETUPS = ("evicting_cache", "rocks_db", "redis_cluster")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, dict[str, Any]]:
    out = tmp_path_factory.mktemp("hps_cpp") / "hps_cpp.json"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join([str(SCRIPT.parent), *sys.path])
    command = [sys.executable, str(SCRIPT), "--quick", "--batches", "1", "64", "--iters", "3", "--json", str(out)]
    command += ["--setups", *hps_cpp.SETUPS]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    return done, json.loads(out.read_text())["results"]


def served_setups(results: dict[str, Any]) -> list[str]:
    return [s for s in hps_cpp.SETUPS if s not in results["skipped_setups"]]


def test_quick_run_serves_every_setup_from_python_and_cpp_against_gather(quick_run) -> None:
    done, results = quick_run
    cpp = not results["skipped_cpp"]
    # A setup is skipped exactly where its service is missing, and says why.
    for setup in hps_cpp.SETUPS:
        missing = hps_cpp.setup_missing(setup, cpp=cpp)
        assert results["skipped_setups"].get(setup, "") == missing
        if missing:
            assert f"{setup}: skipped ({missing})" in done.stdout
    setups = served_setups(results)
    assert {"cache", "hash_map"} <= set(setups)
    assert set(results["paths"]) == {f"{s}/{f}" for s in setups for f in hps_cpp.FORMS}
    if not cpp:  # no compiler or no C API here: the Python paths still ran
        assert f"C++: skipped ({results['skipped_cpp']})" in done.stdout
        assert all(set(paths) == {"python", "gather"} for paths in results["paths"].values())
        return
    assert all(set(paths) == {"python", "gather", "C++", "gather C++"} for paths in results["paths"].values())
    assert all(served["libpython"] == "absent" for served in results["cpp"].values())
    assert "PASS: no Python in the C++ process (libpython never mapped)" in done.stdout
    # The graph forms reach the C++ server by their own ops: the whole lookup, or the tables' finds.
    lookup_ops = {name: set(served["models"][0]["ops"]["64"]) for name, served in results["cpp"].items()}
    assert all("SokPyCall" in lookup_ops[f"{s}/before_init"] for s in setups)
    assert all("SokPyCall" not in lookup_ops[f"{s}/running"] for s in ("cache", "hash_map"))
    assert "SokFindOrDefault" in lookup_ops["cache/running"]


@pytest.mark.parametrize("setup", TIER_SETUPS)
def test_cpp_serves_the_tier_setup_rows_as_tf_gather(quick_run, setup: str) -> None:
    done, results = quick_run
    if results["skipped_cpp"]:
        pytest.skip(f"no C++ paths here: {results['skipped_cpp']}")
    if setup in results["skipped_setups"]:
        pytest.skip(f"{setup}: {results['skipped_setups'][setup]}")
    for form in hps_cpp.FORMS:
        hps_rows, gather_rows = (model["batches"] for model in results["cpp"][f"{setup}/{form}"]["models"])
        for b in ("1", "64"):  # before the timed calls and after them (the evicting cache has evicted)
            assert hps_rows[b]["checksum"] == pytest.approx(gather_rows[b]["checksum"], rel=1e-12)
            assert hps_rows[b]["checksum_after"] == pytest.approx(gather_rows[b]["checksum_after"], rel=1e-12)
        assert results["paths"][f"{setup}/{form}"]["C++"]["64"]["p50_ms"] > 0
    if setup == "evicting_cache":
        from hierarchical_parameter_server.cache import capacity_of

        capacity = capacity_of(12288, hps_cpp.EVICTING_CACHE_PER)
        assert capacity < 12288  # the cache evicts: it cannot hold the --quick table
        assert f"evicting_cache: a cache of {capacity} of the 12288 rows" in done.stdout


def test_a_setup_whose_service_or_cpp_tier_is_missing_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    from hierarchical_parameter_server import _tiers

    monkeypatch.setattr(_tiers, "WITH_ROCKSDB", False, raising=False)
    monkeypatch.setattr(_tiers, "WITH_REDIS", True, raising=False)
    assert "_tiers.WITH_ROCKSDB is False" in hps_cpp.setup_missing("rocks_db", cpp=True)
    assert "_tiers.WITH_ROCKSDB" not in hps_cpp.setup_missing("rocks_db", cpp=False)  # --no-cpp: Python's tier only
    which = hps_cpp.shutil.which
    monkeypatch.setattr(hps_cpp.shutil, "which", lambda tool: None if tool == "redis-server" else which(tool))
    assert hps_cpp.setup_missing("redis_cluster", cpp=True) == (
        "no redis-server on PATH to start a local cluster: apt-get install redis-server"
    )
    assert all(hps_cpp.setup_missing(s, cpp=True) == "" for s in ("cache", "hash_map", "evicting_cache"))
