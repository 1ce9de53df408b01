"""Which collectives the lookup's exchange uses (``SOK_EXCHANGE``; ``lookup/exchange.py``), on a CPU
TensorFlow: Horovod's for ``auto`` and ``horovod``; ``nccl`` and unknown values are refused with
the reason and the valid values. The NCCL collectives themselves run on GPU ranks only
(test_nccl_exchange_multiprocess.py)."""

from __future__ import annotations

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
