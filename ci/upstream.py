"""What the runners of NVIDIA's own tests share (``upstream_sok_tests.py``, ``upstream_hps_tests.py``).

NVIDIA's scripts are read from a HugeCTR git repository you have (a clone, or the git directory of a
mirror) at a pinned commit, written to a temporary directory and run there unchanged, never copied
into this project, under tf_keras (``TF_USE_LEGACY_KERAS=1``: the Keras 2 they were written for), on
the CPU unless ``CUDA_VISIBLE_DEVICES`` says otherwise. PASS means exit status 0 (the scripts assert
their own results).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass
class Run:
    script: str  # path in HugeCTR
    commit: str
    np: int
    status: str = "not run"  # PASS, FAIL, TIMEOUT, SKIP (the runner's CANNOT_RUN: tail says why)
    seconds: float = 0.0
    tail: str = ""


def git(repo: str, *args: str) -> str:
    git_dir = repo if os.path.isdir(os.path.join(repo, "objects")) else os.path.join(repo, ".git")
    return subprocess.run(["git", "--git-dir", git_dir, *args], check=True, capture_output=True, text=True).stdout


def write_script(repo: str, run: Run, work: str | Path) -> Path:
    """``run``'s script at its commit, written into ``work``; its path there."""
    script = Path(work) / Path(run.script).name
    script.write_text(git(repo, "show", f"{run.commit}:{run.script}"))
    return script


def base_env(**extra: str) -> dict[str, str]:
    """The scripts' environment: tf_keras, quiet TensorFlow, the CPU unless CUDA_VISIBLE_DEVICES is set."""
    return dict(
        os.environ,
        TF_USE_LEGACY_KERAS="1",
        TF_CPP_MIN_LOG_LEVEL="2",
        CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        **extra,
    )


def execute(run: Run, command: list[str], cwd: str | Path, env: dict[str, str], timeout: float) -> None:
    """Runs ``command`` (its own process group, killed whole at ``timeout``) and records in ``run``
    its status, time and, unless it passed, the end of its output."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
        run.status = "PASS" if proc.returncode == 0 else "FAIL"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        run.status = "TIMEOUT"
    run.seconds = time.perf_counter() - start
    if run.status != "PASS":
        lines = [line for line in output.splitlines() if "oneDNN" not in line and "absl::InitializeLog" not in line]
        run.tail = "\n".join(lines[-25:])


def markdown(runs: list[Run], prefix: str = "") -> str:
    """One row per script and commit (its path less ``prefix``), one column per rank count."""
    nps = sorted({run.np for run in runs})
    rows = [f"| script | commit | {' | '.join(f'np {n}' for n in nps)} |", "|---|---|" + "---|" * len(nps)]
    table: dict[tuple[str, str], dict[int, Run]] = {}
    for run in runs:
        table.setdefault((run.script, run.commit), {})[run.np] = run
    for (script, commit), by_np in table.items():
        cells = []
        for n in nps:
            run = by_np.get(n)
            if run is None:
                cells.append("(one process only)")
            elif run.status == "SKIP":
                cells.append(f"SKIP: {run.tail}")
            else:
                cells.append(f"{run.status} ({run.seconds:.0f} s)")
        rows.append(f"| `{script.removeprefix(prefix)}` | {commit[:9]} | {' | '.join(cells)} |")
    return "\n".join(rows) + "\n"


def report(i: int, total: int, run: Run) -> None:
    """The progress line of run ``i`` of ``total``, and the end of its output unless it passed."""
    print(f"[{i}/{total}] {run.status:7} np {run.np} {run.seconds:6.0f} s  {run.commit[:9]} {run.script}", flush=True)
    if run.tail:
        print("    " + run.tail.replace("\n", "\n    "), flush=True)


def conclude(runs: list[Run], what: str, json_path: str | None, markdown_path: str | None, prefix: str) -> int:
    """The summary line; ``runs`` written as JSON and as the markdown table where asked; the exit
    status (0 when every run passed or cannot run here)."""
    passed = sum(r.status == "PASS" for r in runs)
    skipped = sum(r.status == "SKIP" for r in runs)
    print(f"\n{passed} of {len(runs)} {what} passed, {skipped} skipped (CANNOT_RUN)")
    if json_path:
        Path(json_path).write_text(json.dumps([asdict(r) for r in runs], indent=2))
    if markdown_path:
        Path(markdown_path).write_text(markdown(runs, prefix))
    return 0 if passed + skipped == len(runs) else 1
