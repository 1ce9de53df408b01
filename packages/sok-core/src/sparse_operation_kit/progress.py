"""Progress reporting for long operations (export, dump, load, the demo, benchmarks).

Library functions take an optional ``callback``; the default does nothing. The CLI passes a
:class:`TqdmCallback`, which imports tqdm only when used: a bar on a terminal, and a few plain
lines where the output is a file or a pipe (``sok demo > log``), which a bar would fill with
carriage-return frames.

Example::

    >>> cb = TqdmCallback(desc="export")
    >>> cb.set_size(100); cb.relative_update(100); cb.close()
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, TextIO

from sparse_operation_kit.validate import positive_int

LOG_LINES = 10
"""Lines a log gets over a job of known size by default: one at each tenth of it (10%, 20%, ...)."""

LOG_SECONDS = 60.0
"""The most seconds a log waits for a line by default while work goes on (slow or unsized jobs)."""


class Callback:
    """Receives the total size of a job and its progress."""

    def __init__(self) -> None:
        self.size: int | None = None
        self.value = 0

    def set_size(self, size: int) -> None:
        """The total amount of work, in the unit of :meth:`relative_update`."""
        self.size = size

    def relative_update(self, inc: int = 1) -> None:
        """``inc`` more units of work are done."""
        self.value += inc

    def close(self) -> None:
        """The job is over."""

    def __enter__(self) -> Callback:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class NoOpCallback(Callback):
    """The default: counts, shows nothing."""


class TqdmCallback(Callback):
    """A tqdm progress bar on a terminal; a few plain lines in a log.

    The output goes to ``tqdm_kwargs["file"]`` (default ``sys.stderr``). Where that stream is a
    terminal, or tqdm shows its notebook widget, or ``disable`` is given (True, or None: tqdm's
    "off where not a terminal"), ``tqdm_kwargs`` go to ``tqdm.auto.tqdm`` as they are; without a
    ``disable`` keyword, tqdm's environment switch ``TQDM_DISABLE`` (any non-empty value, as tqdm
    reads it) turns the output off on a terminal and in a log alike. Elsewhere (a
    file, a pipe, horovodrun's capture of a rank's output) no bar is drawn and no ``\\r`` written:
    a line in tqdm's format without the bar (``insert:  40% 400/1000 [00:02<00:03, 200.00key/s]``)
    each time the work passes another ``1 / log_lines`` of its size, one when ``log_seconds`` have
    passed since the last line (the only lines while the size is unknown), and one at :meth:`close`
    unless the last line shows the same count. These lines use ``desc``, ``unit``, ``unit_scale``
    and ``unit_divisor`` of ``tqdm_kwargs``; the other keywords shape the bar only. A log thus gets
    at most ``log_lines`` lines plus one per ``log_seconds`` of work, and the last shows the count.

    Args:
        log_lines: lines a log gets over the whole size (at each ``1 / log_lines`` of it), >= 1;
            default :data:`LOG_LINES`.
        log_seconds: the most seconds a log waits for a line while the work goes on, > 0; default
            :data:`LOG_SECONDS`.
        **tqdm_kwargs: for ``tqdm.tqdm`` (``total`` comes from :meth:`set_size`).

    Example::

        >>> import io
        >>> log = io.StringIO()  # not a terminal
        >>> with TqdmCallback(file=log, desc="insert", unit="key") as bar:
        ...     bar.set_size(1000)
        ...     for _ in range(1000):
        ...         bar.relative_update(1)
        >>> len(log.getvalue().splitlines()), "\\r" in log.getvalue()
        (10, False)
        >>> log.getvalue().splitlines()[-1].startswith("insert: 100% 1000/1000 [")
        True
    """

    def __init__(self, *, log_lines: int = LOG_LINES, log_seconds: float = LOG_SECONDS, **tqdm_kwargs: Any) -> None:
        super().__init__()
        self._log_lines = positive_int(log_lines, "log_lines")
        if not (isinstance(log_seconds, (int, float)) and not isinstance(log_seconds, bool) and log_seconds > 0):
            raise ValueError(f"log_seconds {log_seconds!r} is not valid; valid: a number of seconds > 0")
        self._log_seconds = float(log_seconds)
        self._kwargs = tqdm_kwargs
        self._bar: Any = None

    def _ensure_bar(self) -> Any:
        if self._bar is None:
            from tqdm.auto import tqdm

            stream = self._kwargs.get("file") or sys.stderr
            if "disable" in self._kwargs:
                disable = self._kwargs["disable"]
            elif _env_disables():
                disable = True
                self._kwargs = {**self._kwargs, "disable": True}  # tqdm reads its env at import only
            else:
                disable = False
            if disable or disable is None or _is_terminal(stream) or _is_notebook(tqdm):
                self._bar = tqdm(total=self.size, **self._kwargs)
            else:
                self._bar = _LogLines(stream, self.size, self._log_lines, self._log_seconds, self._kwargs)
        return self._bar

    def set_size(self, size: int) -> None:
        super().set_size(size)
        self._ensure_bar().total = size

    def relative_update(self, inc: int = 1) -> None:
        super().relative_update(inc)
        self._ensure_bar().update(inc)

    def set_postfix_str(self, text: str) -> None:
        """Show ``text`` after the counts (a loss, a rate), from the next frame or line on."""
        self._ensure_bar().set_postfix_str(text)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _env_disables() -> bool:
    """Whether tqdm's environment switch ``TQDM_DISABLE`` is on: tqdm takes ``bool(value)``."""
    return bool(os.environ.get("TQDM_DISABLE", ""))


def _is_terminal(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty())


def _is_notebook(bar_class: type) -> bool:
    """Whether ``tqdm.auto`` chose tqdm's notebook widget, which writes no frames to a stream."""
    notebook = sys.modules.get("tqdm.notebook")
    return notebook is not None and issubclass(bar_class, notebook.tqdm)


class _LogLines:
    """What :class:`TqdmCallback` writes where its stream is not a terminal: tqdm's meter without
    the bar, as whole lines, at each ``1 / log_lines`` of ``total``, after ``log_seconds`` without
    a line, and at :meth:`close`. It has the part of tqdm's interface that TqdmCallback uses."""

    def __init__(
        self, stream: TextIO, total: int | None, log_lines: int, log_seconds: float, tqdm_kwargs: dict[str, Any]
    ) -> None:
        self.total = total
        self.n = 0
        self._stream = stream
        self._log_lines = log_lines
        self._log_seconds = log_seconds
        self._meter = {
            "prefix": tqdm_kwargs.get("desc") or "",
            "unit": tqdm_kwargs.get("unit", "it"),
            "unit_scale": tqdm_kwargs.get("unit_scale", False),
            "unit_divisor": tqdm_kwargs.get("unit_divisor", 1000),
        }
        self._postfix = ""
        self._start = self._last_time = time.monotonic()
        self._marks_shown = 0  # of the log_lines marks of total, how many have had their line
        self._last_n: int | None = None  # the count the last line showed

    def update(self, inc: int = 1) -> None:
        self.n += inc
        now = time.monotonic()
        if self.total:
            marks = min(self.n * self._log_lines // self.total, self._log_lines)
            if marks > self._marks_shown:
                self._marks_shown = marks
                self._write(now)
                return
        if now - self._last_time >= self._log_seconds:
            self._write(now)

    def set_postfix_str(self, text: str) -> None:
        self._postfix = text

    def close(self) -> None:
        if self.n != self._last_n:
            self._write(time.monotonic())

    def _write(self, now: float) -> None:
        from tqdm.std import tqdm

        line = tqdm.format_meter(self.n, self.total, now - self._start, ncols=0, postfix=self._postfix, **self._meter)
        self._stream.write(line + "\n")
        self._stream.flush()
        self._last_time, self._last_n = now, self.n
