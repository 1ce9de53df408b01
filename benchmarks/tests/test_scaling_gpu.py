"""scaling_gpu.py on CPU: a --quick run in one process and its --summarize table, the table's
E(n) and ratios from given results, and the exchange counter's bytes on a stand-in tool."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scaling_gpu

SCRIPT = Path(scaling_gpu.__file__)


def test_quick_run_writes_a_row_per_configuration_and_summarizes_them(tmp_path: Path) -> None:
    out = tmp_path / "quick.json"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--kinds", "static,dynamic", "--json", str(out)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    printed = [line.split() for line in done.stdout.splitlines() if line.startswith(("static", "dynamic"))]
    assert [row[:5] for row in printed] == [["static", "8", "2", "gpu", "1"], ["dynamic", "8", "2", "gpu", "1"]]
    data = json.loads(out.read_text())
    assert (data["tool"], data["np"]) == ("sok", 1)
    assert [(r["kind"], r["dim"], r["hotness"], r["batch"]) for r in data["rows"]] == [
        ("static", 8, "2", 512),
        ("dynamic", 8, "2", 512),
    ]
    assert all(r["ms"] > 0 and r["samples_per_s"] == pytest.approx(512e3 / r["ms"]) for r in data["rows"])
    table = scaling_gpu.summarize([str(out)]).splitlines()
    assert table[0].startswith("| config | np | SOK ms | TorchRec ms |")
    assert [line.split("|")[1].strip() for line in table[2:]] == [
        "dynamic dim 8 hot 2 ids gpu",
        "static dim 8 hot 2 ids gpu",
    ]


def row(tool: str, kind: str, n: int, ms: float, **extra: object) -> dict:
    base = {"tool": tool, "kind": kind, "dim": 32, "hotness": "2", "ids": "gpu", "np": n, "batch": 1000,
            "cap": 64, "tables": "criteo", "ms": ms, "samples_per_s": n * 1000 / (ms / 1e3)}  # fmt: skip
    return base | extra


def test_summary_gives_efficiency_ratio_to_the_fastest_torchrec_and_the_nearest_a2a(tmp_path: Path) -> None:
    sok = {1: row("sok", "static", 1, 2.0, sent_bytes_max=0, alltoall_bytes_max=0),
           2: row("sok", "static", 2, 4.0, sent_bytes_max=3 * 2**20, alltoall_bytes_max=2**20)}  # fmt: skip
    rec = {1: [row("torchrec", "tw", 1, 1.0), row("torchrec", "rw", 1, 1.5)],
           2: [row("torchrec", "tw", 2, 2.5), row("torchrec", "rw", 2, 1.6)]}  # fmt: skip
    paths = []
    for n in (1, 2):
        for tool, rows, extra in (("sok", [sok[n]], {}), ("torchrec", rec[n], {"a2a": []})):
            if tool == "torchrec" and n == 2:
                extra = {"a2a": [{"bytes": 2**20 + 64, "busbw_GBps": 42.0}, {"bytes": 2**27, "busbw_GBps": 240.0}]}
            if tool == "sok" and n == 2:
                extra = {"exchange_a2a": [{"bytes": 2**20, "busbw_GBps": 21.0}, {"bytes": 2**27, "busbw_GBps": 200.0}]}
            path = tmp_path / f"{tool}_{n}.json"
            path.write_text(json.dumps({"tool": tool, "np": n, "rows": rows} | extra))
            paths.append(str(path))
    lines = scaling_gpu.summarize(paths).splitlines()[2:]
    cells = [[c.strip() for c in line.split("|")[1:-1]] for line in lines]
    # np 1: SOK 2.0 ms vs TorchRec tw 1.0 ms; np 2: SOK 4.0 ms (E = 0.5) vs rw 1.6 ms (E(2) of rw = 1.5 / 1.6).
    config = "static dim 32 hot 2 ids gpu"
    # SOK's exchange alone at the nearest size (1 MiB): 21 GB/s, half of Torch's 42 there.
    assert cells[0] == [config, "1", "2.00", "1.00 (tw)", "0.50x", "1.00", "1.00", "0.0 MiB", "-", "-"]
    want = [config, "2", "4.00", "1.60 (rw)", "0.40x", "0.50", "0.94", "3.0 MiB", "42 (at 1.0 MiB)"]
    assert cells[1] == [*want, "21 (at 1.0 MiB, 0.50x)"]


def _stand_in() -> object:
    """Rank 0 of two whose collectives are identities (SOK's one-process tool, told two ranks)."""
    from sparse_operation_kit import communication

    class StandIn(communication.SingleProcess):
        def num_ranks(self) -> int:
            return 2

    return StandIn()


def test_counter_adds_input_bytes_and_what_leaves_the_rank_inside_a_tf_function() -> None:
    import tensorflow as tf

    tool = _stand_in()
    counter = scaling_gpu.ExchangeCounter(tool)

    def step(x: tf.Tensor) -> tf.Tensor:
        gathered = tool.allgather(x)  # 12 float32: 48 bytes in, sent to the other rank
        exchanged, _ = tool.alltoall(tf.reshape(gathered, [4, 3]), splits=tf.constant([1, 3]))  # own row 12 bytes
        return tool.allreduce_sum(tf.cast(exchanged, tf.float64))  # 96 bytes, ring: 96 x 2 x 1 / 2 sent

    with counter.counting():
        traced = tf.function(step)
        traced(tf.zeros([12]))
    assert "allgather" not in vars(tool)
    assert counter.read() == {
        "allgather_bytes": 48, "alltoall_bytes": 48, "allreduce_sum_bytes": 96,
        "allgather_calls": 1, "alltoall_calls": 1, "allreduce_sum_calls": 1,
        "sent_bytes": 48 + 36 + 96,
    }  # fmt: skip
    traced(tf.zeros([12]))  # the wrappers are in the graph: a second run counts again
    assert counter.read()["sent_bytes"] == 2 * (48 + 36 + 96)


def test_exchange_bandwidth_times_the_lookups_all_to_all_at_each_size(monkeypatch) -> None:
    from sparse_operation_kit import communication

    monkeypatch.setattr(communication, "_tool", _stand_in())
    monkeypatch.setenv("SOK_EXCHANGE", "horovod")  # the stand-in's identity collectives
    points = scaling_gpu.exchange_bandwidth(scaling_gpu.Ranks(), [2**12, 2**16, 2**12], repeat=1, calls=3)
    # One point per distinct size, rows of 64 floats, an equal share per rank (2 ranks).
    assert [p["bytes"] for p in points] == [2**12, 2**16]
    assert all(p["ms"] > 0 and p["busbw_GBps"] > 0 and p["exchange"] == "horovod" for p in points)


def test_summary_sets_one_process_against_np_1_under_horovodrun(tmp_path: Path) -> None:
    launched = row("sok", "static", 1, 2.2, sent_bytes_max=0, alltoall_bytes_max=0, launcher="horovodrun")
    alone = row("sok", "static", 1, 2.0, sent_bytes_max=0, alltoall_bytes_max=0, launcher="process")
    paths = []
    for name, rows in (("np1", [launched]), ("process", [alone])):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"tool": "sok", "np": 1, "rows": rows}))
        paths.append(str(path))
    lines = scaling_gpu.summarize(paths).splitlines()
    assert len([line for line in lines if line.startswith("| static")]) == 1  # the table: np 1 under horovodrun
    assert lines[-1] == "static dim 32 hot 2 ids gpu: np 1 under horovodrun 2.20 ms, one process 2.00 ms (1.10x)"


@pytest.mark.parametrize("hotness", ["2", "multi"])
def test_pool_ids_are_the_batch_that_the_arguments_give(hotness: str) -> None:
    import tensorflow as tf

    args = scaling_gpu.parse_args(["--quick", "--hotness", hotness])
    rows = scaling_gpu.table_rows(args.tables, args.cap)
    pool = scaling_gpu.make_pool(args, rows, hotness, rank=0)

    def body(ids: list) -> tf.Tensor:  # every id and row split, in order, as one vector
        return tf.concat([tf.concat([r.values, r.row_splits], 0) for r in ids], 0)

    given = scaling_gpu.step_caller(body, pool, "gpu", args.batch)
    sliced = scaling_gpu.step_caller(body, pool, "pool", args.batch)
    for i in range(scaling_gpu.POOL + 1):
        np.testing.assert_array_equal(sliced(i).numpy(), given(i).numpy())
