"""Online-update files and the directory update source.

* write_update / read_update round trip (int64 and uint64 keys, any dim); the file is the
  documented layout, version 2 with its sequence (header fields read back with struct, not through
  read_update); version-1 files are still read, ordered by the time in their names.
* Atomic: a failed write leaves no visible file and no temporary; a reader polling while a writer
  writes never sees part of a file.
* poll() returns each file once, in sequence order (not name or arrival order); the order is per
  writer (a thread of a process, its id in the header): a late file of another process or thread
  applies, a file older than the newest one returned of its writer and table, and a duplicate of
  one returned (another name, same writer, sequence and content), go to rejected/, so a live source
  and a replay agree.
* bad files (wrong magic, corrupt, bad tag, a symbolic link) go to rejected/ with an error line,
  under a free name (x.hpsu.1, ...) when theirs is taken there; a file shorter than its header says
  waits until it is complete (rejected when its size has not changed for incomplete_timeout_s); a
  junk file costs a small read, not the file in memory.
* a replay reads the headers to order the files, then one file at a time: its peak memory is about
  one file's rows, and an error while reading loses no file.
* filters are full matches on the model name.
* start()/stop() apply updates in a thread; an apply that fails is retried, in order.
* dump_increment writes the rows sok.incremental_model_dump returns.
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
import subprocess
import sys
import threading
import time
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest
from hierarchical_parameter_server import updates as updates_module
from hierarchical_parameter_server.config import load_config
from hierarchical_parameter_server.updates import (
    DirectoryUpdateSource,
    UpdateFileError,
    dump_increment,
    read_update,
    write_update,
)

sys.path.insert(0, str(Path(__file__).parent))
import serve_support as support  # noqa: E402


def rows(n: int, dim: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


@pytest.mark.parametrize("dim", [1, 3, 128])
def test_round_trip(tmp_path, dim):
    keys = np.array([5, -1, 2**63 - 1, 0], np.int64)
    path = write_update(tmp_path, "foo", "sparse_embedding0", keys, rows(4, dim))
    update = read_update(path)
    assert (update.tag, update.model, update.table, update.path) == (
        "hps_et.foo.sparse_embedding0",
        "foo",
        "sparse_embedding0",
        path,
    )
    np.testing.assert_array_equal(update.keys, keys)
    np.testing.assert_array_equal(update.values, rows(4, dim))
    assert update.keys.dtype == np.int64 and update.values.dtype == np.float32 and update.values.flags.c_contiguous


def test_file_layout_is_the_documented_one(tmp_path):
    keys = np.array([2**64 - 1, 7], np.uint64)
    values = rows(2, 3)
    before = time.time_ns()
    path = write_update(tmp_path, "m", "t", keys, values)
    data = open(path, "rb").read()
    magic, value_size, version, key_size, tag_len, sequence, writer = struct.unpack_from("<IIHHIQQ", data)
    assert (magic, value_size, version, key_size) == (0x52544348, 12, 2, 8) and data[:4] == b"HCTR"
    assert before <= sequence <= time.time_ns() and os.path.basename(path).startswith(f"{sequence:020d}-")
    assert (read_update(path).sequence, read_update(path).writer) == (sequence, writer) and writer != 0
    assert data[32 : 32 + tag_len] == b"hps_et.m.t"
    offset = 32 + tag_len
    assert struct.unpack_from("<Q", data, offset) == (2,)
    offset += 8
    for i in range(2):
        assert struct.unpack_from("<Q", data, offset) == (int(keys[i]),)
        assert data[offset + 8 : offset + 20] == values[i].tobytes()
        offset += 20
    assert struct.unpack_from("<I", data, offset) == (zlib.crc32(data[:offset]),) and len(data) == offset + 4
    np.testing.assert_array_equal(
        read_update(os.path.join(tmp_path, os.listdir(tmp_path)[0])).keys.view(np.uint64), keys
    )


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(ValueError, match="model name 'a.b'"):
        write_update(tmp_path, "a.b", "t", np.arange(2), rows(2, 2))
    with pytest.raises(ValueError, match="keys must be integer"):
        write_update(tmp_path, "m", "t", np.arange(3), rows(2, 2))


def test_failed_write_leaves_nothing_visible(tmp_path, monkeypatch):
    def fail(*_):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        write_update(tmp_path, "m", "t", np.arange(3), rows(3, 2))
    assert os.listdir(tmp_path) == []


def test_reader_never_sees_part_of_a_file(tmp_path):
    source = DirectoryUpdateSource(tmp_path)
    done = threading.Event()
    big = rows(20000, 64)

    def writer():
        for i in range(15):
            write_update(tmp_path, "m", "t", np.arange(20000) + i, big)
        done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    seen = []
    deadline = time.monotonic() + 120
    while (not done.is_set() or len(seen) < 15) and time.monotonic() < deadline:
        seen += source.poll()
    thread.join()
    assert len(seen) == 15 and not os.path.exists(tmp_path / "rejected")
    for i, update in enumerate(seen):
        np.testing.assert_array_equal(update.keys, np.arange(20000) + i)
        np.testing.assert_array_equal(update.values, big)


def test_poll_returns_each_file_once_in_sequence_order(tmp_path):
    source = DirectoryUpdateSource(tmp_path)
    paths = [write_update(tmp_path, "m", "t", [i], rows(1, 2, seed=i)) for i in range(5)]
    assert paths == sorted(paths)
    assert [u.keys[0] for u in source.poll()] == list(range(5))
    assert source.poll() == []
    write_update(tmp_path, "m", "t", [9], rows(1, 2))
    assert [u.keys[0] for u in source.poll()] == [9]
    # a new source replays the directory, like a new Kafka consumer group
    assert [u.keys[0] for u in DirectoryUpdateSource(tmp_path).poll()] == [0, 1, 2, 3, 4, 9]


def corrupt(path: str, how: str) -> None:
    data = bytearray(open(path, "rb").read())
    if how == "magic":
        data[0] ^= 0xFF
    elif how == "truncated":
        data = data[:-9]
    elif how == "bitflip":
        data[-6] ^= 0x01
    elif how == "version":
        data[8] = 9
    elif how == "tag":
        data[32:38] = b"xx_et."
    open(path, "wb").write(bytes(data))


@pytest.mark.parametrize(
    ("how", "words"),
    [
        ("magic", "not an update file"),
        ("truncated", "truncated"),
        ("bitflip", "checksum mismatch"),
        ("version", "format version 9"),
        ("tag", "is not hps_et.<model>.<table>"),
    ],
)
def test_bad_files_are_rejected_with_an_error_line(tmp_path, caplog, how, words):
    good_before = write_update(tmp_path, "m", "t", [1], rows(1, 2))
    bad = write_update(tmp_path, "m", "t", [2], rows(1, 2))
    write_update(tmp_path, "m", "t", [3], rows(1, 2))
    corrupt(bad, how)
    with pytest.raises(UpdateFileError, match=words):
        read_update(bad)
    with caplog.at_level(logging.WARNING, logger="hierarchical_parameter_server.updates"):
        got = DirectoryUpdateSource(tmp_path, incomplete_timeout_s=0).poll()
    assert [u.keys[0] for u in got] == [1, 3]
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert words in line and os.path.basename(bad) in line
    assert os.listdir(tmp_path / "rejected") == [os.path.basename(bad)]
    assert os.path.exists(good_before)


def test_filters_match_the_whole_model_name(tmp_path):
    for model in ("foo", "foobar", "bar", "baz"):
        write_update(tmp_path, model, "t", [1], rows(1, 2))
    got = DirectoryUpdateSource(tmp_path, model_filters=["foo", "ba."]).poll()
    assert [u.model for u in got] == ["foo", "bar", "baz"]
    assert not os.path.exists(tmp_path / "rejected")


def keys_of(updates) -> list[int]:
    return [int(k) for u in updates for k in u.keys]


def errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]


def write_version_1(path, tag: bytes, keys: list[int], values: np.ndarray) -> None:
    """A file of format version 1 (no sequence in the header), as sok-hps 0.x wrote it."""
    pairs = b"".join(struct.pack("<q", k) + v.astype("<f4").tobytes() for k, v in zip(keys, values))
    body = struct.pack("<IIHHI", 0x52544348, 4 * values.shape[1], 1, 8, len(tag)) + tag
    body += struct.pack("<Q", len(keys)) + pairs
    open(path, "wb").write(body + struct.pack("<I", zlib.crc32(body)))


def test_version_1_files_are_read_and_ordered_by_the_time_in_their_names(tmp_path, caplog):
    sequence = read_update(write_update(tmp_path, "m", "t", [2], rows(1, 2))).sequence
    write_version_1(tmp_path / f"{sequence - 1:020d}-7-000000.hpsu", b"hps_et.m.t", [1], rows(1, 2))
    write_version_1(tmp_path / f"{sequence + 1:020d}-7-000001.hpsu", b"hps_et.m.t", [3], rows(1, 2))
    source = DirectoryUpdateSource(tmp_path)
    got = source.poll()
    assert keys_of(got) == [1, 2, 3] and [u.version for u in got] == [1, 2, 1]
    assert [u.sequence for u in got] == [sequence - 1, sequence, sequence + 1]
    write_version_1(tmp_path / "renamed.hpsu", b"hps_et.m.t", [4], rows(1, 2))
    with caplog.at_level(logging.WARNING, logger="hierarchical_parameter_server.updates"):
        assert source.poll() == []
    (line,) = errors(caplog)
    assert "renamed.hpsu" in line and "version 1" in line
    assert os.listdir(tmp_path / "rejected") == ["renamed.hpsu"]


def test_files_apply_in_sequence_order_not_name_order(tmp_path):
    first = write_update(tmp_path, "m", "t", [1], rows(1, 2))
    second = write_update(tmp_path, "m", "t", [2], rows(1, 2))
    os.replace(first, tmp_path / "zz-first.hpsu")  # the later name holds the older update
    os.replace(second, tmp_path / "aa-second.hpsu")
    assert keys_of(DirectoryUpdateSource(tmp_path).poll()) == [1, 2]


def test_an_older_file_arriving_late_is_refused_so_live_and_replay_agree(tmp_path, caplog):
    elsewhere, directory = tmp_path / "elsewhere", tmp_path / "u"
    old = write_update(elsewhere, "m", "t", [1], rows(1, 2))
    old_of_another_table = write_update(elsewhere, "m", "other", [3], rows(1, 2))
    write_update(directory, "m", "t", [2], rows(1, 2))
    live = DirectoryUpdateSource(directory)
    applied = live.poll()
    for path in (old, old_of_another_table):  # arrive late, under their (older) names
        shutil.move(path, directory / os.path.basename(path))
    with caplog.at_level(logging.WARNING, logger="hierarchical_parameter_server.updates"):
        applied += live.poll()
    assert [(u.table, int(u.keys[0])) for u in applied] == [("t", 2), ("other", 3)]  # each table: its own order
    (line,) = errors(caplog)
    assert os.path.basename(old) in line and "older than" in line
    assert os.listdir(directory / "rejected") == [os.path.basename(old)]
    replayed = DirectoryUpdateSource(directory).poll()
    assert sorted((u.table, int(u.keys[0])) for u in replayed) == sorted((u.table, int(u.keys[0])) for u in applied)


WRITE_IN_ANOTHER_PROCESS = (
    "import sys, numpy as np; from hierarchical_parameter_server.updates import write_update; "
    "print(write_update(sys.argv[1], 'm', 't', [int(sys.argv[2])], np.ones((1, 2))))"
)


def write_in_another_process(directory, key: int) -> str:
    done = subprocess.run(
        [sys.executable, "-c", WRITE_IN_ANOTHER_PROCESS, str(directory), str(key)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


def write_in_another_thread(directory, key: int) -> str:
    paths = []
    thread = threading.Thread(target=lambda: paths.append(write_update(directory, "m", "t", [key], rows(1, 2))))
    thread.start()
    thread.join(timeout=30)
    (path,) = paths
    return path


@pytest.mark.parametrize("other_writer", [write_in_another_process, write_in_another_thread])
def test_a_late_file_of_another_writer_of_the_table_is_applied(tmp_path, caplog, other_writer):
    elsewhere, directory = tmp_path / "elsewhere", tmp_path / "u"
    old = other_writer(elsewhere, 1)  # e.g. another rank's shard of the table, or another thread's dump
    newer = write_update(directory, "m", "t", [2], rows(1, 2))
    assert read_update(old).sequence < read_update(newer).sequence
    assert read_update(old).writer != read_update(newer).writer
    live = DirectoryUpdateSource(directory)
    applied = live.poll()
    shutil.move(old, directory / os.path.basename(old))  # lands after the newer file of the other writer
    with caplog.at_level(logging.WARNING, logger="hierarchical_parameter_server.updates"):
        applied += live.poll()
    assert keys_of(applied) == [2, 1] and errors(caplog) == []
    assert not os.path.exists(directory / "rejected")
    assert keys_of(DirectoryUpdateSource(directory).poll()) == [1, 2]  # a replay: in sequence order


def test_a_forked_child_is_another_writer(tmp_path):
    parent = read_update(write_update(tmp_path, "m", "t", [1], rows(1, 2))).writer
    pid = os.fork()
    if pid == 0:  # the child: write one file and leave at once
        try:
            write_update(tmp_path / "child", "m", "t", [2], rows(1, 2))
        finally:
            os._exit(0)
    deadline = time.monotonic() + 30
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked writer did not end in 30 s")
        time.sleep(0.01)
    (name,) = os.listdir(tmp_path / "child")
    assert read_update(tmp_path / "child" / name).writer not in (0, parent)


@pytest.mark.parametrize("version", [1, 2])
def test_a_copy_under_another_name_is_refused_as_a_duplicate(tmp_path, caplog, version):
    directory = tmp_path / "u"
    os.makedirs(directory)
    original = directory / f"{time.time_ns():020d}-1-000000.hpsu"
    if version == 1:
        write_version_1(original, b"hps_et.m.t", [1], rows(1, 2))
    else:
        os.replace(write_update(tmp_path / "w", "m", "t", [1], rows(1, 2)), original)
    source = DirectoryUpdateSource(directory)
    assert keys_of(source.poll()) == [1]
    copy = directory / f"{time.time_ns() + 10**9:020d}-1-000000.hpsu"  # a later name
    shutil.copyfile(original, copy)
    with caplog.at_level(logging.WARNING, logger="hierarchical_parameter_server.updates"):
        assert source.poll() == []
    (line,) = errors(caplog)
    assert copy.name in line and "duplicate" in line and original.name in line
    assert os.listdir(directory / "rejected") == [copy.name]
    shutil.copyfile(original, copy)  # a new source (a restart) finds both: the copy is refused again
    assert keys_of(DirectoryUpdateSource(directory).poll()) == [1]


def test_a_symbolic_link_is_refused(tmp_path, caplog):
    target = write_update(tmp_path / "outside", "m", "t", [1], rows(1, 2))
    directory = tmp_path / "u"
    os.makedirs(directory)
    os.symlink(target, directory / "link.hpsu")
    with caplog.at_level(logging.WARNING, logger="hierarchical_parameter_server.updates"):
        assert DirectoryUpdateSource(directory).poll() == []
    (line,) = errors(caplog)
    assert "link.hpsu" in line and "symbolic link" in line
    assert os.listdir(directory / "rejected") == ["link.hpsu"] and os.path.exists(target)


def test_a_half_written_file_waits_until_it_is_complete(tmp_path):
    data = open(write_update(tmp_path / "w", "m", "t", [1, 2], rows(2, 2)), "rb").read()
    directory = tmp_path / "u"
    source = DirectoryUpdateSource(directory)
    part = directory / "00000000000000000001-1-000000.hpsu"
    for cut in (0, 3, 20, len(data) // 2, len(data) - 1):  # as cp or scp leave it meanwhile
        part.write_bytes(data[:cut])
        assert source.poll() == []
    assert not os.path.exists(directory / "rejected")
    part.write_bytes(data)
    assert keys_of(source.poll()) == [1, 2]


def test_an_incomplete_file_is_rejected_when_its_size_stays_for_the_timeout(tmp_path, monkeypatch, caplog):
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    data = open(write_update(tmp_path / "w", "m", "t", [1, 2], rows(2, 2)), "rb").read()
    directory = tmp_path / "u"
    source = DirectoryUpdateSource(directory, incomplete_timeout_s=300)
    part = directory / "00000000000000000001-1-000000.hpsu"
    part.write_bytes(data[:10])
    assert source.poll() == []
    now[0] += 200
    part.write_bytes(data[:30])  # it grew: the 300 s start again
    assert source.poll() == []
    now[0] += 299
    assert source.poll() == [] and not os.path.exists(directory / "rejected")
    now[0] += 2
    with caplog.at_level(logging.WARNING, logger="hierarchical_parameter_server.updates"):
        assert source.poll() == []
    (line,) = errors(caplog)
    assert part.name in line and "incomplete" in line and "300" in line
    assert os.listdir(directory / "rejected") == [part.name]


def peak_memory_of(fn):
    tracemalloc.start()
    try:
        result = fn()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_big_junk_file_costs_a_small_read(tmp_path, caplog):
    with open(tmp_path / "junk.hpsu", "wb") as f:
        f.write(b"JUNK" * 8)
        f.truncate(64 << 20)
    with caplog.at_level(logging.WARNING, logger="hierarchical_parameter_server.updates"):
        got, peak = peak_memory_of(DirectoryUpdateSource(tmp_path).poll)
    assert got == [] and peak < 1 << 20
    assert "not an update file" in errors(caplog)[0]


def test_a_huge_declared_size_is_checked_against_the_file_size(tmp_path):
    path = write_update(tmp_path, "m", "t", [1], rows(1, 2))
    data = bytearray(open(path, "rb").read())
    struct.pack_into("<Q", data, 32 + len(b"hps_et.m.t"), 2**40)  # the row count
    open(path, "wb").write(bytes(data))
    with pytest.raises(updates_module.UpdateIncomplete, match="header says 1099511627776 rows") as caught:
        peak_memory_of(lambda: read_update(path))
    assert isinstance(caught.value, UpdateFileError)
    _, peak = peak_memory_of(lambda: DirectoryUpdateSource(tmp_path, incomplete_timeout_s=0).poll())
    assert peak < 1 << 20 and os.listdir(tmp_path / "rejected") == [os.path.basename(path)]


def test_background_thread_applies_in_order_and_retries(tmp_path):
    source = DirectoryUpdateSource(tmp_path, poll_interval_s=0.01)
    applied, failures = [], []

    def apply(update):
        if update.keys[0] == 2 and len(failures) < 3:
            failures.append(update.keys[0])
            raise RuntimeError("tier down")
        applied.append(int(update.keys[0]))

    def wait_for(count: int) -> None:
        deadline = time.monotonic() + 10
        while len(applied) < count and time.monotonic() < deadline:
            time.sleep(0.01)

    for i in range(4):
        write_update(tmp_path, "m", "t", [i], rows(1, 2))
    source.start(apply)
    with pytest.raises(RuntimeError, match="runs already"):
        source.start(apply)
    wait_for(4)
    write_update(tmp_path, "m", "t", [4], rows(1, 2))  # found by a later poll of the running thread
    wait_for(5)
    source.stop()
    source.stop()
    assert applied == [0, 1, 2, 3, 4] and failures == [2, 2, 2]


def test_from_config(tmp_path):
    update_source = {"type": "directory", "path": str(tmp_path), "poll_interval_ms": 250}
    cfg = load_config(support.ps_config([support.model_entry("m", ["a"], [4])], update_source=update_source))
    source = DirectoryUpdateSource.from_config(cfg.update_source, ["m"])
    assert (source.directory, source.poll_interval_s, source.model_filters) == (str(tmp_path), 0.25, ("m",))


def test_dump_increment_writes_the_changed_rows(tmp_path):
    tf = pytest.importorskip("tensorflow")
    import datetime

    import sparse_operation_kit as sok

    dyn = sok.DynamicVariable(dimension=4, var_type="hybrid", name="inc", init_capacity=1024, max_capacity=1 << 16)
    sok.assign(dyn, tf.range(10, dtype=dyn.key_type), rows(10, 4))
    time.sleep(0.01)
    since = datetime.datetime.now(datetime.timezone.utc)
    time.sleep(0.01)
    changed = np.array([2, 7, 11], np.int64)
    sok.assign(dyn, tf.constant(changed, dyn.key_type), rows(3, 4, seed=5))
    paths = dump_increment(tmp_path / "u", "foo", ["sparse_embedding0"], [dyn], since)
    assert len(paths) == 1
    update = read_update(paths[0])
    order = np.argsort(update.keys)
    np.testing.assert_array_equal(update.keys[order], changed)
    np.testing.assert_array_equal(update.values[order], rows(3, 4, seed=5))
    with pytest.raises(ValueError, match="one per variable"):
        dump_increment(tmp_path / "u", "foo", ["a", "b"], [dyn], since)


def test_a_rejected_file_never_overwrites_one_of_the_same_name(tmp_path):
    for junk in (b"JNK1", b"JNK2", b"JNK3"):
        (tmp_path / "x.hpsu").write_bytes(junk * 8)
        assert DirectoryUpdateSource(tmp_path).poll() == []
    rejected = tmp_path / "rejected"
    assert sorted(os.listdir(rejected)) == ["x.hpsu", "x.hpsu.1", "x.hpsu.2"]
    assert [(rejected / n).read_bytes()[:4] for n in ("x.hpsu", "x.hpsu.1", "x.hpsu.2")] == [b"JNK1", b"JNK2", b"JNK3"]


def test_a_replay_holds_one_file_at_a_time(tmp_path):
    files, size, dim = 6, 4 << 20, 256
    count = size // (8 + 4 * dim)
    for i in range(files):
        write_update(tmp_path, "m", "t", np.arange(count) + i * count, np.full((count, dim), i, np.float32))
    applied = []
    source = DirectoryUpdateSource(tmp_path, poll_interval_s=0.01)
    tracemalloc.start()
    try:
        source.start(lambda u: applied.append((int(u.keys[0]), float(u.values[0, 0]))))
        deadline = time.monotonic() + 60
        while len(applied) < files and time.monotonic() < deadline:
            time.sleep(0.01)
        source.stop(timeout_s=10)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert applied == [(i * count, float(i)) for i in range(files)]
    assert peak < 3 * size, f"peak {peak / 2**20:.1f} MiB while replaying {files} files of {size / 2**20:g} MiB"


def test_an_error_while_reading_loses_no_file(tmp_path, monkeypatch, caplog):
    for i in range(3):
        write_update(tmp_path, "m", "t", [i], rows(1, 2))
    read_into, calls = updates_module._read_into, []

    def fails_at_the_second_file(*args):
        calls.append(1)
        if len(calls) == 2:
            raise MemoryError("no memory for the rows (test)")
        return read_into(*args)

    monkeypatch.setattr(updates_module, "_read_into", fails_at_the_second_file)
    applied = []
    source = DirectoryUpdateSource(tmp_path, poll_interval_s=0.01)
    with caplog.at_level(logging.WARNING, logger="hierarchical_parameter_server.updates"):
        source.start(lambda u: applied.append(int(u.keys[0])))
        deadline = time.monotonic() + 5
        while len(applied) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        source.stop(timeout_s=5)
    assert applied == [0, 1, 2]
    assert any(
        "no memory" in r.getMessage() or (r.exc_info and "no memory" in str(r.exc_info[1])) for r in caplog.records
    )
