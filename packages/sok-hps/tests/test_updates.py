"""Online-update files and the directory update source.

* write_update / read_update round trip (int64 and uint64 keys, any dim); the file is the
  documented layout (header fields read back with struct, not through read_update).
* Atomic: a failed write leaves no visible file and no temporary; a reader polling while a writer
  writes never sees part of a file.
* poll() returns each file once, in name (time) order; bad files (wrong magic, truncated, corrupt,
  bad tag) go to rejected/ with a warning; filters are full matches on the model name.
* start()/stop() apply updates in a thread; an apply that fails is retried, in order.
* dump_increment writes the rows sok.incremental_model_dump returns.
"""

from __future__ import annotations

import logging
import os
import struct
import sys
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
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
    data = open(write_update(tmp_path, "m", "t", keys, values), "rb").read()
    magic, value_size, version, key_size, tag_len = struct.unpack_from("<IIHHI", data)
    assert (magic, value_size, version, key_size) == (0x52544348, 12, 1, 8) and data[:4] == b"HCTR"
    assert data[16 : 16 + tag_len] == b"hps_et.m.t"
    offset = 16 + tag_len
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


def test_poll_returns_each_file_once_in_name_order(tmp_path):
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
        data[16:22] = b"xx_et."
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
def test_bad_files_are_rejected_with_a_warning(tmp_path, caplog, how, words):
    good_before = write_update(tmp_path, "m", "t", [1], rows(1, 2))
    bad = write_update(tmp_path, "m", "t", [2], rows(1, 2))
    write_update(tmp_path, "m", "t", [3], rows(1, 2))
    corrupt(bad, how)
    with pytest.raises(UpdateFileError, match=words):
        read_update(bad)
    with caplog.at_level(logging.WARNING, logger="hierarchical_parameter_server.updates"):
        got = DirectoryUpdateSource(tmp_path).poll()
    assert [u.keys[0] for u in got] == [1, 3]
    assert words in caplog.text and os.path.basename(bad) in caplog.text
    assert os.listdir(tmp_path / "rejected") == [os.path.basename(bad)]
    assert os.path.exists(good_before)


def test_filters_match_the_whole_model_name(tmp_path):
    for model in ("foo", "foobar", "bar", "baz"):
        write_update(tmp_path, model, "t", [1], rows(1, 2))
    got = DirectoryUpdateSource(tmp_path, model_filters=["foo", "ba."]).poll()
    assert [u.model for u in got] == ["foo", "bar", "baz"]
    assert not os.path.exists(tmp_path / "rejected")


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
