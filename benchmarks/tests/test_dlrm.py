"""dlrm.py: both models of the demo, SOK against Keras' Embedding, run end to end at a tiny size (the
figures' keys, AUCs, the precision, XLA and tables' optimizer it was asked for), and its refusal of --mlperf without
dcnv2."""

from __future__ import annotations

import json

import pytest

keras = pytest.importorskip("keras")
import dlrm  # noqa: E402

TINY = ["--steps", "4", "--warmup", "1", "--chunk", "2", "--batch-size", "64", "--dim", "4", "--max-rows", "256"]
TINY += ["--pool", "4", "--eval-batches", "2"]


@pytest.fixture
def policy_restored():
    before = keras.mixed_precision.global_policy()
    yield
    keras.mixed_precision.set_global_policy(before)


@pytest.mark.parametrize(
    ("model", "precision", "xla", "sparse"),
    [
        ("dlrm", "float32", False, "adagrad"),
        ("dcnv2", "mixed_bfloat16", True, "adagrad"),
        ("dlrm", "float32", False, "rowwise"),
    ],
)
def test_both_models_train_and_report(policy_restored, tmp_path, model, precision, xla, sparse):
    out = tmp_path / "figures.json"
    options = ["--model", model, "--precision", precision, *(["--xla"] if xla else []), "--sparse-optimizer", sparse]
    options += TINY + (["--var-types", "hbm"] if sparse == "rowwise" else [])
    figures = dlrm.main([*options, "--json", str(out)])
    assert figures["config"]["xla"] is xla and figures["config"]["sparse_optimizer"] == sparse
    assert json.loads(out.read_text()) == json.loads(json.dumps(figures))
    assert figures["demo_config"]["model"] == model and figures["config"]["precision"] == precision
    assert figures["demo_config"]["var_types"] == (["hbm"] if sparse == "rowwise" else ["hbm", "hybrid"])
    for name in ("keras", "sok"):
        assert figures[name]["samples_per_s"] > 0 and 0.0 <= figures[name]["auc"] <= 1.0
        held, tensors = figures[name]["gpu_bytes_of_model"], figures[name]["tf_tensor_bytes_of_model"]
        if dlrm.tf.config.list_logical_devices("GPU"):
            assert held >= 0 and tensors > 0  # the driver sees nothing where TF reuses memory it holds
        else:
            assert held is None and tensors is None
    assert figures["ratio"] == pytest.approx(figures["sok"]["samples_per_s"] / figures["keras"]["samples_per_s"])


def test_mlperf_sizes_need_the_dcnv2_model():
    with pytest.raises(SystemExit) as exit_info:
        dlrm.main(["--mlperf", *TINY])
    assert exit_info.value.code == 2
