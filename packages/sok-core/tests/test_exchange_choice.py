"""Which collectives the lookup's exchange uses (``SOK_EXCHANGE``; ``lookup/exchange.py``), on a CPU
TensorFlow: Horovod's for ``auto`` and ``horovod``; ``nccl`` and unknown values are refused with
the reason and the valid values. The NCCL collectives themselves run on GPU ranks only
(test_nccl_exchange_multiprocess.py)."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from sparse_operation_kit import communication, tf_ops  # noqa: E402
from sparse_operation_kit.lookup import exchange as exchanges  # noqa: E402


class _TwoRanks(communication.SingleProcess):
    def num_ranks(self) -> int:
        return 2


@pytest.fixture(autouse=True)
def fresh_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exchanges, "_chosen", None)


@pytest.mark.parametrize("setting", [None, "auto", "horovod", " Horovod "])
def test_cpu_ranks_exchange_through_horovod(monkeypatch, setting):
    if setting is None:
        monkeypatch.delenv(exchanges.SETTING, raising=False)
    else:
        monkeypatch.setenv(exchanges.SETTING, setting)
    if setting != "horovod" and tf_ops.nccl_library() is not None and tf.config.list_logical_devices("GPU"):
        pytest.skip("a GPU TensorFlow with SOK's NCCL library chooses NCCL here")
    comm = _TwoRanks()
    chosen = exchanges.of(comm)
    assert isinstance(chosen, exchanges.HorovodExchange)
    assert exchanges.of(comm) is chosen  # chosen once per process


def test_the_choice_follows_a_new_communication_tool(monkeypatch):
    monkeypatch.setenv(exchanges.SETTING, "horovod")
    first = exchanges.of(_TwoRanks())
    assert exchanges.of(_TwoRanks()) is not first


def test_unknown_setting_is_refused_with_the_valid_values(monkeypatch):
    monkeypatch.setenv(exchanges.SETTING, "mpi")
    with pytest.raises(ValueError, match=r"SOK_EXCHANGE='mpi' is not an exchange; valid: auto, nccl, horovod"):
        exchanges.of(_TwoRanks())


def test_nccl_where_it_cannot_run_says_why(monkeypatch):
    if tf_ops.nccl_library() is not None and tf.config.list_logical_devices("GPU"):
        pytest.skip("NCCL can run here")
    monkeypatch.setenv(exchanges.SETTING, "nccl")
    with pytest.raises(RuntimeError, match=r"SOK_EXCHANGE=nccl, but SOK's NCCL collectives cannot run here: "):
        exchanges.of(_TwoRanks())


def test_horovod_exchange_passes_the_counts_to_the_communication_tool():
    class Recording(_TwoRanks):
        def __init__(self) -> None:
            self.calls: list[tuple] = []

        def alltoall(self, tensor, splits, name=None):
            self.calls.append(("alltoall", splits.numpy().tolist(), name))
            return tensor, splits

        def allgather(self, tensor, name=None):
            self.calls.append(("allgather", tensor.numpy().tolist(), name))
            return tf.concat([tensor, tensor], 0)

    comm = Recording()
    chosen = exchanges.HorovodExchange(comm)
    rows = chosen.alltoall(tf.ones([3, 2]), tf.constant([1, 2]), tf.constant([1, 2]), name="x: all-to-all")
    gathered = chosen.allgather(tf.constant([7], tf.int64), name="x: allgather")
    assert rows.shape == (3, 2) and gathered.numpy().tolist() == [7, 7]
    assert comm.calls == [("alltoall", [1, 2], "x: all-to-all"), ("allgather", [7], "x: allgather")]


class _FakeNcclOps:
    """Stands in for libsok_tf_nccl.so: records the set-up, exchanges as identities."""

    def __init__(self) -> None:
        self.init_kwargs: dict = {}

    def sok_nccl_unique_id(self):
        return tf.fill([128], 7)

    def sok_nccl_init(self, unique, **kwargs):
        self.init_kwargs = dict(kwargs, id=unique.numpy().tolist()[:2])

    def sok_nccl_all_to_all(self, x, send, recv, name=None):
        return tf.identity(x, name=name)

    def sok_nccl_all_gather(self, x, name=None):
        return tf.identity(x, name=name)

    def sok_nccl_all_reduce(self, x, name=None):
        return tf.identity(x, name=name)


def test_nccl_set_up_passes_rank_size_and_the_stall_bound(monkeypatch):
    monkeypatch.setenv(communication.STALL_SHUTDOWN_SETTING, "300")
    monkeypatch.setenv(communication.STALL_CHECK_SETTING, "60")
    ops = _FakeNcclOps()
    exchanges.NcclExchange(_TwoRanks(), ops)
    assert ops.init_kwargs == {"rank": 0, "size": 2, "timeout_seconds": 300, "id": [7, 7]}
    monkeypatch.delenv(communication.STALL_SHUTDOWN_SETTING)
    exchanges.NcclExchange(_TwoRanks(), ops)
    assert ops.init_kwargs["timeout_seconds"] == 0  # no bound: the watchdog stays off


def test_nccl_collectives_of_a_graph_are_chained_in_the_order_they_are_built():
    exchange = exchanges.NcclExchange(_TwoRanks(), _FakeNcclOps())
    counts = tf.constant([1, 1], tf.int32)

    @tf.function
    def step(x: tf.Tensor) -> tf.Tensor:
        first = exchange.alltoall(x, counts, counts, name="t: first")
        gathered = exchange.allgather(tf.constant([1], tf.int64), name="t: gather")
        second = exchange.alltoall(x * 2.0, counts, counts, name="t: second")
        return first + second + tf.cast(tf.reduce_sum(gathered), tf.float32)

    graph = step.get_concrete_function(tf.TensorSpec([2], tf.float32)).graph
    ops = {op.name: op for op in graph.get_operations()}
    first, gather, second = ops["t__first"], ops["t__gather"], ops["t__second"]
    assert first.control_inputs == []
    assert gather.control_inputs == [first]
    assert second.control_inputs == [gather]


def test_nccl_allreduce_joins_the_chain_and_int32_travels_as_int64():
    """The dense gradients' allreduce is one more link of the step's chain (one communicator, one
    order); int32 (kept in host memory by TensorFlow's GPU ops) goes through the op as int64."""
    exchange = exchanges.NcclExchange(_TwoRanks(), _FakeNcclOps())
    counts = tf.constant([1, 1], tf.int32)

    @tf.function
    def step(x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        moved = exchange.alltoall(x, counts, counts, name="t: all-to-all")
        total = exchange.allreduce_sum(moved, name="t: gradients")
        flags = exchange.allreduce_sum(tf.constant(3, tf.int32), name="t: flags")
        return total, flags

    concrete = step.get_concrete_function(tf.TensorSpec([2], tf.float32))
    ops = {op.name: op for op in concrete.graph.get_operations()}
    assert ops["t__gradients"].control_inputs == [ops["t__all-to-all"]]
    assert ops["t__flags"].control_inputs == [ops["t__gradients"]]
    assert ops["t__flags"].inputs[0].dtype == tf.int64
    total, flags = step(tf.constant([1.0, 2.0]))
    assert total.numpy().tolist() == [1.0, 2.0] and flags.dtype == tf.int32 and int(flags) == 3


def test_nccl_allgather_rows_sends_every_rank_its_rows_after_their_counts():
    """Rows whose number differs between ranks (a tf.IndexedSlices gradient): their counts first,
    then the rows to each of the two ranks (the fake all-to-all returns what it is given)."""
    exchange = exchanges.NcclExchange(_TwoRanks(), _FakeNcclOps())

    @tf.function
    def gather(x: tf.Tensor) -> tf.Tensor:
        return exchange.allgather_rows(x, name="t: rows")

    concrete = gather.get_concrete_function(tf.TensorSpec([None, 3], tf.float32))
    ops = {op.name: op for op in concrete.graph.get_operations()}
    assert ops["t__rows"].control_inputs == [ops["t__rows__row_counts"]]
    got = gather(tf.reshape(tf.range(6.0), [2, 3]))
    np.testing.assert_array_equal(got.numpy(), np.tile(np.arange(6.0).reshape(2, 3), [2, 1]))
