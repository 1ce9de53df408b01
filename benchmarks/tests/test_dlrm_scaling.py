"""dlrm_scaling.py: it reads a real demo run's demo.json, and its table's E(n) and AUC gaps follow
from the runs it is given."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dlrm_scaling
import pytest

SMALL = ["--steps", "6", "--epochs", "1", "--batch-size", "128", "--eval-batches", "2", "--max-rows", "512"]


def test_reads_the_demo_json_of_a_real_training_run(tmp_path: Path) -> None:
    output = tmp_path / "np1"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    done = subprocess.run(
        [sys.executable, "-m", "sparse_operation_kit.cli", "demo", "--part", "train", "--output", str(output),
         "--dim", "4", *SMALL],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = dlrm_scaling.read_run(str(output))
    assert (run["ranks"], run["global_batch"], run["batch_per_rank"], run["dim"], run["steps"]) == (1, 128, 128, 4, 6)
    assert run["samples_per_s"] > 0 and 0.0 <= run["auc"] <= 1.0
    table = dlrm_scaling.summarize([run]).splitlines()
    assert table[2].split("|")[7].strip() == "1.00"  # its own baseline


def _run(ranks: int, batch: int, samples_per_s: float, auc: float) -> dict:
    return {
        "path": f"np{ranks}_b{batch}",
        "ranks": ranks,
        "global_batch": batch,
        "batch_per_rank": batch // ranks,
        "dim": 128,
        "steps": 100,
        "samples_per_s": samples_per_s,
        "auc": auc,
    }


def test_efficiency_against_the_same_batch_per_rank_and_auc_against_the_same_global_batch() -> None:
    runs = [
        _run(2, 131072, 1.5e6, 0.7915),
        _run(1, 65536, 1.0e6, 0.7800),
        _run(1, 131072, 1.1e6, 0.7900),
        _run(4, 262144, 2.0e6, 0.7950),
    ]
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in dlrm_scaling.summarize(runs).splitlines()[2:]]
    assert [(r[0], r[1]) for r in rows] == [("1", "65536"), ("1", "131072"), ("2", "131072"), ("4", "262144")]
    efficiency = {(r[0], r[1]): r[6] for r in rows}
    assert efficiency[("2", "131072")] == "0.75"  # 1.5 M / (2 x 1.0 M): np 1 at 65,536 per rank
    assert efficiency[("4", "262144")] == "0.50"
    assert efficiency[("1", "131072")] == "1.00"  # a one-process run is its own baseline
    gaps = {(r[0], r[1]): r[8] for r in rows}  # against the one-process run at the same global batch
    assert gaps[("2", "131072")] == "+0.0015 (met: within 0.002)"
    assert gaps[("4", "262144")] == "-"  # no one-process run at that global batch
    assert gaps[("1", "65536")] == "-"


def test_refuses_a_folder_without_a_run_and_a_file_of_another_kind(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no demo.json"):
        dlrm_scaling.read_run(str(tmp_path))
    (tmp_path / "demo.json").write_text(json.dumps({"ranks": 1}), encoding="utf-8")
    with pytest.raises(ValueError, match="not a demo.json of 'sok demo --part train'"):
        dlrm_scaling.read_run(str(tmp_path))
