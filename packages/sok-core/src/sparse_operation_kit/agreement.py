"""Per-rank failures of an eager collective call (``sok.dump``, ``sok.load``), agreed on by every rank.

A rank that fails half-way through a collective call and leaves it would leave the others waiting in
the next collective forever. Instead each rank runs its local work through :meth:`Agreement.run`,
which keeps the first exception, and at fixed points :meth:`Agreement.check` has every rank say
whether it failed (one allgather of one integer); if any did, every rank raises: the failing rank its
own exception, the others an exception that names the failing ranks and their messages (one more
allgather, only on that path). With one process nothing is exchanged and exceptions propagate as
they happen.

Example::

    agreement = Agreement(comm, "sok.dump to ckpt")
    agreement.run(write_files)   # may fail on one rank only
    agreement.check()            # every rank raises, or none
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import tensorflow as tf

from sparse_operation_kit import communication
from sparse_operation_kit.checkpoint import format as fmt

logger = logging.getLogger(__name__)

__all__ = ["Agreement", "RankFailure", "decode", "encode"]

T = TypeVar("T")


def encode(text: str) -> bytes:
    """``text`` as bytes for the other ranks, as the file system encodes names (``os.fsencode``:
    surrogate escapes, e.g. an undecodable path's ``"ck\\udcff"``, become their bytes, never an error)."""
    return os.fsencode(text)


def decode(data: bytes) -> str:
    """The text that :func:`encode` made ``data`` from (``os.fsdecode``)."""
    return os.fsdecode(data)


class RankFailure(RuntimeError):
    """Another rank failed in a collective call; this rank stopped with it (its message says why)."""


class _CheckpointRankFailure(RankFailure, fmt.CheckpointError):
    """A checkpoint problem found on another rank (a CheckpointError on every rank)."""


class Agreement:
    """Collects this rank's first failure in ``call`` and agrees on failures with the other ranks."""

    def __init__(self, comm: communication.CommunicationTool, call: str) -> None:
        self.comm, self.call = comm, call
        self.error: Exception | None = None
        self._checks = 0

    @property
    def collective(self) -> bool:
        return self.comm.num_ranks() > 1

    def run(self, fn: Callable[..., T], *args: Any) -> T | None:
        """``fn(*args)``; with several ranks an exception is kept (the first one) for :meth:`check`
        and None returned; ``fn`` is not called once this rank has failed."""
        if not self.collective:
            return fn(*args)
        if self.error is not None:
            return None
        try:
            return fn(*args)
        except Exception as error:
            logger.exception("%s failed on rank %d; the other ranks stop at the next agreement", self.call, self.rank)
            self.error = error
            return None

    @property
    def rank(self) -> int:
        return self.comm.rank()

    def fail(self, error: Exception) -> None:
        """Record a failure caught by the caller (the first one is kept)."""
        if not self.collective:
            raise error
        if self.error is None:
            self.error = error

    def check(self) -> None:
        """Collective: raise on every rank if any rank has failed since the start."""
        if not self.collective:
            return
        self._checks += 1
        flags = self._allgather(np.array([self.error is not None], np.int64), "status")
        failed = [r for r, flag in enumerate(flags) if flag]
        if not failed:
            return
        text = "" if self.error is None else f"{type(self.error).__name__}: {self.error}"
        messages = dict(enumerate(self.texts(text)))
        if self.error is not None:
            raise self.error
        detail = "; ".join(f"rank {r}: {messages[r]}" for r in failed)
        kind = _CheckpointRankFailure if any("CheckpointError" in messages[r] for r in failed) else RankFailure
        raise kind(f"{self.call} failed on rank(s) {failed}, so it stopped on every rank ({detail})")

    def texts(self, text: str) -> list[str]:
        """Collective: every rank's ``text``, rank by rank (``[text]`` with one rank).

        Example::

            paths = agreement.texts(path)   # ["ckpt", "ckpt"] when two ranks agree
        """
        if not self.collective:
            return [text]
        data = encode(text)
        sizes = self._allgather(np.array([len(data)], np.int64), "text-size")
        raw = self._allgather(np.frombuffer(data, np.uint8), "text").tobytes()
        out, start = [], 0
        for size in sizes:
            out.append(decode(raw[start : start + int(size)]))
            start += int(size)
        return out

    def _allgather(self, values: np.ndarray, what: str) -> np.ndarray:
        return self.comm.allgather(tf.constant(values)).numpy()
