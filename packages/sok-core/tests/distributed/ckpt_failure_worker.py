"""Worker of test_checkpoint_failures_multiprocess.py, run under ``horovodrun -np 2 --gloo``.

``python ckpt_failure_worker.py BASE`` runs the scenarios of :data:`SCENARIOS` in order, each in its
own directory under BASE, and prints one line per scenario and rank::

    CHECK <scenario> rank=<r> PASS|FAIL <detail>

Each scenario makes one rank fail inside a collective checkpoint call (sok.dump, sok.load) and checks
that every rank raises (the failing one its own error, the other a RankFailure naming it), that the
checkpoint on disk and the tables are as they were, and that the next call works on every rank
(the ranks are still in step: nobody is left waiting in a collective). The ``*_different_paths``
scenarios pass each rank its own path: every rank must refuse, naming every rank's path, and
nothing be read or written. ``load_of_different_checkpoints`` makes rank 1 open a copy of the
checkpoint (as if a dump had replaced it between the ranks' reads): every rank must raise
CheckpointChanged and no table change.
"""

from __future__ import annotations

import errno
import os
import shutil
import sys
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import sparse_operation_kit as sok  # noqa: E402
import tensorflow as tf  # noqa: E402
from harness import print_stacks_before_timeout  # noqa: E402
from sparse_operation_kit.agreement import RankFailure  # noqa: E402
from sparse_operation_kit.checkpoint import collective as ckpt  # noqa: E402
from sparse_operation_kit.checkpoint import directory as ckdir  # noqa: E402
from sparse_operation_kit.checkpoint import format as fmt  # noqa: E402

DIM = 4
KEYS = np.arange(40, dtype=np.int64) * 7 + 3


class Injected(Exception):
    """The fault a scenario injects on one rank."""


def table(name: str) -> sok.DynamicVariable:
    """A dynamic table holding this rank's share of KEYS, rows a function of the key."""
    var = sok.DynamicVariable(dimension=DIM, var_type="hbm", name=name, initializer="0")
    mine = KEYS[KEYS % hvd.size() == hvd.rank()]
    sok.assign(var, tf.constant(mine), np.repeat(mine[:, None], DIM, 1).astype(np.float32) / 10)
    return var


def contents(var) -> dict[int, list[float]]:
    keys, rows = (t.numpy() for t in sok.export(var))
    return {int(k): r.tolist() for k, r in zip(keys, rows)}


def files(path: str) -> dict[str, bytes]:
    return {n: open(os.path.join(path, n), "rb").read() for n in sorted(os.listdir(path))}


def expect_failure(call, failing_rank: int, own: type[BaseException], match: str) -> str | None:
    """Run ``call``; every rank must raise: ``failing_rank`` ``own``, the others RankFailure naming it."""
    try:
        call()
    except BaseException as error:  # noqa: BLE001 - the scenario checks the type
        expected = own if hvd.rank() == failing_rank else RankFailure
        if not isinstance(error, expected):
            return f"raised {type(error).__name__}: {error}; expected {expected.__name__}"
        if hvd.rank() != failing_rank and f"rank(s) [{failing_rank}]" not in str(error):
            return f"the message does not name rank {failing_rank}: {error}"
        if match not in str(error):
            return f"the message lacks {match!r}: {error}"
        return None
    return "did not raise"


def patched(module, name: str, replacement, on_rank: int):
    """Context manager: ``module.name`` replaced on one rank only."""

    class Patch:
        def __enter__(self):
            self.real = getattr(module, name)
            if hvd.rank() == on_rank:
                setattr(module, name, replacement(self.real))

        def __exit__(self, *exc):
            setattr(module, name, self.real)

    return Patch()


def raising(message: str):
    def make(real):
        def fake(*args, **kwargs):
            raise Injected(message)

        return fake

    return make


def dump_fails_on_rank1(base: str) -> str | None:
    var = table("dump_fail")
    path = os.path.join(base, "ckpt")
    sok.dump(path, [var])
    before = files(path) if hvd.rank() == 0 else None
    sok.assign(var, tf.constant(KEYS[:2]), np.full((2, DIM), 9.0, np.float32))  # the next dump would differ
    with patched(ckpt, "_shard_chunks", raising("export failed on purpose"), on_rank=1):
        problem = expect_failure(lambda: sok.dump(path, [var]), 1, Injected, "export failed on purpose")
    if problem:
        return problem
    if hvd.rank() == 0 and files(path) != before:
        return "the previous checkpoint changed"
    sok.dump(path, [var])  # the ranks are in step again
    if hvd.rank() == 0 and files(path) == before:
        return "the dump after the failure did not write the new rows"
    return None


def dump_disk_full_on_rank0(base: str) -> str | None:
    var = table("dump_full")
    path = os.path.join(base, "ckpt")

    def no_space(real):
        def fake(fd):
            raise OSError(errno.ENOSPC, "No space left on device")

        return fake

    with patched(os, "fsync", no_space, on_rank=0):
        problem = expect_failure(lambda: sok.dump(path, [var]), 0, OSError, "No space left on device")
    if problem:
        return problem
    if os.path.exists(path) or (hvd.rank() == 0 and [n for n in os.listdir(base) if "sok-tmp" in n]):
        return f"the failed dump left files: {sorted(os.listdir(base))}"
    sok.dump(path, [var])
    return None


def dump_refuses_foreign_directory(base: str) -> str | None:
    var = table("dump_foreign")
    path = os.path.join(base, "ckpt")
    if hvd.rank() == 0:
        os.makedirs(path)
        with open(os.path.join(path, "dense.weights.h5"), "w") as f:
            f.write("the user's file")
    hvd.allreduce(tf.constant(0))  # rank 0 made the directory before anyone dumps
    try:
        sok.dump(path, [var])
    except fmt.CheckpointError as error:  # on every rank: rank 1 learns it from rank 0
        if "dense.weights.h5" not in str(error):
            return f"the error does not name the user's file: {error}"
    else:
        return "did not raise"
    if hvd.rank() == 0 and open(os.path.join(path, "dense.weights.h5")).read() != "the user's file":
        return "the user's file changed"
    return None


def load_fails_on_rank1(base: str) -> str | None:
    source = table("load_fail")
    path = os.path.join(base, "ckpt")
    sok.dump(path, [source])
    held = sok.DynamicVariable(dimension=DIM, var_type="hbm", name="load_fail", initializer="0")
    sok.assign(held, tf.constant([1, 2]), np.full((2, DIM), 5.0, np.float32))  # staged path
    held_before = contents(held)
    empty = sok.DynamicVariable(dimension=DIM, var_type="hbm", name="load_fail", initializer="0")  # streamed
    for var, what in ((held, "_stage"), (empty, "_fill_while_reading")):
        with patched(ckpt, what, raising("read failed on purpose"), on_rank=1):
            problem = expect_failure(lambda var=var: sok.load(path, [var]), 1, Injected, "read failed on purpose")
        if problem:
            return f"{what}: {problem}"
    if contents(held) != held_before:
        return "a table holding rows changed although the load failed"
    if contents(empty):
        return "an empty table kept rows although the load failed"
    sok.load(path, [empty])  # in step again: both ranks load
    if contents(empty) != contents(source):
        return "the load after the failure did not restore the rows"
    return None


def expect_path_refusal(call, paths: list[str]) -> str | None:
    """``call`` must raise CheckpointError naming every rank's path and saying to pass the same one."""
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


def dump_to_different_paths(base: str) -> str | None:
    var = table("dump_paths")
    paths = [os.path.join(base, f"ck_{r}") for r in range(hvd.size())]
    problem = expect_path_refusal(lambda: sok.dump(paths[hvd.rank()], [var]), paths)
    if problem:
        return problem
    if hvd.rank() == 0 and os.listdir(base):
        return f"the refused dump wrote {sorted(os.listdir(base))}"
    sok.dump(os.path.join(base, "same"), [var])  # the ranks are in step again
    return None


def load_from_different_paths(base: str) -> str | None:
    source = table("load_paths")
    paths = [os.path.join(base, f"ck_{r}") for r in range(hvd.size())]
    sok.dump(paths[0], [source])
    if hvd.rank() == 0:
        for path in paths[1:]:
            shutil.copytree(paths[0], path)  # valid checkpoints, one per rank
    hvd.allreduce(tf.constant(0))  # the copies exist before the other ranks read them
    var = sok.DynamicVariable(dimension=DIM, var_type="hbm", name="load_paths", initializer="0")
    problem = expect_path_refusal(lambda: sok.load(paths[hvd.rank()], [var]), paths)
    if problem:
        return problem
    if contents(var):
        return "the refused load changed the variable"
    sok.load(paths[0], [var])  # in step again
    if contents(var) != contents(source):
        return "the load after the refusal did not restore the rows"
    return None


def load_of_different_checkpoints(base: str) -> str | None:
    sources = [table("copy_held"), table("copy_empty")]
    path, copy = os.path.join(base, "ckpt"), os.path.join(base, "copy")
    sok.dump(path, sources)
    if hvd.rank() == 0:
        shutil.copytree(path, copy)  # the same files, another directory
    hvd.allreduce(tf.constant(0))  # the copy exists before rank 1 reads it
    held = sok.DynamicVariable(dimension=DIM, var_type="hbm", name="copy_held", initializer="0")
    sok.assign(held, tf.constant([1, 2]), np.full((2, DIM), 5.0, np.float32))  # staged path
    held_before = contents(held)
    empty = sok.DynamicVariable(dimension=DIM, var_type="hbm", name="copy_empty", initializer="0")  # streamed

    def opens_the_copy(real):
        return lambda opened: real(copy)

    with patched(ckdir, "OpenCheckpoint", opens_the_copy, on_rank=1):
        try:
            sok.load(path, [held, empty])
        except fmt.CheckpointChanged as error:
            if "the ranks read different checkpoints" not in str(error):
                return f"the message does not say the ranks read different checkpoints: {error}"
        except Exception as error:  # noqa: BLE001 - the scenario checks the type
            return f"raised {type(error).__name__}: {error}; expected CheckpointChanged"
        else:
            return "did not raise"
    if contents(held) != held_before:
        return "a table holding rows changed although the load failed"
    if contents(empty):
        return "an empty table kept rows although the load failed"
    sok.load(path, [empty])  # in step again: both ranks load the same checkpoint
    if contents(empty) != contents(sources[1]):
        return "the load after the failure did not restore the rows"
    return None


SCENARIOS = {
    "dump_fails_on_rank1": dump_fails_on_rank1,
    "dump_disk_full_on_rank0": dump_disk_full_on_rank0,
    "dump_refuses_foreign_directory": dump_refuses_foreign_directory,
    "load_fails_on_rank1": load_fails_on_rank1,
    "dump_to_different_paths": dump_to_different_paths,
    "load_from_different_paths": load_from_different_paths,
    "load_of_different_checkpoints": load_of_different_checkpoints,
}


def main(base: str) -> int:
    print_stacks_before_timeout()
    hvd.init()
    sok.init()
    failures = 0
    for name, scenario in SCENARIOS.items():
        directory = os.path.join(base, name)
        os.makedirs(directory, exist_ok=True)
        try:
            problem = scenario(directory)
        except BaseException:  # noqa: BLE001 - reported, then the next scenario runs
            problem = traceback.format_exc().replace("\n", " | ")
        failures += problem is not None
        print(f"CHECK {name} rank={hvd.rank()} {'FAIL ' + problem if problem else 'PASS'}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
