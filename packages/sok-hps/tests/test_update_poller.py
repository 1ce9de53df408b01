"""The background poller of DirectoryUpdateSource survives the filesystem and bad updates.

* An update this server cannot apply (apply raises a ValueError: UpdateRejected) is left in place
  for other readers, recorded and never retried by this source, with one error line; the updates
  after it are applied.
* A directory, a FIFO or a symbolic link named ``*.hpsu`` is never opened: it goes to rejected/
  with one error line, and the thread goes on.
* The update directory removed and made again: the thread logs it and goes on.
* stop() returns within its timeout even when an apply hangs, with an error line.

Every wait is bounded: a poll until a condition with a deadline, joins with a timeout.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time

import numpy as np
import pytest
from hierarchical_parameter_server.updates import DirectoryUpdateSource, UpdateRejected, write_update

LOGGER = "hierarchical_parameter_server"


def wait_for(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition was not met in time"
        time.sleep(0.01)


def row(key: int) -> tuple[list[int], np.ndarray]:
    return [key], np.full((1, 2), float(key), np.float32)


@pytest.fixture
def running(tmp_path):
    """running(apply) -> the started source of ``tmp_path / 'u'`` (polled every 10 ms); stopped after."""
    sources = []

    def start(apply):
        source = DirectoryUpdateSource(tmp_path / "u", poll_interval_s=0.01)
        source.start(apply)
        sources.append(source)
        return source

    yield start
    for source in sources:
        source.stop(timeout_s=5)


def errors_naming(caplog, name: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == logging.ERROR and name in r.getMessage()]


def test_an_update_apply_refuses_is_left_for_other_readers_and_the_stream_goes_on(tmp_path, running, caplog):
    applied, refused = [], []

    def apply(update):
        if update.keys[0] == 2:
            refused.append(2)
            raise UpdateRejected("rows of width 3, but the table's dim is 2")
        applied.append(int(update.keys[0]))

    directory = tmp_path / "u"
    paths = [write_update(directory, "m", "t", *row(i)) for i in range(4)]
    with caplog.at_level(logging.INFO, logger=LOGGER):
        source = running(apply)
        wait_for(lambda: applied == [0, 1, 3])
        write_update(directory, "m", "t", *row(4))
        wait_for(lambda: applied == [0, 1, 3, 4])
        time.sleep(0.1)  # ten more polls: the refused file is not tried again
    bad = os.path.basename(paths[2])
    assert os.path.exists(paths[2]) and not os.path.exists(directory / "rejected")  # another server may apply it
    assert refused == [2] and list(source.unapplied) == [bad] and "width 3" in source.unapplied[bad]
    (line,) = errors_naming(caplog, bad)
    assert "width 3" in line.getMessage()
    other_readers = DirectoryUpdateSource(directory).poll()
    assert [int(u.keys[0]) for u in other_readers] == [0, 1, 2, 3, 4]


def test_a_directory_named_like_an_update_does_not_stop_the_thread(tmp_path, running, caplog):
    directory = tmp_path / "u"
    os.makedirs(directory / "sub.hpsu")
    applied = []
    with caplog.at_level(logging.INFO, logger=LOGGER):
        source = running(lambda u: applied.append(int(u.keys[0])))
        write_update(directory, "m", "t", *row(1))
        wait_for(lambda: applied == [1])
    assert source._thread.is_alive()
    assert os.listdir(directory / "rejected") == ["sub.hpsu"]
    (line,) = errors_naming(caplog, "sub.hpsu")
    assert "not a regular file" in line.getMessage()


def test_a_fifo_named_like_an_update_is_never_opened(tmp_path, running, caplog):
    directory = tmp_path / "u"
    os.makedirs(directory)
    fifo = directory / "pipe.hpsu"
    os.mkfifo(fifo)
    applied = []
    try:
        with caplog.at_level(logging.INFO, logger=LOGGER):
            source = running(lambda u: applied.append(int(u.keys[0])))
            write_update(directory, "m", "t", *row(1))
            wait_for(lambda: applied == [1])
        assert os.listdir(directory / "rejected") == ["pipe.hpsu"]
        assert errors_naming(caplog, "pipe.hpsu")
        stopper = threading.Thread(target=source.stop)
        stopper.start()
        stopper.join(timeout=5)
        assert not stopper.is_alive(), "stop() hung"
    finally:  # a reader blocked in open() of the FIFO (before the fix) is let go
        for path in (fifo, directory / "rejected" / "pipe.hpsu"):
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass


def test_the_update_directory_removed_and_made_again(tmp_path, running, caplog):
    directory = tmp_path / "u"
    applied = []
    with caplog.at_level(logging.INFO, logger=LOGGER):
        source = running(lambda u: applied.append(int(u.keys[0])))
        write_update(directory, "m", "t", *row(1))
        wait_for(lambda: applied == [1])
        shutil.rmtree(directory)
        wait_for(lambda: any("cannot be listed" in r.getMessage() for r in caplog.records))
        write_update(directory, "m", "t", *row(2))
        wait_for(lambda: applied == [1, 2])
    assert source._thread.is_alive()
    assert any("can be listed again" in r.getMessage() for r in caplog.records)


def test_stop_is_bounded_when_an_apply_hangs(tmp_path, caplog):
    release, entered = threading.Event(), threading.Event()

    def apply(update):
        entered.set()
        release.wait(10)

    source = DirectoryUpdateSource(tmp_path, poll_interval_s=0.01)
    write_update(tmp_path, "m", "t", *row(1))
    source.start(apply)
    try:
        assert entered.wait(5)
        with caplog.at_level(logging.INFO, logger=LOGGER):
            began = time.monotonic()
            source.stop(timeout_s=0.2)
            assert time.monotonic() - began < 3
        assert any("did not stop" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)
    finally:
        release.set()
