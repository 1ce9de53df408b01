"""sok.load's retries (a dump replaced the checkpoint while it was read) repeat no side effect: the
progress is counted once, and a table that a failed attempt filled and could not empty again stops
the load (no retry over it). Also the ranks' path agreement's encoding of undecodable paths."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
import sparse_operation_kit as sok  # noqa: E402
from sparse_operation_kit import agreement as agreement_module  # noqa: E402
from sparse_operation_kit.checkpoint import collective as ckpt  # noqa: E402
from sparse_operation_kit.checkpoint import format as fmt  # noqa: E402
from sparse_operation_kit.progress import Callback  # noqa: E402

DIM = 4
KEYS = np.arange(20, dtype=np.int64) * 3 + 1


def table(name: str, rows: bool) -> sok.DynamicVariable:
    var = sok.DynamicVariable(dimension=DIM, var_type="hbm", name=name, initializer="0")
    if rows:
        sok.assign(var, tf.constant(KEYS), np.repeat(KEYS[:, None], DIM, 1).astype(np.float32))
    return var


def checkpoint(tmp_path) -> str:
    path = str(tmp_path / "ckpt")
    sok.dump(path, [table("first", True), table("second", True)])
    return path


def changed_once_on_second(monkeypatch) -> list[str]:
    """The first read of table ``second`` raises CheckpointChanged (a dump replaced the checkpoint);
    returns the log of reads."""
    real, reads = ckpt._fill_while_reading, []

    def fill(var, *args):
        reads.append(var.name)
        if var.name.startswith("second") and reads.count(var.name) == 1:
            raise fmt.CheckpointChanged("replaced while it was read (injected)")
        return real(var, *args)

    monkeypatch.setattr(ckpt, "_fill_while_reading", fill)
    return reads


def test_a_retried_load_counts_the_progress_once(tmp_path, monkeypatch):
    path = checkpoint(tmp_path)
    reads = changed_once_on_second(monkeypatch)
    progress = Callback()
    sok.load(path, [table("first", False), table("second", False)], callback=progress)
    assert len(reads) == 4  # read twice
    assert progress.value == 4  # two steps per table: read and assign


def test_a_table_that_cannot_be_emptied_again_stops_the_load_without_retry(tmp_path, monkeypatch):
    path = checkpoint(tmp_path)
    reads = changed_once_on_second(monkeypatch)
    first = table("first", False)
    storage_type, real_clear = type(first.storage), type(first.storage).clear

    def clear(storage):
        if storage is first.storage:
            raise RuntimeError("the device is gone (injected)")
        return real_clear(storage)

    monkeypatch.setattr(storage_type, "clear", clear)
    with pytest.raises(ckpt.TableNotRestored, match=r"first.*the device is gone \(injected\)"):
        sok.load(path, [first, table("second", False)])
    assert len(reads) == 2  # no retry


def test_undecodable_paths_round_trip_through_the_agreement_encoding():
    path = "ck\udcff"
    data = agreement_module.encode(path)
    assert data == b"ck\xff"
    assert agreement_module.decode(data) == path


class TwoRanks:
    """A communication tool whose allgather shows two ranks passing the same values."""

    def rank(self) -> int:
        return 0

    def num_ranks(self) -> int:
        return 2

    def allgather(self, t):
        return tf.concat([t, t], 0)


def test_the_ranks_agree_on_an_undecodable_path():
    agreement = agreement_module.Agreement(TwoRanks(), "sok.load from ck")
    assert agreement.texts("ck\udcff") == ["ck\udcff", "ck\udcff"]
