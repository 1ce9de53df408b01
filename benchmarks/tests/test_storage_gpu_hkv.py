"""storage_gpu.py --hkv on CPU: the plan of HKV's run, the driver's command line, the parser of
HKV's printed table and the subprocess around it (no GPU, no CuPy: a stand-in driver prints)."""

from __future__ import annotations

import shlex
import stat
import sys
from pathlib import Path

import numpy as np
import pytest
import storage_gpu
from storage_gpu import MI, Config, HkvError, HkvPlan, hkv_plan, parse_hkv_output, run_hkv

#: Blanks test_main prints before each API's figure (its switch in merlin_hashtable_benchmark.cc.cu).
HKV_BLANKS = {"insert_or_assign": 11, "find": 1, "find_or_insert": 9, "insert_and_evict": 11, "export_batch": 7}


def printed(plan: HkvPlan, figures: np.ndarray) -> str:
    """What hkv_driver prints for ``plan``: its "# " lines and header, then test_main's rows, each
    "| λ " and per API "|" + blanks + the figure as std::setw(6) << std::setprecision(3) << fixed,
    then "|"."""
    lines = ["# HKV: HierarchicalKV test", "# GPU: none", "| λ |" + "".join(f" {api} |" for api in plan.apis)]
    lines.append("|---:|" + "---:|" * len(plan.apis))
    for lam, row in zip(plan.lambdas, figures):
        cells = "".join(f"|{' ' * HKV_BLANKS[api]}{value:6.3f} " for api, value in zip(plan.apis, row))
        lines.append(f"| {lam:.2f} {cells}|")
    return "\n".join(lines) + "\n"


@pytest.fixture
def plan() -> HkvPlan:
    return hkv_plan(Config("device", 8, 4 * MI), [0.5, 0.75, 1.0])


@pytest.fixture
def figures(plan: HkvPlan) -> np.ndarray:
    return np.random.default_rng(0).uniform(0.01, 12.0, size=(len(plan.lambdas), len(plan.apis)))


def test_parser_reads_every_figure_of_hkvs_rows(plan: HkvPlan, figures: np.ndarray) -> None:
    parsed, source = parse_hkv_output(printed(plan, figures), plan)
    assert source == "HierarchicalKV test"
    assert list(parsed) == list(plan.lambdas)
    got = np.array([[parsed[lam][api] for api in plan.apis] for lam in plan.lambdas])
    np.testing.assert_array_equal(got, np.round(figures, 3))


def test_parser_says_when_hkv_skipped_for_want_of_free_hbm(plan: HkvPlan) -> None:
    text = printed(plan, np.empty((0, len(plan.apis)))) + "free HBM is not enough, ignore current benchmark!\n"
    with pytest.raises(HkvError, match=f"less than {plan.hbm_gb} GiB of device memory was free"):
        parse_hkv_output(text, plan)


def test_parser_refuses_output_without_a_row_per_lambda(plan: HkvPlan, figures: np.ndarray) -> None:
    with pytest.raises(HkvError, match="printed 2 rows for 3 λ values"):
        parse_hkv_output(printed(plan, figures[:-1]), plan)


def test_parser_refuses_a_row_cut_short(plan: HkvPlan, figures: np.ndarray) -> None:
    # test_main ends a row with "|" after its last API; a run stopped during the last API leaves it open.
    text = printed(plan, figures).rstrip().rsplit("|", 2)[0]
    with pytest.raises(HkvError, match="row for λ 1.00 is cut short"):
        parse_hkv_output(text, plan)


def test_parser_refuses_a_header_of_other_apis(plan: HkvPlan, figures: np.ndarray) -> None:
    other = HkvPlan(plan.mode, plan.dim, plan.capacity, plan.hbm_gb, plan.lambdas, plan.apis[::-1])
    with pytest.raises(HkvError, match="header names"):
        parse_hkv_output(printed(plan, figures), other)


@pytest.mark.parametrize("dim", [8, 32, 64, 128])
@pytest.mark.parametrize("capacity_mi", [4, 32, 64])
def test_device_plan_gives_whole_gib_that_hold_every_row(dim: int, capacity_mi: int) -> None:
    plan = hkv_plan(Config("device", dim, capacity_mi * MI), [0.5])
    rows = capacity_mi * MI * dim * 4
    assert plan.capacity == capacity_mi * MI
    assert (plan.hbm_gb - 1) * 2**30 < rows <= plan.hbm_gb * 2**30
    assert plan.apis == storage_gpu.HKV_APIS


@pytest.mark.parametrize("capacity_mi", [2, 4, 16, 128])
def test_hybrid_plan_puts_half_the_rows_in_hbm(capacity_mi: int) -> None:
    ours = capacity_mi * MI
    plan = hkv_plan(Config("hybrid", 64, ours), [0.5])
    assert plan.hbm_gb * 2**30 * 2 == plan.capacity * 64 * 4
    ratio = plan.capacity // ours
    assert plan.capacity % ours == 0 and ratio & (ratio - 1) == 0  # a power-of-two multiple of ours
    assert ratio == 1 or ours * 64 * 4 // 2 % 2**30 != 0  # larger only where half of ours is not whole GiB
    assert "insert_and_evict" not in plan.apis  # HKV allows it in pure HBM mode only


def test_command_gives_the_driver_the_plan(plan: HkvPlan) -> None:
    command = plan.command(Path("/bin/hkv_driver"))
    options = dict(zip(command[1::2], command[2::2]))
    assert command[0] == "/bin/hkv_driver" and len(command) == 1 + 2 * len(options)
    assert [float(lam) for lam in options.pop("--lambdas").split(",")] == list(plan.lambdas)
    assert options == {
        "--dim": str(plan.dim),
        "--capacity": str(plan.capacity),
        "--hbm-gb": str(plan.hbm_gb),
        "--keys-per-op": str(storage_gpu.KEYS_PER_CALL),
        "--apis": ",".join(plan.apis),
    }


def stand_in_driver(tmp_path: Path, stdout: str, stderr: str = "", status: int = 0, sleep: float = 0) -> Path:
    """An executable that prints what it is given, as hkv_driver would, and exits with ``status``."""
    program = tmp_path / "hkv_driver.py"
    program.write_text(
        f"import sys, time\nsys.stdout.write({stdout!r})\nsys.stdout.flush()\n"
        f"sys.stderr.write({stderr!r})\ntime.sleep({sleep})\nsys.exit({status})\n"
    )
    script = tmp_path / "hkv_driver"
    script.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(program))} "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_run_hkv_takes_the_figures_of_a_driver_that_succeeds(
    tmp_path: Path, plan: HkvPlan, figures: np.ndarray
) -> None:
    baseline = run_hkv(stand_in_driver(tmp_path, printed(plan, figures)), plan, timeout=60)
    assert baseline.error == "" and baseline.source == "run"
    assert baseline.figure(1.0, "export_batch") == round(float(figures[2, -1]), 3)
    assert shlex.split(baseline.command) == plan.command(tmp_path / "hkv_driver")


def test_run_hkv_reports_the_command_and_stderr_of_a_failing_driver(tmp_path: Path, plan: HkvPlan) -> None:
    driver = stand_in_driver(tmp_path, "# HKV: x\n", "hkv_driver: CUDA error cudaErrorNoDevice\n", status=1)
    baseline = run_hkv(driver, plan, timeout=60)
    assert "exited with status 1" in baseline.error and "cudaErrorNoDevice" in baseline.error
    assert baseline.command in baseline.error and baseline.figures == {}


def test_run_hkv_stops_a_driver_past_the_timeout(tmp_path: Path, plan: HkvPlan, figures: np.ndarray) -> None:
    driver = stand_in_driver(tmp_path, printed(plan, figures[:1]), sleep=30)
    baseline = run_hkv(driver, plan, timeout=1)
    assert "ran past --hkv-timeout 1 s" in baseline.error and "| 0.50 |" in baseline.error
    assert baseline.figures == {}
