"""Progress reporting for long operations (export, dump, load, the demo, benchmarks).

Library functions take an optional ``callback``; the default does nothing. The CLI passes a
:class:`TqdmCallback`, which imports tqdm only when used.

Example::

    >>> cb = TqdmCallback(desc="export")
    >>> cb.set_size(100); cb.relative_update(100); cb.close()
"""

from __future__ import annotations

from typing import Any


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
    """A tqdm progress bar; ``tqdm_kwargs`` go to ``tqdm.tqdm``."""

    def __init__(self, **tqdm_kwargs: Any) -> None:
        super().__init__()
        self._kwargs = tqdm_kwargs
        self._bar: Any = None

    def _ensure_bar(self) -> Any:
        if self._bar is None:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=self.size, **self._kwargs)
        return self._bar

    def set_size(self, size: int) -> None:
        super().set_size(size)
        self._ensure_bar().total = size

    def relative_update(self, inc: int = 1) -> None:
        super().relative_update(inc)
        self._ensure_bar().update(inc)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
