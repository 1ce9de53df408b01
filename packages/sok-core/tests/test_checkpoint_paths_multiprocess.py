"""Ranks that pass sok.dump / sok.load different paths are refused on every rank, naming the paths.

Before, rank 0's path won silently: the other ranks' paths were ignored (dump) or each rank read its
own checkpoint (load). One ``horovodrun -np 2 --gloo`` launch of this file as a script (the worker
part at the bottom) runs every scenario of :data:`SCENARIOS` and prints one line per scenario and
rank (``CHECK <scenario> rank=<r> PASS|FAIL <detail>``); each test reads one scenario's result. The
launch has a timeout: a hang fails the tests instead of blocking the suite.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "distributed"))
from harness import assert_passed, launch, print_stacks_before_timeout, results  # noqa: E402

NP = 2
TIMEOUT_S = 240
DIM = 4
STALL = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "20", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "90"}


# -- worker (runs under horovodrun) ------------------------------------------------------------------
def _table(name: str):
    """A dynamic table holding this rank's share of 10 keys (``key mod ranks == rank``)."""
    import horovod.tensorflow as hvd
    import numpy as np
    import sparse_operation_kit as sok
    import tensorflow as tf

    var = sok.DynamicVariable(dimension=DIM, var_type="hbm", name=name, initializer="0")
    keys = np.arange(10, dtype=np.int64)
    keys = keys[keys % hvd.size() == hvd.rank()]
    sok.assign(var, tf.constant(keys), np.repeat(keys[:, None], DIM, 1).astype(np.float32))
    return var


def _contents(var) -> dict:
    import sparse_operation_kit as sok

    keys, rows = (t.numpy() for t in sok.export(var))
    return {int(k): r.tolist() for k, r in zip(keys, rows)}


def _expect_refusal(call, paths: list[str]) -> str | None:
    """``call`` must raise CheckpointError naming every rank's path and saying to pass the same one."""
    from sparse_operation_kit import checkpoint_format as fmt

    try:
        call()
    except fmt.CheckpointError as error:
        missing = [p for p in paths if repr(p) not in str(error)]
        if missing or "the ranks passed different paths" not in str(error):
            return f"the error does not name the paths {missing} or the problem: {error}"
        return None
    except Exception as error:  # noqa: BLE001 - the scenario checks the type
        return f"raised {type(error).__name__}: {error}; expected CheckpointError"
    return "did not raise"


def dump_to_different_paths(base: str, rank: int) -> str | None:
    import sparse_operation_kit as sok

    var = _table("dump_paths")
    paths = [os.path.join(base, f"ck_{r}") for r in range(NP)]
    problem = _expect_refusal(lambda: sok.dump(paths[rank], [var]), paths)
    if problem:
        return problem
    if rank == 0 and os.listdir(base):
        return f"the refused dump wrote {sorted(os.listdir(base))}"
    sok.dump(os.path.join(base, "same"), [var])  # the ranks are in step again
    return None


def load_from_different_paths(base: str, rank: int) -> str | None:
    import shutil

    import horovod.tensorflow as hvd
    import sparse_operation_kit as sok
    import tensorflow as tf

    source = _table("load_paths")
    paths = [os.path.join(base, f"ck_{r}") for r in range(NP)]
    sok.dump(paths[0], [source])
    if rank == 0:
        shutil.copytree(paths[0], paths[1])  # two valid checkpoints
    hvd.allreduce(tf.constant(0))  # the copy exists before rank 1 reads it
    var = sok.DynamicVariable(dimension=DIM, var_type="hbm", name="load_paths", initializer="0")
    problem = _expect_refusal(lambda: sok.load(paths[rank], [var]), paths)
    if problem:
        return problem
    if _contents(var):
        return "the refused load changed the variable"
    sok.load(paths[0], [var])  # in step again
    if _contents(var) != _contents(source):
        return "the load after the refusal did not restore the rows"
    return None


SCENARIOS = {"dump_to_different_paths": dump_to_different_paths, "load_from_different_paths": load_from_different_paths}


def main(base: str) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import horovod.tensorflow as hvd
    import sparse_operation_kit as sok
    import tensorflow as tf

    print_stacks_before_timeout()
    hvd.init()
    sok.init()
    failures = 0
    for name, scenario in SCENARIOS.items():
        directory = os.path.join(base, name)
        os.makedirs(directory, exist_ok=True)
        hvd.allreduce(tf.constant(0))  # every rank made it
        try:
            problem = scenario(directory, hvd.rank())
        except BaseException:  # noqa: BLE001 - reported, then the next scenario runs
            problem = traceback.format_exc().replace("\n", " | ")
        failures += problem is not None
        print(f"CHECK {name} rank={hvd.rank()} {'FAIL ' + problem if problem else 'PASS'}", flush=True)
    return 1 if failures else 0


# -- tests -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def worker_run(tmp_path_factory) -> tuple[int, str, dict]:
    pytest.importorskip("tensorflow")
    pytest.importorskip("horovod.tensorflow")
    returncode, output = launch(Path(__file__), NP, str(tmp_path_factory.mktemp("paths")), env=STALL, timeout=TIMEOUT_S)
    return returncode, output, results(output)


@pytest.mark.multiprocess
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_scenario_on_both_ranks(worker_run, scenario):
    returncode, output, found = worker_run
    assert_passed(found, scenario, NP, returncode, output)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
