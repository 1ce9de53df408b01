"""Dumps and reads of one checkpoint path from several processes at once (issue 36, defects 11 and 12).

* Two processes dumping to one path in a loop: every dump succeeds or raises a CheckpointError that
  names the path and the other process (never a raw FileNotFoundError / OSError), and the
  checkpoint left at the end loads whole.
* A dump that finds the path's dump lock held longer than ``checkpoint.directory.LOCK_WAIT_S`` raises a
  CheckpointError naming the path and the holder, and leaves nothing behind.
* One process dumping in a loop while this one loads and inspects the same path: no read ever
  reports a good checkpoint as corrupt (a file of one checkpoint checked against the manifest of
  another), and every load returns one whole checkpoint (the rows of one dump, never a mix).

The processes are real (this file, run as a script, is the dumper: ``python
test_checkpoint_concurrency.py PATH WRITER COUNT``); each is bounded by a timeout.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import traceback

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
import sparse_operation_kit as sok  # noqa: E402
from sparse_operation_kit.checkpoint import directory as ckdir  # noqa: E402
from sparse_operation_kit.checkpoint import format as fmt  # noqa: E402
from sparse_operation_kit.checkpoint.inspect import inspect as ckpt_inspect  # noqa: E402

DIM = 4
KEYS = np.arange(64, dtype=np.int64) * 3 + 1
#: Dumps per process in the two-writer test; ~1% of them failed before the fix (defect 11).
DUMPS_PER_WRITER = 150
#: Dumps of the writer that runs while this process reads (defect 12).
DUMPS_WHILE_READING = 150
TIMEOUT_S = 240
RESULT = "RESULT "


def make_var() -> sok.DynamicVariable:
    return sok.DynamicVariable(dimension=DIM, var_type="hbm", name="emb", initializer="0")


def generation(writer: int, i: int) -> float:
    """The value every row of dump ``i`` of ``writer`` holds: a load must see one value only."""
    return float(writer * 10_000 + i)


def dump_loop(path: str, writer: int, count: int) -> dict:
    """``count`` dumps of one table to ``path``; what each did: ``{"ok", "refused", "raw"}``."""
    var = make_var()
    outcome: dict = {"ok": 0, "refused": [], "raw": []}
    for i in range(count):
        sok.assign(var, tf.constant(KEYS), np.full((len(KEYS), DIM), generation(writer, i), np.float32))
        try:
            sok.dump(path, [var])
            outcome["ok"] += 1
        except fmt.CheckpointError as error:
            outcome["refused"].append(str(error))
        except Exception:  # noqa: BLE001 - reported: the test fails on any of these
            outcome["raw"].append(traceback.format_exc())
    return outcome


def start_writer(path: str, writer: int, count: int) -> subprocess.Popen:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    command = [sys.executable, __file__, path, str(writer), str(count)]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen, deadline: float) -> dict:
    """The writer's outcome; the test fails (and the writer is killed) past ``deadline``."""
    try:
        output, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        pytest.fail(f"a writer did not finish in {TIMEOUT_S} s; output tail:\n{output[-4000:]}")
    lines = [line for line in output.splitlines() if line.startswith(RESULT)]
    assert proc.returncode == 0 and lines, f"writer exit status {proc.returncode}; output tail:\n{output[-4000:]}"
    return json.loads(lines[-1][len(RESULT) :])


def loaded_rows(path: str) -> np.ndarray:
    """The rows of a fresh variable loaded from ``path``, in KEYS' order."""
    var = make_var()
    sok.load(path, [var])
    keys, rows = (t.numpy() for t in sok.export(var))
    assert sorted(keys.tolist()) == KEYS.tolist(), "the load did not return the checkpoint's keys"
    return rows[np.argsort(keys)]


def assert_whole(rows: np.ndarray) -> None:
    """Every row holds the same value: the rows of one dump."""
    assert np.unique(rows).size == 1, f"a load mixed dumps: values {np.unique(rows)[:8]}"


def test_two_processes_dumping_one_path_never_fail_with_a_raw_error(tmp_path):
    path = str(tmp_path / "ck")
    deadline = time.monotonic() + TIMEOUT_S
    writers = [start_writer(path, writer, DUMPS_PER_WRITER) for writer in (1, 2)]
    outcomes = [finish(proc, deadline) for proc in writers]
    raw = [trace for outcome in outcomes for trace in outcome["raw"]]
    assert not raw, f"{len(raw)} dump(s) failed with a raw error; the first:\n{raw[0]}"
    for outcome in outcomes:
        for message in outcome["refused"]:
            assert path in message and "another sok.dump" in message, message
        assert outcome["ok"] + len(outcome["refused"]) == DUMPS_PER_WRITER
    assert sum(outcome["ok"] for outcome in outcomes) > 0
    assert_whole(loaded_rows(path))
    assert sorted(os.listdir(tmp_path)) == [".ck.sok-lock", "ck"]  # no staging directory; the lock file is kept


def test_a_dump_waits_for_the_dump_lock_at_most_lock_wait_s_and_names_its_holder(tmp_path, monkeypatch):
    path = str(tmp_path / "ck")
    var = make_var()
    sok.assign(var, tf.constant(KEYS), np.ones((len(KEYS), DIM), np.float32))
    monkeypatch.setattr(ckdir, "LOCK_WAIT_S", 0.2)
    holder = re.escape(f"pid {os.getpid()} on {socket.gethostname()}")
    refusal = rf"sok.dump of .*ck: another sok.dump of it \({holder}\) has held"
    with ckdir.dump_lock(path):  # another dump of the path, holding its lock
        started = time.monotonic()
        with pytest.raises(fmt.CheckpointError, match=refusal):
            sok.dump(path, [var])
        assert time.monotonic() - started < 30
    assert os.listdir(tmp_path) == [".ck.sok-lock"]  # no staging directory; the lock file is kept
    sok.dump(path, [var])  # released: the next dump proceeds
    assert_whole(loaded_rows(path))


def test_reads_while_another_process_dumps_never_report_corruption(tmp_path):
    path = str(tmp_path / "ck")
    var = make_var()
    sok.assign(var, tf.constant(KEYS), np.zeros((len(KEYS), DIM), np.float32))
    sok.dump(path, [var])
    deadline = time.monotonic() + TIMEOUT_S
    writer = start_writer(path, 1, DUMPS_WHILE_READING)
    reads, whole, corrupt, changed = 0, 0, [], []
    while writer.poll() is None and time.monotonic() < deadline:
        for read in (lambda: assert_whole(loaded_rows(path)), lambda: ckpt_inspect(path)):
            reads += 1
            try:
                read()
            except fmt.CheckpointError as error:
                (corrupt if "corrupt" in str(error) else changed).append(str(error))
            else:
                whole += 1
    outcome = finish(writer, deadline)
    assert outcome["ok"] == DUMPS_WHILE_READING, outcome
    assert not corrupt, f"{len(corrupt)} of {reads} loads and inspects called a good checkpoint corrupt: {corrupt[0]}"
    for message in changed:
        assert "changed while it was read" in message, message
    assert whole > 0
    assert_whole(loaded_rows(path))


if __name__ == "__main__":
    _path, _writer, _count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    print(RESULT + json.dumps(dump_loop(_path, _writer, _count)), flush=True)
