"""The demo's job on a small model: train -> sok.dump -> (HPS serving), one process.

The checkpoint is read back through ``checkpoint.format`` and compared with the trained tables
(static tables: keys are the row ids; dynamic tables: the keys training fed them, ``dynamic_keys``
of the ids). The serving steps run where a plugin of the ``sok`` command serves the demo (sok-hps:
its own tests check what it serves)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from sparse_operation_kit.checkpoint import format as fmt  # noqa: E402
from sparse_operation_kit.demo.dlrm import DenseTower, dynamic_keys, float32_matmuls, table_plan  # noqa: E402
from sparse_operation_kit.demo.train import CHECKPOINT_DIR, CONFIG_FILE, DemoConfig, train  # noqa: E402
from sparse_operation_kit.plugins.commands import MISSING, plugin_manager  # noqa: E402

#: Whether a plugin of the ``sok`` command serves the demo (sok-hps installed).
SERVES = plugin_manager().hook.sok_demo_server() is not None
SMALL = {"steps": 30, "epochs": 2, "batch_size": 256, "eval_batches": 2, "dim": 4, "max_rows": 2048}


@pytest.fixture(scope="module")
def tf32_in_training():
    """Whether TF32 was on before training, at each call of the tower during it, and after it."""
    record = {"before": tf.config.experimental.tensor_float_32_execution_enabled(), "calls": set()}
    call = DenseTower.call

    def spy(self, inputs):
        record["calls"].add(tf.config.experimental.tensor_float_32_execution_enabled())
        return call(self, inputs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DenseTower, "call", spy)
        yield record


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tf32_in_training):
    output = str(tmp_path_factory.mktemp("demo"))
    config = DemoConfig(**SMALL, dynamic_rows=512, var_types=["hbm", "hybrid"])
    results = train(config, output)
    tf32_in_training["after"] = tf.config.experimental.tensor_float_32_execution_enabled()
    return output, config, results


def test_training_computes_the_tower_without_tf32_and_restores_it(trained, tf32_in_training):
    # Traces and eager calls alike: the evaluation's predictions are what serving must reproduce.
    assert tf32_in_training["calls"] == {False}
    assert tf32_in_training["after"] == tf32_in_training["before"]


def test_float32_matmuls_restores_the_setting_on_error():
    before = tf.config.experimental.tensor_float_32_execution_enabled()
    try:
        for setting in (True, False):
            tf.config.experimental.enable_tensor_float_32_execution(setting)
            with pytest.raises(RuntimeError, match="inside"), float32_matmuls():
                assert not tf.config.experimental.tensor_float_32_execution_enabled()
                raise RuntimeError("inside")
            assert tf.config.experimental.tensor_float_32_execution_enabled() == setting
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(before)


def test_training_learns(trained):
    _, _, results = trained
    losses = np.asarray(results["loss"])
    assert losses[-10:].mean() < losses[:10].mean()
    assert len(results["eval_auc"]) == 2 and all(0.5 < a <= results["auc_ceiling"] for a in results["eval_auc"][1:])


def test_files_are_written(trained):
    output, config, _ = trained
    with open(os.path.join(output, CONFIG_FILE), encoding="utf-8") as f:
        record = json.load(f)
    assert record["table_kinds"] == table_plan(record["rows"], "mixed", ["hbm", "hybrid"], 512)
    assert {"static", "hbm", "hybrid"} <= set(record["table_kinds"])
    predictions = np.load(os.path.join(output, "eval_predictions.npy"))
    assert predictions.shape == (config.eval_batches * config.batch_size,)
    assert os.path.exists(os.path.join(output, "training.png"))


def test_checkpoint_keys_are_row_ids_or_dynamic_keys(trained):
    output, config, _ = trained
    with open(os.path.join(output, CONFIG_FILE), encoding="utf-8") as f:
        record = json.load(f)
    from sparse_operation_kit.demo.criteo import CriteoGenerator

    gen = CriteoGenerator(seed=config.seed, max_rows=config.max_rows)
    _, eval_ids, _ = gen.batch(0, config.batch_size, "eval")
    for i, (name, kind) in enumerate(zip(record["table_names"], record["table_kinds"])):
        keys = fmt.payload(fmt.read_header(os.path.join(output, CHECKPOINT_DIR, fmt.key_file(name))))
        if kind == "static":
            np.testing.assert_array_equal(np.sort(keys), np.arange(record["rows"][i]))
        else:  # every id the evaluation looked up is in the checkpoint, under its dynamic key
            assert np.isin(dynamic_keys(eval_ids[:, i]), keys).all(), name


def test_config_refuses_a_batch_that_does_not_split():
    with pytest.raises(ValueError, match="not a multiple of the 3 ranks"):
        DemoConfig(batch_size=100).check(3)


def test_cli_trains_and_serves_a_small_model(tmp_path, capsys):
    from sparse_operation_kit.cli import main

    output = str(tmp_path / "run")
    small = ["--steps", "6", "--epochs", "1", "--batch-size", "128", "--eval-batches", "1", "--max-rows", "512"]
    assert main(["demo", "--part", "train", "--output", output, "--dim", "4", *small]) == 0
    assert os.path.isdir(os.path.join(output, CHECKPOINT_DIR))
    assert "eval AUC" in capsys.readouterr().out
    command = [sys.executable, "-m", "sparse_operation_kit.cli", "demo", "--part", "serve", "--output", output]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    needs = MISSING["sok demo --part serve"]
    assert ("serving check passed" in done.stdout) if SERVES else (f"it needs {needs}" in done.stdout)


def test_cli_trains_on_criteo_tsv_files_and_serves_them(tmp_path, capsys):
    """Real-data mode: Criteo day files the test writes from the generator's samples."""
    from sparse_operation_kit.cli import main
    from sparse_operation_kit.demo.criteo import CriteoGenerator

    gen = CriteoGenerator(seed=5, max_rows=512)
    paths = {}
    for stream, count in (("train", 512), ("eval", 256)):
        counts, ids, labels = gen.batch(0, count, stream)
        lines = [
            "\t".join([str(int(y))] + [str(c) for c in row] + [f"{int(i):08x}" for i in cats])
            for y, row, cats in zip(labels, counts, ids)
        ]
        paths[stream] = tmp_path / f"day_{stream}"
        paths[stream].write_text("\n".join(lines) + "\n", encoding="ascii")
    output = str(tmp_path / "run")
    # 256 eval lines make 2 batches of 128: fewer than the 3 asked for, which is what the eval set then is.
    options = ["--steps", "8", "--epochs", "1", "--batch-size", "128", "--eval-batches", "3", "--max-rows", "512"]
    tsv = ["--train-tsv", str(paths["train"]), "--eval-tsv", str(paths["eval"])]
    assert main(["demo", "--part", "train", "--output", output, "--dim", "4", *options, *tsv]) == 0
    out = capsys.readouterr().out
    assert "no known AUC ceiling" in out and "epoch 1: eval AUC" in out
    record = json.loads(Path(output, CONFIG_FILE).read_text(encoding="utf-8"))
    assert record["results"]["auc_ceiling"] is None
    assert np.load(os.path.join(output, "eval_predictions.npy")).shape == (256,)
    command = [sys.executable, "-m", "sparse_operation_kit.cli", "demo", "--part", "serve", "--output", output]
    if SERVES:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "serving check passed" in done.stdout


@pytest.mark.multiprocess
def test_two_ranks_train_what_one_process_serves(tmp_path):
    """``make demo-np2`` in small: sok demo --part train under horovodrun -np 2 (on two GPUs where
    the multi-GPU suite runs: the exchange, the dense gradients and the loss on SOK's NCCL
    communicator), then the checkpoint of the two ranks served in a fresh process (HPS), equal to
    the trained model's predictions."""
    sys.path.insert(0, str(Path(__file__).parent / "distributed"))
    from harness import REPO, horovodrun, rank_environment

    runner = horovodrun()
    output = str(tmp_path / "np2")
    small = ["--steps", "12", "--epochs", "2", "--batch-size", "256", "--eval-batches", "2", "--max-rows", "1024"]
    command = [str(runner), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, "-m", "sparse_operation_kit.cli"]
    env = dict(rank_environment(ranks=2), TF_NUM_INTRAOP_THREADS="1", HOROVOD_STALL_SHUTDOWN_TIME_SECONDS="120")
    done = subprocess.run(
        [*command, "demo", "--part", "train", "--output", output, "--dim", "4", *small],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "over 2 rank(s)" in done.stdout
    record = json.loads(Path(output, CONFIG_FILE).read_text(encoding="utf-8"))
    assert record["ranks"] == 2
    if SERVES:
        served = subprocess.run(
            [sys.executable, "-m", "sparse_operation_kit.cli", "demo", "--part", "serve", "--output", output],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert served.returncode == 0, served.stdout[-3000:] + served.stderr[-3000:]
        assert "serving check passed" in served.stdout
