"""TqdmCallback: a bar on a terminal, a few plain lines (no carriage returns) in a log."""

from __future__ import annotations

import io
import sys
import types

import pytest
from sparse_operation_kit import progress
from sparse_operation_kit.progress import TqdmCallback


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


class Clock:
    """``time.monotonic`` of the progress module, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(progress, "time", types.SimpleNamespace(monotonic=fake.monotonic))
    return fake


def run(stream, steps: int, **kwargs) -> str:
    with TqdmCallback(file=stream, **kwargs) as bar:
        bar.set_size(steps)
        for _ in range(steps):
            bar.relative_update(1)
    return stream.getvalue()


def test_a_log_gets_a_line_per_tenth_and_no_carriage_returns():
    text = run(io.StringIO(), 10_000, desc="insert", unit="key")
    assert "\r" not in text
    lines = text.splitlines()
    assert [line.split("%")[0] for line in lines] == [f"insert: {p:3d}" for p in range(10, 101, 10)]
    assert lines[-1].startswith("insert: 100% 10000/10000 [")
    assert "key/s" in lines[-1]


def test_a_terminal_gets_the_bar_frames():
    text = run(Terminal(), 10_000, desc="insert", mininterval=0)
    assert text.count("\r") > 100
    assert "10000/10000" in text


def test_log_lines_sets_the_number_of_lines():
    assert len(run(io.StringIO(), 1000, log_lines=4).splitlines()) == 4
    assert len(run(io.StringIO(), 3, log_lines=10).splitlines()) == 3  # a line at most per update


def test_close_writes_the_count_the_last_line_did_not_show():
    stream = io.StringIO()
    with TqdmCallback(file=stream, desc="load", unit="table") as bar:
        bar.set_size(100)
        bar.relative_update(5)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("load:   5% 5/100 [")


def test_slow_work_gets_a_line_every_log_seconds(clock):
    stream = io.StringIO()
    with TqdmCallback(file=stream, desc="fill", log_seconds=30) as bar:  # no size: no tenths
        for _ in range(8):  # the first update starts the clock; one step every 10 s after it
            bar.relative_update(1)
            clock.now += 10
        assert [line.split(" [")[0] for line in stream.getvalue().splitlines()] == ["fill: 4it", "fill: 7it"]
    assert stream.getvalue().splitlines()[-1].startswith("fill: 8it [01:20, ")


def test_the_postfix_is_in_the_lines():
    stream = io.StringIO()
    with TqdmCallback(file=stream, desc="epoch 1/1", unit="step") as bar:
        bar.set_size(10)
        for step in range(10):
            bar.set_postfix_str(f"loss {step}")
            bar.relative_update(1)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 10
    assert lines[-1].endswith(", loss 9]")


@pytest.mark.parametrize("disable", [True, None])
def test_a_disabled_bar_writes_nothing_to_a_log(disable):
    assert run(io.StringIO(), 100, disable=disable) == ""


def test_a_notebook_keeps_tqdms_widget(monkeypatch):
    """Where tqdm.auto picked tqdm.notebook, TqdmCallback leaves the drawing to it."""
    import tqdm.auto
    import tqdm.std

    class NotebookBar(tqdm.std.tqdm):  # stands in for the widget: it writes tqdm's frames
        pass

    monkeypatch.setitem(sys.modules, "tqdm.notebook", types.SimpleNamespace(tqdm=NotebookBar))
    monkeypatch.setattr(tqdm.auto, "tqdm", NotebookBar)
    assert "\r" in run(io.StringIO(), 10)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"log_lines": 0}, "log_lines must be an integer >= 1, got 0"),
        ({"log_seconds": 0}, "log_seconds 0 is not valid; valid: a number of seconds > 0"),
        ({"log_seconds": "1"}, "log_seconds '1' is not valid"),
    ],
)
def test_bad_log_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TqdmCallback(**kwargs)


def test_the_defaults_are_the_module_constants():
    assert (progress.LOG_LINES, progress.LOG_SECONDS) == (10, 60.0)
    assert len(run(io.StringIO(), 10_000).splitlines()) == progress.LOG_LINES


@pytest.mark.parametrize("stream_type", [io.StringIO, Terminal])
def test_tqdms_env_switch_turns_a_log_and_a_bar_off(monkeypatch, stream_type):
    monkeypatch.setenv("TQDM_DISABLE", "1")
    assert run(stream_type(), 1000) == ""


def test_a_disable_keyword_wins_over_the_env_switch(monkeypatch):
    """As in tqdm: an explicit keyword beats TQDM_DISABLE (the demo passes disable=rank != 0)."""
    monkeypatch.setenv("TQDM_DISABLE", "1")
    assert len(run(io.StringIO(), 1000, disable=False).splitlines()) == progress.LOG_LINES


def test_an_empty_env_switch_leaves_the_lines_on(monkeypatch):
    monkeypatch.setenv("TQDM_DISABLE", "")
    assert len(run(io.StringIO(), 1000).splitlines()) == progress.LOG_LINES
