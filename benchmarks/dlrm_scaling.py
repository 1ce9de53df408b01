#!/usr/bin/env python
"""The demo's DLRM trained end to end on 1, 2, 4 GPUs: samples/s, E(n) and the AUC each reaches.

The runs are the demo's own training (``sok demo --part train``, under ``horovodrun -np N`` for
several ranks), each writing ``demo.json`` into its ``--output``; ``ci/gpu_test.sh --scaling`` makes
them with ``SOK_SCALING_DLRM=1``. The demo's ranks take slices of one global batch and their loss is
divided by the global batch, so N ranks at global batch B make the same steps as one process at B.
Two figures follow from that (issue 37):

* E(n) = samples/s(n) / (n x samples/s(1)) between runs with the same batch per rank (65,536 in the
  issue: one process at B, N ranks at N x B): how the step scales;
* the AUC gap between runs with the same global batch (one process and N ranks at N x B): the same
  training, so its AUC must agree (goal: within 0.002).

Usage::

    python benchmarks/dlrm_scaling.py build/dlrm_np1_b65536 build/dlrm_np1_b131072 build/dlrm_np2_b131072
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

#: The AUC of N ranks against one process at the same global batch (issue 37).
GOAL_AUC_GAP = 0.002


def read_run(path: str) -> dict[str, Any]:
    """One run's figures from its output folder (or its ``demo.json``)."""
    file = Path(path)
    if file.is_dir():
        file = file / "demo.json"
    if not file.is_file():
        raise FileNotFoundError(f"{path}: no demo.json; give the --output folder of a 'sok demo --part train' run")
    record = json.loads(file.read_text(encoding="utf-8"))
    try:
        ranks, config, results = int(record["ranks"]), record["config"], record["results"]
        batch, auc = int(config["batch_size"]), results["eval_auc"]
        return {
            "path": path,
            "ranks": ranks,
            "global_batch": batch,
            "batch_per_rank": batch // ranks,
            "dim": int(config["dim"]),
            "steps": int(config["steps"]),
            "samples_per_s": float(results["samples_per_s"]),
            "auc": float(auc[-1]) if auc else None,
        }
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{file}: not a demo.json of 'sok demo --part train' ({type(e).__name__}: {e})") from e


def summarize(runs: list[dict[str, Any]]) -> str:
    """The markdown table of ``runs``: E(n) against the one-process run with the same batch per
    rank, the AUC gap against the one-process run with the same global batch ("-" where none)."""
    single = {r["global_batch"]: r for r in runs if r["ranks"] == 1}
    lines = [
        "| ranks | global batch | batch / rank | dim | steps | samples/s | E(n) | eval AUC | AUC - np 1, same batch |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(runs, key=lambda r: (r["ranks"], r["global_batch"])):
        base = single.get(r["batch_per_rank"])
        efficiency = f"{r['samples_per_s'] / (r['ranks'] * base['samples_per_s']):.2f}" if base else "-"
        same = single.get(r["global_batch"])
        gap = "-"
        if same is not None and same is not r and r["auc"] is not None and same["auc"] is not None:
            verdict = "met" if abs(r["auc"] - same["auc"]) <= GOAL_AUC_GAP else "missed"
            gap = f"{r['auc'] - same['auc']:+.4f} ({verdict}: within {GOAL_AUC_GAP})"
        auc = "-" if r["auc"] is None else f"{r['auc']:.4f}"
        lines.append(
            f"| {r['ranks']} | {r['global_batch']} | {r['batch_per_rank']} | {r['dim']} | {r['steps']} | "
            f"{r['samples_per_s'] / 1e3:.1f}k | {efficiency} | {auc} | {gap} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="output folders (or demo.json files) of the demo's training runs")
    parser.add_argument("--json", help="write the runs' figures here too")
    args = parser.parse_args(argv)
    runs = [read_run(path) for path in args.runs]
    print(summarize(runs))
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
