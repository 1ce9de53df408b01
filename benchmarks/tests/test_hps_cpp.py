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


# -- the PCIe floor (--device gpu) ------------------------------------------------------------------
def copy_bandwidth_line(sizes: dict[int, tuple[float, float]]) -> str:
    """A line as copy_bandwidth prints it: per size in bytes, its (host-to-GPU, GPU-to-host) ms."""
    entries = [
        {"bytes": b, "h2d_ms": h, "d2h_ms": d, "h2d_gbps": b / (h * 1e6), "d2h_gbps": b / (d * 1e6)}
        for b, (h, d) in sizes.items()
    ]
    return json.dumps({"device": 0, "name": "NVIDIA H200", "iters": 30, "warmup": 3, "sizes": entries})


def test_copy_bandwidths_line_is_read_and_every_size_checked() -> None:
    line = copy_bandwidth_line({1000: (0.01, 0.02), 2000: (0.02, 0.05)})
    measured = hps_cpp.parse_copy_bandwidth("some banner\n" + line + "\n", [1000, 2000])
    assert (measured["name"], measured["iters"], measured["warmup"]) == ("NVIDIA H200", 30, 3)
    assert measured["sizes"][2000] == pytest.approx({"h2d_ms": 0.02, "d2h_ms": 0.05, "h2d_gbps": 0.1, "d2h_gbps": 0.04})
    with pytest.raises(ValueError, match=r"not its JSON line with the sizes \[1000, 3000\] \(KeyError: 3000\)"):
        hps_cpp.parse_copy_bandwidth(line, [1000, 3000])
    with pytest.raises(ValueError, match=r"not its JSON line .*JSONDecodeError.*'copy_bandwidth: no CUDA device'"):
        hps_cpp.parse_copy_bandwidth("copy_bandwidth: no CUDA device", [1000])
    with pytest.raises(ValueError, match=r"not positive: \{1000: "):
        hps_cpp.parse_copy_bandwidth(line.replace('"h2d_ms": 0.01', '"h2d_ms": 0.0'), [1000])


def test_the_floor_of_b_is_its_rows_bytes_over_the_measured_host_to_gpu_bandwidth() -> None:
    dim, batches = 32, [1, 4096]
    sizes = {hps_cpp.rows_bytes(b, dim): (0.004 * (b + 1), 0.005 * (b + 1)) for b in batches}
    measured = hps_cpp.parse_copy_bandwidth(copy_bandwidth_line(sizes), sorted(sizes))
    floor = hps_cpp.link_floor(measured, batches, dim)
    assert hps_cpp.rows_bytes(4096, dim) == 4096 * 26 * 32 * 4
    for b in batches:
        size = b * 26 * dim * 4
        gbps = size / (0.004 * (b + 1) * 1e6)
        assert floor[b] == pytest.approx(
            {"bytes": size, "h2d_gbps": gbps, "d2h_gbps": gbps * 0.8, "floor_ms": size / (gbps * 1e6)}
        )
        assert floor[b]["floor_ms"] == pytest.approx(0.004 * (b + 1))  # the median copy of those bytes
    # C++ gather 2 ms plus a 1 ms floor, against a C++ path of 6 ms: half as fast as a host tier could be
    assert hps_cpp.host_tier_ratio(2.0, 1.0, 6.0) == pytest.approx(0.5)


def floor_args(**overrides: Any) -> Any:
    args = hps_cpp.parse_args(["--quick", "--batches", "1", "4", "--iters", "2", "--warmup", "1"])
    args.device = "/CPU:0"  # TensorFlow's copy runs here too; on a GPU host it is the fallback's
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def test_without_nvcc_the_floor_is_tensorflows_copy_and_says_so(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setattr(hps_cpp, "find_nvcc", lambda: None)
    args = floor_args()
    floor = hps_cpp.pcie_floor(args, str(tmp_path))
    assert floor["source"] == "tensorflow_copy"
    assert floor["why"].startswith("nvcc not found (not on PATH, in $CUDA_HOME/bin or /usr/local/cuda/bin)")
    assert "falling back to TensorFlow's copy from a pageable host tensor" in capsys.readouterr().out
    assert sorted(floor["batches"]) == [1, 4]
    for b, f in floor["batches"].items():
        assert f["bytes"] == hps_cpp.rows_bytes(b, args.dim) and f["floor_ms"] > 0
        assert f["h2d_gbps"] == pytest.approx(f["bytes"] / (f["floor_ms"] * 1e6))
    # The ratio of the setups with their C++ rows in host memory, from the C++ paths' p50s.
    p50 = {"C++": 4.0, "gather C++": 1.0, "python": 9.0, "gather": 1.0}
    paths = {label: {b: {"p50_ms": ms} for b in (1, 4)} for label, ms in p50.items()}
    results = {"pcie_floor": floor, "paths": {"hash_map/running": paths, "cache/running": paths}}
    hps_cpp.print_floor(args, results)
    out = capsys.readouterr().out
    assert (
        "PCIe floor: TensorFlow's copy of the rows' bytes from a pageable host tensor to the GPU, NOT the link's" in out
    )
    want = [(1.0 + floor["batches"][b]["floor_ms"]) / 4.0 for b in (1, 4)]
    assert f"  hash_map/running: B=1: {want[0]:.2f}, B=4: {want[1]:.2f}" in out
    assert "cache/running" not in out  # its C++ rows are on the GPU
    assert paths["C++"][4]["vs_host_floor"] == pytest.approx(want[1])


def test_a_copy_bandwidth_that_fails_falls_back_naming_its_error(monkeypatch, tmp_path) -> None:
    failing = tmp_path / "copy_bandwidth"
    failing.write_text(
        "#!/bin/sh\necho 'copy_bandwidth: cudaMallocHost failed: cudaErrorMemoryAllocation' >&2\nexit 1\n"
    )
    failing.chmod(0o755)
    monkeypatch.setattr(hps_cpp, "build_copy_bandwidth", lambda directory: (str(failing), ""))
    floor = hps_cpp.pcie_floor(floor_args(), str(tmp_path))
    assert floor["source"] == "tensorflow_copy"
    assert (
        floor["why"]
        == "copy_bandwidth failed (exit status 1): copy_bandwidth: cudaMallocHost failed: cudaErrorMemoryAllocation"
    )


@pytest.fixture(scope="module")
def copy_bandwidth(tmp_path_factory: pytest.TempPathFactory) -> str:
    if hps_cpp.find_nvcc() is None:
        pytest.skip("no nvcc here (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)")
    program, why_not = hps_cpp.build_copy_bandwidth(str(tmp_path_factory.mktemp("copy_bandwidth")))
    assert program is not None, why_not
    return program


def test_copy_bandwidth_refuses_a_bad_command_line(copy_bandwidth) -> None:
    for argv, message in [
        ([], "no sizes given"),
        (["--iters", "0", "64"], "--iters must be an integer >= 1, got '0'"),
        (["64", "1x"], "BYTES must be an integer >= 1, got '1x'"),
        (["--mode", "64"], "unknown option '--mode'"),
    ]:
        done = subprocess.run([copy_bandwidth, *argv], capture_output=True, text=True, timeout=60)
        assert (done.returncode, done.stdout) == (2, ""), argv
        assert done.stderr.startswith(f"copy_bandwidth: {message}\nusage: copy_bandwidth "), done.stderr


def test_copy_bandwidth_without_a_gpu_says_so(copy_bandwidth) -> None:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([copy_bandwidth, "64"], capture_output=True, text=True, timeout=60, env=env)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.startswith("copy_bandwidth: no CUDA device (cudaGetDeviceCount: cudaError"), done.stderr


@pytest.mark.gpu
def test_copy_bandwidth_measures_both_ways_on_a_gpu(copy_bandwidth) -> None:
    import tensorflow as tf

    if not tf.config.list_physical_devices("GPU"):
        pytest.skip("TensorFlow sees no GPU")
    sizes = [4096, 1 << 24]
    done = subprocess.run(
        [copy_bandwidth, "--iters", "5", "--warmup", "1", *map(str, sizes)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    measured = hps_cpp.parse_copy_bandwidth(done.stdout, sizes)  # every figure positive
    assert measured["name"] and (measured["iters"], measured["warmup"]) == (5, 1)
    for b in sizes:
        assert measured["sizes"][b]["h2d_gbps"] == pytest.approx(b / (measured["sizes"][b]["h2d_ms"] * 1e6), rel=1e-3)
