"""Who the other processes are and how to talk to them: Horovod, or a single process.

``sok.init()`` picks the tool once per process. Without it, SOK runs as a single process, unless
Horovod is running with several ranks, where a collective call says that ``sok.init()`` is missing
(a rank that silently worked alone would return wrong results).

Example::

    import horovod.tensorflow as hvd
    hvd.init()
    sok.init()            # comm_tool="horovod"
    sok.rank(), sok.num_ranks()
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["init", "rank", "num_ranks", "tool", "CommunicationTool", "HorovodTool", "SingleProcess"]

COMM_TOOLS = ("horovod", "single")


class CommunicationTool:
    """The collectives SOK needs, on TensorFlow tensors."""

    name = "base"

    def rank(self) -> int:
        raise NotImplementedError

    def num_ranks(self) -> int:
        raise NotImplementedError

    def allgather(self, tensor: Any) -> Any:
        raise NotImplementedError

    def alltoall(self, tensor: Any, splits: Any) -> Any:
        raise NotImplementedError

    def allreduce_sum(self, tensor: Any) -> Any:
        raise NotImplementedError

    def broadcast(self, tensor: Any, root: int) -> Any:
        raise NotImplementedError


class SingleProcess(CommunicationTool):
    """One process: every collective is the identity."""

    name = "single"

    def rank(self) -> int:
        return 0

    def num_ranks(self) -> int:
        return 1

    def allgather(self, tensor: Any) -> Any:
        return tensor

    def alltoall(self, tensor: Any, splits: Any) -> Any:
        return tensor

    def allreduce_sum(self, tensor: Any) -> Any:
        return tensor

    def broadcast(self, tensor: Any, root: int) -> Any:
        return tensor


class HorovodTool(CommunicationTool):
    """Horovod's TensorFlow collectives (Gloo on CPU, NCCL on GPU)."""

    name = "horovod"

    def __init__(self) -> None:
        try:
            import horovod.tensorflow as hvd
        except ImportError as error:
            raise ImportError(
                "sok.init(comm_tool='horovod') needs Horovod built with TensorFlow support: see the README "
                "(ci/setup.sh builds it), or use comm_tool='single' for one process"
            ) from error
        if not hvd.is_initialized():
            hvd.init()
        self._hvd = hvd

    def rank(self) -> int:
        return self._hvd.rank()

    def num_ranks(self) -> int:
        return self._hvd.size()

    def allgather(self, tensor: Any) -> Any:
        return self._hvd.allgather(tensor)

    def alltoall(self, tensor: Any, splits: Any) -> Any:
        received = self._hvd.alltoall(tensor, splits=splits)
        return received[0] if isinstance(received, tuple) else received

    def allreduce_sum(self, tensor: Any) -> Any:
        return self._hvd.allreduce(tensor, op=self._hvd.Sum)

    def broadcast(self, tensor: Any, root: int) -> Any:
        return self._hvd.broadcast(tensor, root)


_tool: CommunicationTool | None = None


def init(comm_tool: str = "horovod", use_legacy_optimizer: bool = True) -> None:
    """Choose how SOK's processes communicate; once per process.

    Args:
        comm_tool: ``"horovod"`` (initialises Horovod if needed) or ``"single"`` (one process).
        use_legacy_optimizer: accepted for compatibility; Keras is never modified.
    """
    global _tool
    if _tool is not None:
        raise RuntimeError(
            f"sok.init() was already called (communication tool {_tool.name!r}); call it once per process"
        )
    if comm_tool not in COMM_TOOLS:
        raise ValueError(f"comm_tool {comm_tool!r} is not supported; valid: {', '.join(COMM_TOOLS)}")
    _tool = HorovodTool() if comm_tool == "horovod" else SingleProcess()
    logger.info("SOK initialized: communication tool %s, rank %d of %d", _tool.name, _tool.rank(), _tool.num_ranks())


def tool() -> CommunicationTool:
    """The communication tool of this process (a single process when sok.init was not called)."""
    if _tool is not None:
        return _tool
    try:
        import horovod.tensorflow as hvd

        if hvd.is_initialized() and hvd.size() > 1:
            raise RuntimeError(
                f"Horovod runs {hvd.size()} processes but sok.init() was not called; call sok.init() after "
                f"hvd.init() on every rank"
            )
    except ImportError:
        pass
    return SingleProcess()


def rank() -> int:
    """This process's rank."""
    return tool().rank()


def num_ranks() -> int:
    """The number of processes."""
    return tool().num_ranks()
