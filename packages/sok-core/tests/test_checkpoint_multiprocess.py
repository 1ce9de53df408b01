"""sok.dump / sok.load across world sizes (reference §1.10: dynamic load reshards; static load must
too here): a checkpoint written by 2 ranks loads in 1 process and in 3 ranks, and the one the 3
ranks write loads in 1 process. Two horovodrun launches (Gloo; CPU ranks, or GPU ranks under
``ci/gpu_test.sh --multi-gpu``: then a checkpoint dumped on 2 GPUs loads on 3 CPU ranks where the
host has fewer than 3 GPUs) of distributed/ckpt_worker.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
import sparse_operation_kit as sok  # noqa: E402

pytestmark = pytest.mark.multiprocess

WORKER = Path(__file__).parent / "distributed" / "ckpt_worker.py"
HOROVODRUN = shutil.which("horovodrun", path=str(Path(sys.executable).parent)) or shutil.which("horovodrun")
TIMEOUT_S = 300

if HOROVODRUN is None:
    pytest.skip("horovodrun is not installed", allow_module_level=True)

sys.path.insert(0, str(WORKER.parent))
import ckpt_worker as worker  # noqa: E402
from harness import rank_environment  # noqa: E402


def horovodrun(np_: int, *args: str) -> subprocess.CompletedProcess:
    env = rank_environment(ranks=np_)
    command = [HOROVODRUN, "-np", str(np_), "-H", f"localhost:{np_}", "--gloo", sys.executable, str(WORKER), *args]
    try:
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"horovodrun -np {np_} took over {TIMEOUT_S} s; output:\n{error.stdout}\n{error.stderr}")


def rank_errors(out: Path, np_: int, run: subprocess.CompletedProcess) -> list[str]:
    errors, silent = [], []
    for rank in range(np_):
        path = out / f"result-{rank}.json"
        if path.exists():
            errors += json.loads(path.read_text())["errors"]
        else:
            silent.append(rank)
    if silent:
        errors.append(f"ranks {silent} wrote no result (exit status {run.returncode}); output tail:\n{tail(run)}")
    return errors


def tail(run: subprocess.CompletedProcess, chars: int = 6000) -> str:
    return (run.stdout + run.stderr)[-chars:]


@pytest.fixture(scope="module")
def np2_checkpoint(tmp_path_factory) -> tuple[Path, dict]:
    """(checkpoint written by 2 ranks, the global contents they held)."""
    base = tmp_path_factory.mktemp("np2")
    ckpt, out = base / "ckpt", base / "out"
    out.mkdir()
    run = horovodrun(2, "dump", str(ckpt), str(out))
    assert run.returncode == 0 and not rank_errors(out, 2, run), tail(run)
    manifest = json.loads((ckpt / "manifest.json").read_text())
    assert manifest["world_size"] == 2 and manifest["step"] == 1 and manifest["optimizer"] == "Adagrad"
    return ckpt, dict(np.load(out / "expected.npz"))


def load_in_this_process(ckpt: Path, expected: dict) -> None:
    """Load into one process (localized tables on rank 0) and compare every row by key."""
    zeros = np.zeros((worker.STATIC_ROWS, worker.DIM), np.float32)
    statics = worker.static_tables({"dist": zeros, "local": zeros}, 1)
    dynamics = worker.dynamic_tables(1)
    wrapper = sok.OptimizerWrapper(tf.keras.optimizers.Adagrad(learning_rate=0.1))
    wrapper.optimizer.build(list(statics.values()))
    sok.load(str(ckpt), [*statics.values(), *dynamics.values()], wrapper)
    for name, var in statics.items():  # weights and the Keras optimizer's accumulators, by row id
        order = np.argsort(expected[f"{name}/keys"])
        np.testing.assert_array_equal(var.numpy(), expected[f"{name}/weights"][order], err_msg=name)
        accumulator = wrapper.static_slots(var)["accumulator"].numpy()
        np.testing.assert_array_equal(accumulator, expected[f"{name}/accumulator"][order], err_msg=name)
    assert int(wrapper.iterations.numpy()) == 1 and int(wrapper.optimizer.iterations.numpy()) == 1
    for name, var in dynamics.items():
        keys, rows, accumulator = worker.local_state(var, wrapper)
        order = np.argsort(expected[f"{name}/keys"])
        np.testing.assert_array_equal(keys, expected[f"{name}/keys"][order], err_msg=name)
        np.testing.assert_array_equal(rows, expected[f"{name}/weights"][order], err_msg=name)
        np.testing.assert_array_equal(accumulator, expected[f"{name}/accumulator"][order], err_msg=name)


def test_expected_contents_are_what_the_workers_built(np2_checkpoint):
    """Sanity of the oracle: every filled and trained key is there, each exactly once."""
    _, expected = np2_checkpoint
    for name in worker.DYNAMIC:
        keys = expected[f"{name}/keys"]
        assert sorted(keys.tolist()) == sorted(set(worker.KEYS.tolist()) | set(worker.BATCH.tolist())), name
    for name in ("dist", "local"):  # every row once; trained by the Keras optimizer (accumulator moved)
        assert sorted(expected[f"{name}/keys"].tolist()) == list(range(worker.STATIC_ROWS)), name
        assert (expected[f"{name}/accumulator"] > 0.1).all(), name
    untrained = ~np.isin(expected["dyn_hbm/keys"], worker.BATCH)
    np.testing.assert_array_equal(
        expected["dyn_hbm/weights"][untrained], worker.key_rows(expected["dyn_hbm/keys"][untrained])
    )
    # The three dynamic tables got the same rows and gradients: equal by key, whatever the backend.
    for name in ("dyn_hybrid", "dyn_local"):
        for part in ("weights", "accumulator"):
            a, b = (expected[f"{t}/{part}"][np.argsort(expected[f"{t}/keys"])] for t in ("dyn_hbm", name))
            np.testing.assert_array_equal(a, b, err_msg=f"{name}/{part}")


def test_np2_checkpoint_loads_in_one_process(np2_checkpoint):
    load_in_this_process(*np2_checkpoint)


def test_np2_checkpoint_loads_in_three_ranks_and_their_dump_in_one(np2_checkpoint, tmp_path):
    ckpt, expected = np2_checkpoint
    out, dump2 = tmp_path / "out", tmp_path / "ckpt3"
    out.mkdir()
    expected_path = tmp_path / "expected.npz"
    np.savez(expected_path, **expected)
    run = horovodrun(3, "load", str(ckpt), str(expected_path), str(out), str(dump2))
    errors = rank_errors(out, 3, run)
    assert not errors, "\n".join(errors)
    assert run.returncode == 0, tail(run)
    assert json.loads((dump2 / "manifest.json").read_text())["world_size"] == 3
    load_in_this_process(dump2, expected)
