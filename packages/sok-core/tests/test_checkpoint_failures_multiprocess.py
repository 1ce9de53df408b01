"""A failure on one of two ranks inside sok.dump / sok.load stops the call on both, and no rank hangs.

One ``horovodrun -np 2 --gloo`` launch of ``distributed/ckpt_failure_worker.py`` runs every scenario
(its docstring says what each checks); each test below reads one scenario's result on both ranks.
The launch has a timeout: a hang fails the tests instead of blocking the suite.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("horovod.tensorflow")

sys.path.insert(0, str(Path(__file__).parent / "distributed"))
import ckpt_failure_worker as worker  # noqa: E402

pytestmark = pytest.mark.multiprocess

WORKER = Path(__file__).parent / "distributed" / "ckpt_failure_worker.py"
HOROVODRUN = Path(sys.executable).parent / "horovodrun"
NP = 2
TIMEOUT_S = 180
LINE = re.compile(r"CHECK (\S+) rank=(\d+) (PASS|FAIL)(.*)$")


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> tuple[dict[str, dict[int, tuple[str, str]]], str]:
    if not HOROVODRUN.exists():
        pytest.skip(f"horovodrun not found next to {sys.executable} (ci/setup.sh installs it)")
    base = tmp_path_factory.mktemp("failures")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    command = [str(HOROVODRUN), "-np", str(NP), "-H", f"localhost:{NP}", "--gloo", sys.executable, str(WORKER)]
    try:
        run = subprocess.run([*command, str(base)], env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"the workers did not finish within {TIMEOUT_S} s (a rank hangs):\n{error.stdout}\n{error.stderr}")
    output = run.stdout + run.stderr
    found: dict[str, dict[int, tuple[str, str]]] = {}
    for line in output.splitlines():
        match = LINE.search(line)
        if match:
            found.setdefault(match[1], {})[int(match[2])] = (match[3], match[4].strip())
    return found, output[-6000:]


@pytest.mark.parametrize("scenario", list(worker.SCENARIOS))
def test_scenario_on_both_ranks(results, scenario):
    found, tail = results
    ranks = found.get(scenario, {})
    assert sorted(ranks) == list(range(NP)), f"{scenario}: no result from some rank\n{tail}"
    failures = {r: detail for r, (status, detail) in ranks.items() if status != "PASS"}
    assert not failures, f"{scenario}: {failures}"
