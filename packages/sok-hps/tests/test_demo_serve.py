"""Serving sok-core's demo through HPS (``demo_serve``, which ``sok demo --part serve`` runs through
this package's plugin of the ``sok`` command): a small DLRM trained with static and dynamic tables,
then served in a fresh process, equals the trained model's eval predictions, computed without TF32
as training computes them; the ``ps_config`` names the checkpoint's tables."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from hierarchical_parameter_server import demo_serve  # noqa: E402
from sparse_operation_kit.demo.train import CONFIG_FILE, DemoConfig, train  # noqa: E402
from sparse_operation_kit.plugins.commands import plugin_manager  # noqa: E402

SMALL = {"steps": 30, "epochs": 2, "batch_size": 256, "eval_batches": 2, "dim": 4, "max_rows": 2048}

#: Serves a demo run (argv[1]) in a fresh process with a spy on ``DenseTower.call`` and prints whether
#: TF32 was on at its calls.
SPY_SERVE = """
import sys
import tensorflow as tf
from sparse_operation_kit.demo import dlrm
from hierarchical_parameter_server import demo_serve
seen, call = set(), dlrm.DenseTower.call
def spy(self, inputs):
    seen.add(tf.config.experimental.tensor_float_32_execution_enabled())
    return call(self, inputs)
dlrm.DenseTower.call = spy
demo_serve.serve(sys.argv[1])
print("TF32 at tower calls:", sorted(seen))
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    output = str(tmp_path_factory.mktemp("demo"))
    config = DemoConfig(**SMALL, dynamic_rows=512, var_types=["hbm", "hybrid"])
    train(config, output)
    return output, config


def test_the_sok_command_serves_the_demo_through_this_package():
    server = plugin_manager().hook.sok_demo_server()
    assert server is not None and server.__module__ == "hierarchical_parameter_server.sok_commands"


def test_serving_through_hps_equals_the_trained_model(trained):
    output, _ = trained
    # A fresh process, as the demo serves (hps.Init is once per process).
    done = subprocess.run(
        [sys.executable, "-m", "hierarchical_parameter_server.demo_serve", output],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    match = re.search(r"AUC (\S+) \(trained model (\S+)\), largest difference of a prediction (\S+)", done.stdout)
    assert match, done.stdout
    served, trained_auc, difference = (float(x) for x in match.groups())
    record = json.loads(Path(output, CONFIG_FILE).read_text(encoding="utf-8"))
    assert trained_auc == pytest.approx(record["results"]["eval_auc"][-1], abs=1e-6)
    assert abs(served - trained_auc) <= demo_serve.AUC_TOLERANCE
    assert difference <= demo_serve.AUC_TOLERANCE


def test_serving_computes_the_tower_without_tf32(trained):
    output, _ = trained
    done = subprocess.run([sys.executable, "-c", SPY_SERVE, output], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "TF32 at tower calls: [False]" in done.stdout, done.stdout[-3000:]


def test_ps_config_names_the_checkpoint_tables(trained):
    output, config = trained
    with open(os.path.join(output, CONFIG_FILE), encoding="utf-8") as f:
        record = json.load(f)
    model = demo_serve.ps_config(output, record, config.batch_size)["models"][0]
    assert [os.path.basename(p) for p in model["sparse_files"]] == record["table_names"]
    for path in model["sparse_files"]:
        assert os.path.exists(path + "-key") and os.path.exists(path + "-weight")
    assert model["embedding_vecsize_per_table"] == [config.dim] * 26


#: Loads the exported demo (argv[1]) in a fresh process and writes its predictions of the eval
#: batches (argv[2]: an .npz of dense_i, ids_i) to argv[3].
PREDICT_SAVED = """
import sys
import numpy as np
import tensorflow as tf
import hierarchical_parameter_server  # noqa: F401  (the layers' ops and functions)
loaded = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
batches = np.load(sys.argv[2])
out = [next(iter(loaded(dense=tf.constant(batches[f"dense_{i}"]), ids=tf.constant(batches[f"ids_{i}"])).values()))
       for i in range(len(batches.files) // 2)]
np.save(sys.argv[3], np.concatenate([o.numpy() for o in out]))
"""


def test_the_exported_demo_serves_its_eval_set_from_cpp_as_from_python(trained, tmp_path):
    """``demo_serve OUTPUT --export DIR`` saves the served model (HPS's lookups traced on the running
    server, the tower); sok-core's C++ program serves the eval set through it with no Python in the
    process: its predictions equal the exported model's in a Python process bit for bit, and the
    trained model's within the demo's tolerance. TF32 is off in both (NVIDIA_TF32_OVERRIDE), as the
    demo computes its predictions without it."""
    from hierarchical_parameter_server import graph_calls
    from sparse_operation_kit.demo.train import PREDICTIONS_FILE
    from sparse_operation_kit.testing import serving_cpp

    output, config = trained
    saved = tmp_path / "served"
    module = "hierarchical_parameter_server.demo_serve"
    done = subprocess.run([sys.executable, "-m", module, output, "--export", str(saved)], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    batches = [(dense.numpy(), ids.numpy()) for dense, ids, _ in config.eval_dataset()]
    arrays = {f"{name}_{i}": a for i, batch in enumerate(batches) for name, a in zip(("dense", "ids"), batch)}
    np.savez(tmp_path / "eval.npz", **arrays)
    no_tf32 = {"NVIDIA_TF32_OVERRIDE": "0"}
    env = {**os.environ, **no_tf32}
    predict = [sys.executable, "-c", PREDICT_SAVED, str(saved), str(tmp_path / "eval.npz"), str(tmp_path / "py.npy")]
    done = subprocess.run(predict, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    in_python = np.load(tmp_path / "py.npy")

    program, why_not = serving_cpp.build(tmp_path)
    if program is None:
        pytest.skip(why_not)
    libraries = [*graph_calls.serving_libraries()]
    in_cpp = []
    for dense, ids in batches:
        done = serving_cpp.serve(program, saved, {"dense": dense, "ids": ids}, tmp_path, libraries, env=no_tf32)
        assert done.returncode == 0, done.stdout + done.stderr[-3000:]
        assert "libpython: absent" in done.stdout
        in_cpp.append(np.fromfile(tmp_path / "out.bin", np.float32).reshape(len(ids), 1))
    np.testing.assert_array_equal(np.concatenate(in_cpp), in_python)  # bit for bit
    trained_predictions = np.load(os.path.join(output, PREDICTIONS_FILE))
    assert np.max(np.abs(in_python[:, 0] - trained_predictions)) <= demo_serve.AUC_TOLERANCE
