"""profile_step.py on CPU: a --quick run in one process, its phases and the summaries of its traces."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import profile_step

SCRIPT = Path(profile_step.__file__)


def test_quick_run_times_every_phase_and_summarizes_its_traces(tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--kinds", "static", "--top", "100",
         "--trace-dir", str(tmp_path / "traces"), "--json", str(out)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (result,) = json.loads(out.read_text())["results"]
    assert (result["kind"], result["dim"]) == ("static", 8)
    assert set(result["ms"]) == {*profile_step.PHASES, "forward, RaggedTensor arguments"}
    assert all(ms > 0 for ms in result["ms"].values())
    assert set(result["traces"]) == set(profile_step.PHASES)
    step_ops = {name: count for name, _, count in result["traces"]["step"]["op_types"]}
    # Every static table's Adagrad step in one op, and no tf.unique left in the step.
    assert step_ops.get("SokSparseApplyAdagradTables") == 1
    assert "Unique" not in step_ops
    assert "SokSparseApplyAdagradTables" not in {name for name, _, _ in result["traces"]["backward"]["op_types"]}
    assert "== trace of static dim 8, step: per step" in done.stdout

    xplanes = sorted((tmp_path / "traces" / "static_dim8_step").rglob("*.xplane.pb"))
    summary = profile_step.summarize_xplane(str(xplanes[-1]), steps=2, top=5)
    assert summary["ops_per_step"] == result["traces"]["step"]["ops_per_step"]
    assert summary["syncs_per_step"] is None  # a CPU trace has no CUDA API calls: not counted as 0


def test_idle_gaps_say_what_the_host_ran_while_the_gpu_waited() -> None:
    us = 1_000_000  # picoseconds
    gpu = [(0, 10 * us), (5 * us, 12 * us), (12 * us + 5, 20 * us), (100 * us, 110 * us), (150 * us, 151 * us)]
    host = [(15 * us, 60 * us, "a/Sok:SokLookup"), (50 * us, 70 * us, "b:Cast"), (120 * us, 200 * us, "c:Send")]
    gaps = profile_step.idle_gaps(gpu, host, top=5)
    # gaps of 20 us or more: 20-100 and 110-150 (12-12.000005 is a launch's latency)
    assert gaps["gaps"] == 2 and gaps["idle_us"] == 120
    assert dict(gaps["by_op"]) == {"a/Sok:SokLookup": 40, "b:Cast": 20, "c:Send": 30}
    assert gaps["no_op_us"] == 30 + 10  # 70-100 and 110-120
