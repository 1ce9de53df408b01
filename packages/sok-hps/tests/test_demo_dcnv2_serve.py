"""Serving the demo's DLRM-DCNv2 through HPS (``sok demo --model dcnv2``, ``demo_serve``): a small
multi-hot run (MLPerf's hotness, static and dynamic tables) served in a fresh process equals the
trained model's final eval predictions; ``--part all`` is the default for both models; a run whose
``demo.json`` does not name a valid model, or whose dense weights do not fit it, is refused."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from hierarchical_parameter_server import demo_serve as serve_module  # noqa: E402
from sparse_operation_kit.cli import _demo_part, build_parser, main  # noqa: E402
from sparse_operation_kit.demo.criteo import MLPERF_HOTNESS  # noqa: E402
from sparse_operation_kit.demo.dcnv2 import DCNv2Tower  # noqa: E402
from sparse_operation_kit.demo.train import CONFIG_FILE, DENSE_FILE, DemoConfig, train  # noqa: E402

#: A small DCNv2 whose tables are capped at 1024 rows: those of at least 256 rows dynamic (hbm and
#: hybrid in turn), the others static.
SMALL = {
    "model": "dcnv2",
    "steps": 8,
    "epochs": 1,
    "batch_size": 128,
    "eval_batches": 2,
    "dim": 4,
    "max_rows": 1024,
    "dynamic_rows": 256,
    "var_types": ["hbm", "hybrid"],
    "bottom": [8],
    "top": [16],
    "cross_layers": 2,
    "low_rank": 4,
}
#: What the served line says (demo_serve.serve prints it).
SERVED = re.compile(r"AUC (\S+) \(trained model (\S+)\), largest difference of a prediction (\S+)")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    output = tmp_path_factory.mktemp("dcnv2")
    train(DemoConfig(**SMALL), str(output))
    return output


def record_of(output: Path) -> dict:
    return json.loads((output / CONFIG_FILE).read_text(encoding="utf-8"))


def test_the_run_has_static_and_dynamic_tables_and_multi_hot_bags(trained):
    record = record_of(trained)
    assert record["config"]["model"] == "dcnv2" and record["config"]["hotness"] == list(MLPERF_HOTNESS)
    assert {"static", "hbm", "hybrid"} <= set(record["table_kinds"])


def test_ps_config_asks_for_a_bag_of_hotness_keys_per_table(trained):
    record = record_of(trained)
    model = serve_module.ps_config(str(trained), record, SMALL["batch_size"])["models"][0]
    assert model["maxnum_catfeature_query_per_table_per_sample"] == list(MLPERF_HOTNESS)
    assert [Path(p).name for p in model["sparse_files"]] == record["table_names"]


def test_serving_through_hps_equals_the_trained_model(trained):
    # A fresh process, as the demo serves (hps.Init is once per process).
    done = subprocess.run(
        [sys.executable, "-m", "hierarchical_parameter_server.demo_serve", str(trained)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "DLRM-DCNv2 on multi-hot Criteo-shaped data (214 ids per sample)" in done.stdout
    match = SERVED.search(done.stdout)
    assert match, done.stdout
    served, trained_auc, difference = (float(x) for x in match.groups())
    assert trained_auc == pytest.approx(record_of(trained)["results"]["eval_auc"][-1], abs=1e-6)
    assert abs(served - trained_auc) <= serve_module.AUC_TOLERANCE
    assert difference <= serve_module.AUC_TOLERANCE


def test_cli_serves_the_model_its_output_was_trained_with(trained):
    # No --model: the default (dlrm) is not what --part serve serves; demo.json says dcnv2.
    command = [sys.executable, "-m", "sparse_operation_kit.cli", "demo", "--part", "serve", "--output", str(trained)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "DLRM-DCNv2" in done.stdout and "serving check passed" in done.stdout


@pytest.mark.parametrize("model", ["dlrm", "dcnv2"])
def test_cli_runs_all_parts_by_default_for_both_models(model):
    assert _demo_part(build_parser().parse_args(["demo", "--model", model])) == "all"
    assert _demo_part(build_parser().parse_args(["demo", "--model", model, "--part", "serve"])) == "serve"


# -- bad input ----------------------------------------------------------------------------------
def copy_with_record(trained: Path, tmp_path: Path, change) -> Path:
    """A copy of the run's demo.json (alone) in tmp_path, changed by ``change(record)``."""
    record = record_of(trained)
    change(record)
    (tmp_path / CONFIG_FILE).write_text(json.dumps(record), encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize(
    ("change", "shown"),
    [
        (lambda r: r["config"].update(model="dcn"), "'dcn'"),
        (lambda r: r["config"].pop("model"), "None"),
        (lambda r: r.pop("config"), "None"),
    ],
    ids=["unknown", "missing", "no-config"],
)
def test_a_record_without_a_valid_model_is_refused(trained, tmp_path, change, shown):
    output = copy_with_record(trained, tmp_path, change)
    message = rf"names no model the demo serves: config\.model is {shown}; valid: 'dlrm', 'dcnv2'"
    with pytest.raises(ValueError, match=message):
        serve_module.read_record(str(output))


def test_a_dcnv2_record_with_a_bad_hotness_is_refused(trained, tmp_path):
    output = copy_with_record(trained, tmp_path, lambda r: r["config"].update(hotness=[1] * 25))
    with pytest.raises(ValueError, match=r"config\.hotness of the dcnv2 run is not valid: hotness .* 26 integers"):
        serve_module.read_record(str(output))


def test_a_missing_or_unreadable_record_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not the --output of a demo run; train first"):
        serve_module.read_record(str(tmp_path))
    (tmp_path / CONFIG_FILE).write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match="is not valid JSON"):
        serve_module.read_record(str(tmp_path))


def test_serve_and_the_cli_refuse_a_corrupted_model_before_hps_starts(trained, tmp_path, capsys):
    from hierarchical_parameter_server import init as hps_init

    output = copy_with_record(trained, tmp_path, lambda r: r["config"].update(model="dcn"))
    assert serve_module.main([str(output)]) == 2
    assert "config.model is 'dcn'" in capsys.readouterr().err
    assert main(["demo", "--part", "serve", "--output", str(output)]) == 2
    assert "sok demo: ValueError:" in capsys.readouterr().err
    assert not hps_init.is_initialized()  # refused before hps.Init
    assert not (output / serve_module.PS_CONFIG_FILE).exists()


def test_dense_weights_that_do_not_fit_the_tower_are_refused(trained, tmp_path):
    tower = DCNv2Tower(SMALL["dim"], SMALL["bottom"], SMALL["top"], SMALL["cross_layers"], SMALL["low_rank"])
    tower.build_for()
    with np.load(trained / DENSE_FILE) as weights:
        arrays = [weights[f"arr_{i}"] for i in range(len(weights.files))]
    shutil.copy(trained / DENSE_FILE, tmp_path / "fits.npz")
    serve_module._load_weights(tower, str(tmp_path / "fits.npz"), "dcnv2")
    np.testing.assert_array_equal(tower.weights[0].numpy(), arrays[0])
    np.savez(tmp_path / "short.npz", *arrays[:-1])
    with pytest.raises(ValueError, match=r"holds \d+ arrays, the dcnv2 tower of its demo.json has \d+ weights"):
        serve_module._load_weights(tower, str(tmp_path / "short.npz"), "dcnv2")
    np.savez(tmp_path / "shape.npz", *([arrays[0][:, :1]] + arrays[1:]))
    with pytest.raises(ValueError, match=r"array arr_0 has shape \(13, 1\), the dcnv2 tower's weight"):
        serve_module._load_weights(tower, str(tmp_path / "shape.npz"), "dcnv2")
