"""dlrm.py: both models of the demo, SOK against Keras' Embedding, run end to end at a tiny size (the
figures' keys, AUCs, the precision, XLA and tables' optimizer it was asked for), and its refusal of --mlperf without
dcnv2."""

from __future__ import annotations

import json

import numpy as np
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


def test_trace_splits_each_models_step_by_part(policy_restored, tmp_path):
    figures = dlrm.main([*TINY, "--tables", "static", "--trace-steps", "2"])
    for name in ("keras", "sok"):
        split = figures[name]["step_split"]
        assert set(split["parts_ms"]) == {"lookup", "update", "dense", "input"}
        assert split["parts_ms"]["dense"] > 0
        assert split["top_ms"] and all(ms >= 0 for _, ms in split["top_ms"])
    sok_parts, keras_parts = figures["sok"]["step_split"]["parts_ms"], figures["keras"]["step_split"]["parts_ms"]
    # SOK's lookup ops and its tables' Adagrad op are there; Keras' model has no SOK op.
    assert sok_parts["lookup"] > 0 and sok_parts["update"] > 0 and keras_parts["lookup"] == 0
    floor = figures["embedding_floor"]
    assert floor["embedding_ms"] == pytest.approx(sok_parts["lookup"] + sok_parts["update"])
    assert floor["copy_bytes_per_s"] > 0 and floor["floor_ms"] == pytest.approx(
        floor["bytes"]["total"] / floor["copy_bytes_per_s"] * 1e3
    )


def test_floor_bytes_count_each_part_of_the_step():
    """Two features (widths 2 and 1) of 3 samples, dim 4 (16-byte rows), one float of state per row."""
    ids = np.array([[5, 5, 9], [6, 5, 9], [7, 8, 9]], np.int64)
    moved = dlrm.floor_bytes(ids, [2, 1], dim=4, state_columns=1)
    distinct = 4 + 1  # {5, 6, 7, 8} and {9}
    assert moved["distinct"] == distinct
    assert moved["ids"] == 9 * 8
    assert moved["forward"] == 9 * 16 + 3 * 2 * 16  # each id's row read, each sample's pooled rows written
    assert moved["backward"] == 3 * 2 * 16 + distinct * 16
    assert moved["update"] == distinct * (3 * 16 + 2 * 4)
    assert moved["total"] == moved["ids"] + moved["forward"] + moved["backward"] + moved["update"]
    half = dlrm.floor_bytes(ids, [2, 1], dim=4, state_columns=1, row_itemsize=2)  # bfloat16 rows: 8 bytes
    assert half["forward"] == 9 * 8 + 3 * 2 * 16 and half["backward"] == moved["backward"]
    assert half["update"] == distinct * (16 + 2 * 8 + 2 * 4)


def test_dcnv2_of_bfloat16_rows_trains_and_reports(policy_restored):
    figures = dlrm.main(
        ["--model", "dcnv2", "--tables", "static", "--sparse-optimizer", "rowwise", "--row-dtype", "bfloat16", *TINY]
    )
    assert figures["config"]["row_dtype"] == "bfloat16" and 0.0 <= figures["sok"]["auc"] <= 1.0


@pytest.mark.parametrize("options", [["--sparse-optimizer", "adagrad", "--tables", "static"], ["--tables", "mixed"]])
def test_half_rows_need_row_wise_adagrad_and_static_tables(options):
    with pytest.raises(SystemExit) as exit_info:
        dlrm.main(["--row-dtype", "float16", "--sparse-optimizer", "rowwise", *options, *TINY])
    assert exit_info.value.code == 2


@pytest.mark.parametrize(
    ("op_type", "part"),
    [("SokPooledLookupGrad", "lookup"), ("SokSparseApplyAdagradTables", "update"), ("ResourceApplyAdam", "update"),
     ("memcpy host-to-device", "input"), ("MatMul", "dense"), ("?", "dense")],
)  # fmt: skip
def test_step_part_of_each_op_type(op_type, part):
    assert dlrm.step_part(op_type) == part


def test_negative_trace_steps_are_refused(capsys):
    with pytest.raises(SystemExit):
        dlrm.main([*TINY, "--trace-steps", "-1"])
    assert "--trace-steps -1 is negative" in capsys.readouterr().err


def test_int32_ids_from_gpu_memory_train_as_int64_ids_from_the_host(policy_restored):
    """The same batches as int32 ids (and, on a GPU, from GPU memory): the same AUC on both models."""
    base = [*TINY, "--model", "dcnv2", "--tables", "mixed"]
    wide = dlrm.main(base)
    narrow = dlrm.main([*base, "--id-dtype", "int32", "--input", "gpu"])
    assert narrow["config"]["id_dtype"] == "int32" and narrow["config"]["input"] == "gpu"
    for name in ("keras", "sok"):
        assert narrow[name]["auc"] == pytest.approx(wide[name]["auc"], abs=1e-6)
