"""dlrm_torchrec.py: its NumPy parts against oracles (a pairwise AUC, Keras' AUC, dlrm.py's tf.data batches),
and where torchrec is importable, a --quick run and FBGEMM's fused table update against the Adagrad rules."""

from __future__ import annotations

import json

import dlrm_torchrec
import numpy as np
import pytest


def test_exact_auc_is_the_share_of_positive_negative_pairs_ranked_right():
    rng = np.random.default_rng(0)
    labels = rng.random(300) < 0.3
    scores = np.round(rng.random(300), 1)  # many ties
    pos, neg = scores[labels][:, None], scores[~labels][None, :]
    pairs = np.mean((pos > neg) + 0.5 * (pos == neg))
    assert dlrm_torchrec.exact_auc(labels, scores) == pytest.approx(pairs, abs=1e-12)


def test_thresholded_auc_is_keras_auc():
    keras = pytest.importorskip("keras")
    rng = np.random.default_rng(1)
    labels = (rng.random(5000) < 0.25).astype(np.float32)
    scores = np.clip(0.3 * labels + rng.random(5000) * 0.8, 0.0, 1.0).astype(np.float32)
    metric = keras.metrics.AUC(num_thresholds=dlrm_torchrec.AUC_THRESHOLDS)
    metric.update_state(labels, scores)
    assert dlrm_torchrec.thresholded_auc(labels, scores) == pytest.approx(float(metric.result()), abs=1e-6)


def test_feature_major_lays_out_each_features_bags_sample_by_sample():
    hotness = [2, 1, 3]
    ids = np.arange(4 * 6).reshape(4, 6)
    values, lengths = dlrm_torchrec.feature_major(ids, hotness)
    expected, start = [], 0
    for h in hotness:
        for sample in range(4):
            expected.extend(ids[sample, start : start + h])
        start += h
    assert values.tolist() == expected
    assert lengths.tolist() == [2] * 4 + [1] * 4 + [3] * 4 and lengths.dtype == np.int32


def test_batches_are_dlrm_pys():
    pytest.importorskip("tensorflow")
    gen = dlrm_torchrec.demo_config(dlrm_torchrec.parse_args(["--quick"])).generator()
    for stream in ("train", "eval"):
        ours = dlrm_torchrec.make_batches(gen, 2, 64, stream)
        theirs = [tuple(t.numpy() for t in batch) for batch in gen.dataset(2, 64, stream)]
        for mine, other in zip(ours, theirs):
            for a, b in zip(mine, other):
                assert a.dtype == b.dtype and np.array_equal(a, b)


def test_quick_run_reports_dlrm_pys_figures(tmp_path):
    pytest.importorskip("torchrec")
    out = tmp_path / "figures.json"
    figures = dlrm_torchrec.main(["--quick", "--device", "cpu", "--sparse-optimizer", "rowwise", "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(figures))
    assert figures["tool"] == "torchrec" and figures["demo_config"]["model"] == "dcnv2"
    result = figures["torchrec"]
    assert result["samples_per_s"] > 0 and 0.0 <= result["auc"] <= 1.0
    assert result["sparse_optimizer"] == "EXACT_ROWWISE_ADAGRAD" and result["steps_before_auc"] == 1 + 1 + 3


@pytest.mark.parametrize("optimizer", ["rowwise", "adagrad"])
def test_fused_update_is_sok_and_keras_adagrad_rule(optimizer):
    pytest.importorskip("torchrec")
    tr = dlrm_torchrec.import_torchrec("dlrm_torchrec.py")
    torch = tr["torch"]
    args = dlrm_torchrec.parse_args(["--quick", "--batch-size", "32", "--sparse-optimizer", optimizer])
    config = dlrm_torchrec.demo_config(args)
    gen = config.generator()
    device = torch.device("cpu")
    model, _ = dlrm_torchrec.build_model(config, tuple(gen.rows), args, device, tr)
    try:
        state = model.state_dict()

        def table(t: int) -> np.ndarray:
            value = state[f"sparse_arch.embedding_bag_collection.embedding_bags.t{t}.weight"]
            value = value.local_shards()[0].tensor if hasattr(value, "local_shards") else value
            return value.detach().numpy().astype(np.float64)

        before = [table(t) for t in range(len(gen.rows))]
        dense, ids, labels = dlrm_torchrec.make_batches(gen, 1, config.batch_size)[0]
        pooled = {}

        def keep(module, inputs, output):  # the pooled rows [B, 26, dim], whose gradient the rule needs
            output.retain_grad()
            pooled["rows"] = output

        hook = model.module.sparse_arch.register_forward_hook(keep)
        logits = model(torch.as_tensor(dense), dlrm_torchrec.kjt_of(ids, gen.hotness, device, "int64", tr))
        torch.nn.functional.binary_cross_entropy_with_logits(logits, torch.as_tensor(labels)).backward()
        hook.remove()
        grad_pooled = pooled["rows"].grad.numpy().astype(np.float64)
        for t, start in enumerate(gen.offsets[:-1]):
            bags = ids[:, start : gen.offsets[t + 1]]
            grad = np.zeros_like(before[t])
            np.add.at(grad, bags.reshape(-1), np.repeat(grad_pooled[:, t], bags.shape[1], axis=0))
            rows = np.unique(bags)
            squares = grad[rows] ** 2
            accumulator = dlrm_torchrec.INITIAL_ACCUMULATOR + (
                squares.mean(axis=1, keepdims=True) if optimizer == "rowwise" else squares
            )
            expected = before[t].copy()
            expected[rows] -= config.sparse_lr * grad[rows] / (np.sqrt(accumulator) + dlrm_torchrec.SPARSE_EPSILON)
            np.testing.assert_allclose(table(t), expected, rtol=0, atol=1e-6)
    finally:
        import torch.distributed as dist

        dist.destroy_process_group()
