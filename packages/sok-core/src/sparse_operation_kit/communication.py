"""Who the other processes are and how to talk to them: Horovod, or a single process.

``sok.init()`` picks the tool once per process. Without it, SOK runs as a single process, unless
Horovod is running with several ranks, where a collective call says that ``sok.init()`` is missing
(a rank that silently worked alone would return wrong results).

No rank waits forever in a SOK collective when Horovod's stall inspector may shut Horovod down:
with ``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS`` set (read by ``hvd.init()``, so set it before; it must be
larger than ``HOROVOD_STALL_CHECK_TIME_SECONDS``, default 60), a collective that some rank does not
join within that time ends Horovod on every rank, and an eager SOK collective then raises
:class:`CollectiveError` naming the SOK call. ``sok.init()`` logs a warning when several ranks run
without that setting. (Horovod 0.28.1 with a Gloo controller never shuts down for a stall unless
its ``gloo_controller.cc`` is patched: ``global_ranks_.reserve(size_)`` must be ``resize``.)

Example::

    import horovod.tensorflow as hvd
    hvd.init()
    sok.init()            # comm_tool="horovod"
    sok.rank(), sok.num_ranks()
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import re
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

__all__ = [
    "init",
    "rank",
    "num_ranks",
    "tool",
    "CommunicationTool",
    "HorovodTool",
    "SingleProcess",
    "CollectiveError",
    "set_comm_tool",
    "fingerprint",
    "op_name",
    "STALL_SHUTDOWN_SETTING",
]

COMM_TOOLS = ("horovod", "single")

#: Horovod's settings (environment variables, read by ``hvd.init()``) that bound a collective's wait.
STALL_SHUTDOWN_SETTING = "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"
STALL_CHECK_SETTING = "HOROVOD_STALL_CHECK_TIME_SECONDS"
_STALL_CHECK_DEFAULT_S = 60  # Horovod's default warning time
# The start of Horovod's SHUT_DOWN_ERROR (horovod/common/common.h).
_HOROVOD_SHUT_DOWN = "Horovod has been shut down"
_OP_NAME = re.compile(r"[^A-Za-z0-9_.\-/]")


def op_name(name: str) -> str:
    """``name`` (a SOK call, e.g. ``"sok.dump: allgather of sizes"``) as a TensorFlow op name:
    characters other than letters, digits and ``_.-/`` become ``_``."""
    return _OP_NAME.sub("_", name)


def fingerprint(*parts: bytes) -> int:
    """A signed 64-bit digest of ``parts`` (BLAKE2b), the same in every process (unlike ``hash``): what
    the ranks exchange to check that they agree on a call or a value.

    Example::

        fingerprint(b"2 tables: ...") == fingerprint(b"2 tables: ...")   # on every rank
    """
    digest = hashlib.blake2b(digest_size=8)
    for part in parts:
        digest.update(part)
    return int.from_bytes(digest.digest(), "little", signed=True)


class CollectiveError(RuntimeError):
    """A SOK collective did not complete because Horovod shut down: a rank did not join it within
    ``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS`` (Horovod's stall inspector), or a rank failed or exited.

    Attributes:
        call: the SOK call the collective belongs to (e.g. ``"sok.lookup_sparse: allgather of ids"``).
        rank: the rank that raised.
    """

    def __init__(self, message: str, call: str, rank: int) -> None:
        super().__init__(message)
        self.call = call
        self.rank = rank


def _setting_seconds(name: str) -> int | None:
    """The integer value of Horovod's setting ``name`` (as Horovod parses it), or None when unset."""
    value = os.environ.get(name)
    if value is None:
        return None
    match = re.match(r"\s*[-+]?\d+", value)
    return int(match.group()) if match else 0


def stall_shutdown_seconds() -> int | None:
    """Seconds after which Horovod's stall inspector shuts Horovod down when a rank does not join a
    collective, or None when it never does (unset or 0, or not above the stall check time: then
    Horovod only warns)."""
    shutdown = _setting_seconds(STALL_SHUTDOWN_SETTING)
    check = _setting_seconds(STALL_CHECK_SETTING)
    check = _STALL_CHECK_DEFAULT_S if check is None else check
    if not shutdown or shutdown <= 0 or shutdown < check:
        return None
    return shutdown


class CommunicationTool:
    """The collectives SOK needs, on TensorFlow tensors.

    Every collective takes an optional ``name``: the SOK call it belongs to (e.g.
    ``"sok.dump: allgather of sizes"``). Eagerly, an error of the collective names it; inside
    ``tf.function`` it names the op (characters other than letters, digits and ``_.-/`` become
    ``_``; TensorFlow makes it unique in the graph, as Horovod needs among collectives in flight),
    so give one that is the same on every rank.
    """

    name = "base"

    def rank(self) -> int:
        raise NotImplementedError

    def num_ranks(self) -> int:
        raise NotImplementedError

    def local_rank(self) -> int:
        """This process's rank among those of its host."""
        raise NotImplementedError

    def local_size(self) -> int:
        """How many ranks run on this process's host."""
        raise NotImplementedError

    def allgather(self, tensor: Any, name: str | None = None) -> Any:
        raise NotImplementedError

    def alltoall(self, tensor: Any, splits: Any, name: str | None = None) -> tuple[Any, Any]:
        """Rows ``splits[r]`` (in order) of ``tensor`` to rank ``r``: returns the rows received from
        every rank, in rank order, and how many came from each (an int32 ``[num_ranks]``)."""
        raise NotImplementedError

    def allreduce_sum(self, tensor: Any, name: str | None = None) -> Any:
        raise NotImplementedError

    def broadcast(self, tensor: Any, root: int, name: str | None = None) -> Any:
        raise NotImplementedError


class SingleProcess(CommunicationTool):
    """One process: every collective is the identity."""

    name = "single"

    def rank(self) -> int:
        return 0

    def num_ranks(self) -> int:
        return 1

    def local_rank(self) -> int:
        return 0

    def local_size(self) -> int:
        return 1

    def allgather(self, tensor: Any, name: str | None = None) -> Any:
        return tensor

    def alltoall(self, tensor: Any, splits: Any, name: str | None = None) -> tuple[Any, Any]:
        return tensor, splits

    def allreduce_sum(self, tensor: Any, name: str | None = None) -> Any:
        return tensor

    def broadcast(self, tensor: Any, root: int, name: str | None = None) -> Any:
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

    def local_rank(self) -> int:
        return self._hvd.local_rank()

    def local_size(self) -> int:
        return self._hvd.local_size()

    def _run(self, what: str, name: str | None, collective: Callable[[str | None], Any]) -> Any:
        """``collective(op_name)``; eagerly, Horovod's shutdown during it becomes a CollectiveError
        naming the SOK call.

        Inside tf.function the name becomes the op's name, which TensorFlow makes unique in the
        graph; Horovod matches the collectives of the ranks by it, so it must not depend on the
        rank's arguments (Horovod's default, from the input tensor's name, does: a rank that passes
        other tables would wait forever). Eagerly Horovod names every collective after its kind and
        matches them in call order."""
        import tensorflow as tf

        op = None if name is None else op_name(name)
        if not tf.executing_eagerly():
            return collective(op)
        try:
            return collective(op)
        except tf.errors.OpError as error:
            if _HOROVOD_SHUT_DOWN not in str(error):
                raise
            raise self._shut_down_error(what, name, error) from error

    def _shut_down_error(self, what: str, name: str | None, error: Exception) -> CollectiveError:
        call = name or "a SOK call"
        seconds = stall_shutdown_seconds()
        if seconds is None:
            cause = (
                f"another rank failed or exited ({STALL_SHUTDOWN_SETTING} is not in effect here, so it was not "
                f"Horovod's stall inspector)"
            )
        else:
            cause = (
                f"a rank did not join it within {STALL_SHUTDOWN_SETTING}={seconds} s (Horovod's stall inspector; "
                f"its warning on rank 0 lists the missing ranks under 'Missing ranks'), or another rank failed or "
                f"exited"
            )
        return CollectiveError(
            f"the SOK collective {call!r} ({what}) did not complete on rank {self.rank()} of {self.num_ranks()}: "
            f"Horovod shut down because {cause}. Every rank must make the same SOK calls in the same order (a "
            f"rank that skips a call, or raises before it, leaves the others waiting). Horovod cannot be used again in "
            f"this process: restart the job. Horovod said: {str(error).splitlines()[0] if str(error) else error!r}",
            call,
            self.rank(),
        )

    def allgather(self, tensor: Any, name: str | None = None) -> Any:
        return self._run("allgather", name, lambda op: self._hvd.allgather(tensor, name=op))

    def alltoall(self, tensor: Any, splits: Any, name: str | None = None) -> tuple[Any, Any]:
        """Horovod's all-to-all; for floats, its gradient (the all-to-all back) is named after
        ``name`` too. Horovod's own gradient is named after the incoming gradient tensor, whose
        name depends on the ops each rank built before it: ranks that build different graphs (a
        rank that holds a dynamic table, another that does not) would wait for each other's
        differently named collectives forever."""
        import tensorflow as tf

        def collective(op: str | None) -> Any:
            values = tf.convert_to_tensor(tensor)
            if not values.dtype.is_floating:
                return self._hvd.alltoall(values, splits=splits, name=op)

            @tf.custom_gradient
            def exchange(x: Any) -> Any:
                received, received_splits = self._hvd.alltoall(x, splits=splits, name=op)

                def gradient(d_received: Any, _d_splits: Any = None) -> Any:
                    back = None if op is None else f"{op}_gradient"
                    return self._hvd.alltoall(d_received, splits=received_splits, name=back)[0]

                return (received, received_splits), gradient

            return exchange(values)

        return self._run("all-to-all", name, collective)

    def allreduce_sum(self, tensor: Any, name: str | None = None) -> Any:
        return self._run("allreduce", name, lambda op: self._hvd.allreduce(tensor, op=self._hvd.Sum, name=op))

    def broadcast(self, tensor: Any, root: int, name: str | None = None) -> Any:
        return self._run("broadcast", name, lambda op: self._hvd.broadcast(tensor, root, name=op))


_tool: CommunicationTool | None = None


def init(comm_tool: str = "horovod", use_legacy_optimizer: bool = True) -> None:
    """Choose how SOK's processes communicate; once per process.

    Args:
        comm_tool: ``"horovod"`` (initialises Horovod if needed; where Horovod is not installed and
            no launcher started several processes, one process, as on a single GPU) or ``"single"``
            (one process); any other value is warned about and replaced (:func:`set_comm_tool`), as
            the original goes on.
        use_legacy_optimizer: as NVIDIA SOK, under Keras 2 (tf_keras, ``TF_USE_LEGACY_KERAS=1``)
            ``tf.keras.optimizers`` and ``tf.optimizers`` become their ``legacy`` modules, whose
            optimizers are not bound to the first variables they update (scripts written for SOK
            reuse one optimizer for SOK tables and for a TensorFlow reference). Pass False to keep
            the new optimizers. Under Keras 3 nothing changes (it has no such module).

    Under a CUDA TensorFlow it also turns on memory growth on every GPU
    (:func:`placement.share_gpu_memory`): SOK's GPU tables allocate beside TensorFlow. Where
    several ranks share a host that has several GPUs and TensorFlow still sees all of them, each
    rank is pinned to its own (``local_rank``'s, :func:`placement.pin_local_gpu`), with a log line:
    its tables and ops then run there, and it opens no context on another rank's GPU.

    Example::

        hvd.init()
        sok.init()
    """
    set_comm_tool(comm_tool)
    from sparse_operation_kit import placement

    assert _tool is not None
    placement.pin_local_gpu(_tool.local_rank(), _tool.local_size())
    placement.share_gpu_memory()
    if use_legacy_optimizer:
        _use_legacy_keras_optimizers()


def _use_legacy_keras_optimizers() -> None:
    """Under Keras 2, point ``tf.keras.optimizers`` / ``tf.optimizers`` at their legacy modules."""
    import tensorflow as tf

    legacy = getattr(tf.keras.optimizers, "legacy", None)
    if legacy is None or getattr(getattr(legacy, "Optimizer", None), "__name__", "") != "OptimizerV2":
        return  # Keras 3, or already switched
    tf.keras.optimizers = legacy
    tf.optimizers = tf.optimizers.legacy
    logger.info(
        "sok.init: tf.keras.optimizers is now tf.keras.optimizers.legacy (Keras 2, as NVIDIA SOK does; "
        "sok.init(use_legacy_optimizer=False) keeps the new optimizers)"
    )


def set_comm_tool(comm_tool: str = "horovod") -> None:
    """Install the communication tool; once per process (``sok.init`` calls it).

    An unknown ``comm_tool`` is not an error (NVIDIA SOK goes on): it is warned about, naming the
    valid ones, and Horovod is used when it is initialised, else a single process.
    """
    global _tool
    if _tool is not None:
        raise RuntimeError(
            f"sok.init() was already called (communication tool {_tool.name!r}); call it once per process"
        )
    if comm_tool not in COMM_TOOLS:
        fallback = "horovod" if _horovod_initialized() else "single"
        logger.warning(
            "comm_tool %r is not supported (valid: %s); using %r", comm_tool, ", ".join(COMM_TOOLS), fallback
        )
        comm_tool = fallback
    if comm_tool == "horovod" and not _horovod_installed():
        launched = _launcher_world_size()
        if launched > 1:
            raise ImportError(
                f"this process is one of {launched} started by a launcher (its environment says so) but Horovod is "
                f"not installed, so SOK cannot reach the others: install Horovod built with TensorFlow support "
                f"(see the README; ci/setup.sh builds it)"
            )
        logger.info("Horovod is not installed: SOK runs as one process (comm_tool='single')")
        comm_tool = "single"
    _tool = HorovodTool() if comm_tool == "horovod" else SingleProcess()
    logger.info("SOK initialized: communication tool %s, rank %d of %d", _tool.name, _tool.rank(), _tool.num_ranks())
    if _tool.num_ranks() > 1 and stall_shutdown_seconds() is None:
        logger.warning(
            "%d ranks run without a bound on how long a collective waits for a rank that never joins it: set "
            "%s (e.g. 600; above %s, default %d) in the environment of every rank before hvd.init(), so that "
            "a rank that skips or fails a SOK call ends the job with an error instead of a hang (got %s=%r, %s=%r)",
            _tool.num_ranks(),
            STALL_SHUTDOWN_SETTING,
            STALL_CHECK_SETTING,
            _STALL_CHECK_DEFAULT_S,
            STALL_SHUTDOWN_SETTING,
            os.environ.get(STALL_SHUTDOWN_SETTING),
            STALL_CHECK_SETTING,
            os.environ.get(STALL_CHECK_SETTING),
        )


def _horovod_installed() -> bool:
    return importlib.util.find_spec("horovod") is not None


#: Environment variables in which launchers (horovodrun, mpirun, srun) give the number of processes.
_WORLD_SIZE_SETTINGS = ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "WORLD_SIZE")


def _launcher_world_size() -> int:
    """The largest process count a launcher put in the environment (1 when none did)."""
    sizes = [os.environ.get(name, "") for name in _WORLD_SIZE_SETTINGS]
    return max([int(size) for size in sizes if size.isdigit()], default=1)


def _horovod_initialized() -> bool:
    try:
        import horovod.tensorflow as hvd
    except ImportError:
        return False
    return hvd.is_initialized()


def tool() -> CommunicationTool:
    """The communication tool of this process (a single process when sok.init was not called)."""
    if _tool is not None:
        return _tool
    if _horovod_initialized():
        import horovod.tensorflow as hvd

        if hvd.size() > 1:
            raise RuntimeError(
                f"Horovod runs {hvd.size()} processes but sok.init() was not called; call sok.init() after "
                f"hvd.init() on every rank"
            )
    return SingleProcess()


def rank() -> int:
    """This process's rank."""
    return tool().rank()


def num_ranks() -> int:
    """The number of processes."""
    return tool().num_ranks()
