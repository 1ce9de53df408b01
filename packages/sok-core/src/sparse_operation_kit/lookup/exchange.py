"""The collectives of a SOK step on several ranks: SOK's own NCCL ops on GPU ranks, Horovod's
elsewhere. ``sok.lookup_sparse``'s exchange and ``sok.allreduce_dense_gradients`` both go through
them, so that on GPU ranks one NCCL communicator, in one order, carries every collective of a step
(NCCL does not support two communicators used in different orders by the ranks: with Horovod's
NCCL for the dense gradients beside SOK's for the exchange, a step can hang).

Every size an exchange needs is known on the host before it starts (the counts of the ids travel in
the call's one allgather, the pooled rows' follow from the batch sizes), so the collectives take
their counts from the host:

- ``allgather(values)``: every rank's int64 vector, of one length on every rank, in rank order;
- ``alltoall(values, send_counts, recv_counts)``: rows ``send_counts[r]`` to rank ``r``, the
  ``recv_counts[r]`` rows of rank ``r`` back (int32 ``[n]`` each, in rows of ``values``); for
  floats, its gradient is the all-to-all back;
- ``allreduce_sum(values)``: the sum over the ranks of a tensor of one shape everywhere;
- ``allgather_rows(values)``: every rank's rows (their number may differ between ranks), in rank
  order.

Horovod negotiates each collective among the ranks on its background thread and waits on the host
for the collective's input; SOK's NCCL ops (``libsok_tf_nccl.so``) enqueue NCCL's kernels on
TensorFlow's compute stream instead, so the host never waits for the GPU. They need an order that
is the same on every rank: each one is chained to the previous one of its graph (a control
dependency), as the ranks build their graphs in the same order.

``SOK_EXCHANGE`` chooses, read at a process's first exchange: ``auto`` (the default: NCCL when
TensorFlow sees a GPU and sok-core was built with NCCL, else Horovod), ``nccl`` (an error where it
cannot run) or ``horovod``. The NCCL communicator is set up at that first exchange, on every rank
at once (rank 0's ``ncclUniqueId`` travels in a Horovod broadcast).

A rank that never joins an NCCL collective (it skipped a ``sok.lookup_sparse`` call the others
made) would leave the others waiting, and Horovod's stall inspector does not see SOK's own
collectives. With ``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS`` set (the setting that bounds Horovod's
own waits; ``sok.init()`` warns when it is not), a watchdog of the op library ends every rank whose
collective has not completed within it, with an error naming the collective.

Example::

    exchange = of(communication.tool())
    gathered = exchange.allgather(record, name="sok.lookup_sparse: allgather of ...")
    rows = exchange.alltoall(send, send_counts, recv_counts, name="sok.lookup_sparse: all-to-all of ...")
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from sparse_operation_kit import communication, tf_ops
from sparse_operation_kit.lookup.asserts import raise_unless

__all__ = [
    "EXCHANGES",
    "IDS_SETTING",
    "ID_EXCHANGES",
    "INT32_MAX",
    "SETTING",
    "Exchange",
    "HorovodExchange",
    "NcclExchange",
    "ids_to_holders",
    "int32_counts",
    "of",
]

logger = logging.getLogger(__name__)

#: The environment variable that chooses the exchange's collectives, and its values.
SETTING = "SOK_EXCHANGE"
EXCHANGES = ("auto", "nccl", "horovod")


#: The environment variable that chooses how the ids of a call travel, and its values: ``holders``
#: sends each table's ids whole to every rank that holds rows of it, sized by the tensors' shapes
#: (``holder_dist``), where ops pool all the call's tables (no low-frequency filter); ``routed``
#: sends each id to its owner alone, sized by counts read from the device (``input_dist``);
#: ``auto`` (the default) takes ``holders`` with Horovod's collectives and ``routed`` with SOK's
#: NCCL ones (the faster of the two in each, as measured: benchmarks/README.md). Every rank must
#: have the same value.
IDS_SETTING = "SOK_ID_EXCHANGE"
ID_EXCHANGES = ("auto", "holders", "routed")

#: The largest count the exchange's all-to-all takes: its counts (and Horovod's offsets) are int32.
INT32_MAX = 2**31 - 1


def int32_counts(counts: tf.Tensor, what: str) -> tf.Tensor:
    """``counts`` (int64 values per rank, on the host) as int32, once their sum is known to fit:
    a larger count would wrap around in Horovod's all-to-all, not fail (SOK's NCCL all-to-all takes
    int32 counts too). ``what`` names the data in the error."""
    total = tf.reduce_sum(counts)
    message = tf.strings.join(
        [
            f"sok.lookup_sparse: {what} are ",
            tf.strings.as_string(total),
            f" values in one all-to-all; the exchange's all-to-all takes at most {INT32_MAX} per rank and call "
            f"(its counts are int32). Use a smaller batch per rank, or split the tables over several calls",
        ]
    )
    check = raise_unless(total <= INT32_MAX, message)
    with tf.control_dependencies([] if check is None else [check]):
        return tf.cast(counts, tf.int32)


class Exchange:
    """The exchange's two collectives (see the module docstring); ``name`` names the SOK call."""

    name = "base"

    def allgather(self, values: tf.Tensor, name: str) -> tf.Tensor:
        raise NotImplementedError

    def alltoall(self, values: tf.Tensor, send_counts: tf.Tensor, recv_counts: tf.Tensor, name: str) -> tf.Tensor:
        raise NotImplementedError

    def allreduce_sum(self, values: tf.Tensor, name: str) -> tf.Tensor:
        raise NotImplementedError

    def allgather_rows(self, values: tf.Tensor, name: str) -> tf.Tensor:
        raise NotImplementedError


class HorovodExchange(Exchange):
    """Horovod's collectives, through the communication tool (CPU ranks, and GPU ranks without NCCL)."""

    name = "horovod"

    def __init__(self, comm: communication.CommunicationTool) -> None:
        self._comm = comm

    def allgather(self, values: tf.Tensor, name: str) -> tf.Tensor:
        return self._comm.allgather(values, name=name)

    def alltoall(self, values: tf.Tensor, send_counts: tf.Tensor, recv_counts: tf.Tensor, name: str) -> tf.Tensor:
        return self._comm.alltoall(values, send_counts, name=name)[0]

    def allreduce_sum(self, values: tf.Tensor, name: str) -> tf.Tensor:
        return self._comm.allreduce_sum(values, name=name)

    def allgather_rows(self, values: tf.Tensor, name: str) -> tf.Tensor:
        return self._comm.allgather(values, name=name)


class NcclExchange(Exchange):
    """SOK's NCCL ops on this rank's GPU (``/GPU:0``: ``sok.init`` pins each rank to its own),
    after the communicator is set up with the other ranks (a collective: every rank at once)."""

    name = "nccl"

    def __init__(self, comm: communication.CommunicationTool, ops: Any) -> None:
        self._ops = ops
        #: graph -> the name of its last collective op (a name: an op would keep its graph alive)
        self._last: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self._ranks = comm.num_ranks()
        bound = communication.stall_shutdown_seconds()
        with tf.init_scope():  # eagerly, also when the first exchange is traced in a tf.function
            with tf.device("/CPU:0"):
                unique = ops.sok_nccl_unique_id() if comm.rank() == 0 else tf.zeros([128], tf.uint8)
                unique = comm.broadcast(unique, 0, name="sok.lookup_sparse: broadcast of the NCCL id")
            with tf.device("/GPU:0"):
                ops.sok_nccl_init(unique, rank=comm.rank(), size=comm.num_ranks(), timeout_seconds=bound or 0)
        logger.info("SOK's exchange: NCCL on /GPU:0, rank %d of %d", comm.rank(), comm.num_ranks())

    def _in_order(self, make: Callable[[], tf.Tensor]) -> tf.Tensor:
        """``make()``, after the previous collective of the current graph: every rank then enqueues
        them on its stream in the order the graph was built, which is the same on every rank."""
        if tf.executing_eagerly():
            return make()
        graph = tf.compat.v1.get_default_graph()
        last = self._last.get(graph)
        with tf.control_dependencies([] if last is None else [graph.get_operation_by_name(last)]):
            out = make()
        self._last[graph] = out.op.name
        return out

    def allgather(self, values: tf.Tensor, name: str) -> tf.Tensor:
        with tf.device("/GPU:0"):
            return self._in_order(lambda: self._ops.sok_nccl_all_gather(values, name=communication.op_name(name)))

    def alltoall(self, values: tf.Tensor, send_counts: tf.Tensor, recv_counts: tf.Tensor, name: str) -> tf.Tensor:
        def move(x: tf.Tensor, send: tf.Tensor, recv: tf.Tensor, op: str) -> tf.Tensor:
            op = communication.op_name(op)
            with tf.device("/GPU:0"):
                return self._in_order(lambda: self._ops.sok_nccl_all_to_all(x, send, recv, name=op))

        values = tf.convert_to_tensor(values)
        if not values.dtype.is_floating:
            return move(values, send_counts, recv_counts, name)

        @tf.custom_gradient
        def exchange(x: tf.Tensor) -> Any:
            def gradient(d_received: tf.Tensor) -> tf.Tensor:
                return move(d_received, recv_counts, send_counts, f"{name}, gradient")

            return move(x, send_counts, recv_counts, name), gradient

        return exchange(values)

    def allreduce_sum(self, values: tf.Tensor, name: str) -> tf.Tensor:
        values = tf.convert_to_tensor(values)
        # int32 tensors of GPU ops live in host memory in TensorFlow: they travel as int64
        narrow = values.dtype in (tf.int32, tf.bool)
        with tf.device("/GPU:0"):
            wide = tf.cast(values, tf.int64) if narrow else values
            total = self._in_order(lambda: self._ops.sok_nccl_all_reduce(wide, name=communication.op_name(name)))
        return tf.cast(total, values.dtype) if narrow else total

    def allgather_rows(self, values: tf.Tensor, name: str) -> tf.Tensor:
        """Rows of every rank through the all-to-all: each rank's row count first (the allgather),
        then its rows to every rank."""
        values = tf.convert_to_tensor(values)
        n = self._ranks
        with tf.device("/GPU:0"):
            mine = tf.shape(values, out_type=tf.int64)[:1]
            counts = self.allgather(mine, name=f"{name}: row counts")
        with tf.device("/CPU:0"):
            received = int32_counts(counts, f"{name}: the rows gathered")
            sent = int32_counts(tf.fill([n], mine[0]), f"{name}: the rows sent")
        copies = tf.tile(values, [n] + [1] * (values.shape.rank - 1))
        return self.alltoall(copies, sent, received, name=name)


def ids_to_holders(pooled_by_ops: bool, exchange: Exchange) -> bool:
    """Whether a call's ids go to their tables' holders sized by shapes (``IDS_SETTING``, with the
    call's ``exchange``); ``pooled_by_ops``: every table of the call is pooled by one op per rank
    and device (the static ones by ``pooled_lookup``, the dynamic ones by ``pool_dynamic``) and
    nothing filters the dynamic ones' keys."""
    setting = os.environ.get(IDS_SETTING, "auto").strip().lower() or "auto"
    if setting not in ID_EXCHANGES:
        raise ValueError(
            f"{IDS_SETTING}={os.environ[IDS_SETTING]!r} is not a way to send ids; valid: {', '.join(ID_EXCHANGES)} "
            f"(holders: each table's ids to every rank that holds rows of it, sized by shapes; routed: each id to its "
            f"owner, sized by counts read from the device; auto: holders with Horovod's collectives, routed with "
            f"SOK's NCCL ones)"
        )
    if setting == "routed" or not pooled_by_ops:
        return False
    return setting == "holders" or exchange.name != NcclExchange.name


_chosen: tuple[communication.CommunicationTool, Exchange] | None = None


def of(comm: communication.CommunicationTool) -> Exchange:
    """The exchange of ``comm``'s ranks (several): chosen, and for NCCL set up, at the first call of
    the process (``SOK_EXCHANGE``, see the module docstring); the same exchange afterwards."""
    global _chosen
    if _chosen is not None and _chosen[0] is comm:
        return _chosen[1]
    setting = os.environ.get(SETTING, "auto").strip().lower() or "auto"
    if setting not in EXCHANGES:
        raise ValueError(
            f"{SETTING}={os.environ[SETTING]!r} is not an exchange; valid: {', '.join(EXCHANGES)} (auto: SOK's NCCL "
            f"collectives on GPU ranks where sok-core was built with NCCL, else Horovod's)"
        )
    chosen: Exchange
    if setting == "horovod":
        chosen = HorovodExchange(comm)
    else:
        ops, why_not = _nccl_ops()
        if ops is None and setting == "nccl":
            raise RuntimeError(f"{SETTING}=nccl, but SOK's NCCL collectives cannot run here: {why_not}")
        if ops is None:
            logger.info("SOK's exchange: Horovod's collectives (%s)", why_not)
            chosen = HorovodExchange(comm)
        else:
            chosen = NcclExchange(comm, ops)
    _chosen = (comm, chosen)
    return chosen


def _nccl_ops() -> tuple[Any | None, str]:
    """SOK's NCCL op library where it can run (and why not, else)."""
    ops = tf_ops.nccl_library()
    if ops is None:
        return None, (
            f"sok-core was built without {tf_ops.NCCL_LIBRARY} (no NCCL at build time, or a TensorFlow without "
            f"CUDA); set NCCL_HOME and rebuild sok-core for it"
        )
    with tf.init_scope():
        if not tf.config.list_logical_devices("GPU"):
            return None, "TensorFlow sees no GPU in this process"
    return ops, ""
