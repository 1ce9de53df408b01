"""The demo's DLRM-DCNv2 (``sok demo --model dcnv2``): the cross network against NumPy, the whole
forward against the same weights in plain TensorFlow with ``tf.nn.embedding_lookup_sparse``, a
short training run, the multi-hot generator, and the refusals of bad options."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from sparse_operation_kit.cli import _demo_config, _demo_part, build_parser, main  # noqa: E402
from sparse_operation_kit.demo.criteo import (  # noqa: E402
    MLPERF_HOTNESS,
    MLPERF_ROWS,
    NUM_CATEGORICAL,
    NUM_DENSE,
    MultiHotGenerator,
    capped_cardinalities,
    preprocess_dense,
)
from sparse_operation_kit.demo.dcnv2 import DCNv2Tower, LowRankCrossNet, split_bags  # noqa: E402
from sparse_operation_kit.demo.dlrm import SokEmbeddings, dynamic_keys  # noqa: E402
from sparse_operation_kit.demo.train import CONFIG_FILE, MLPERF_DCNV2, DemoConfig, train  # noqa: E402

#: A hotness with bags of 1 to 4 ids (MLPerf's 214 ids a sample make the oracle slow for nothing).
SMALL_HOTNESS = [1 + i % 4 for i in range(NUM_CATEGORICAL)]


def numpy_cross(x0: np.ndarray, vs: list, us: list, bs: list) -> np.ndarray:
    """x_{l+1} = x_0 * (U_l (V_l x_l) + b_l) + x_l, row vectors, float64."""
    x = x0
    for v, u, b in zip(vs, us, bs):
        x = x0 * ((x @ v) @ u + b) + x
    return x


def test_cross_network_matches_numpy():
    rng = np.random.default_rng(0)
    cross = LowRankCrossNet(num_layers=3, low_rank=5, seed=1)
    x0 = rng.normal(size=(8, 12)).astype(np.float32)
    cross(x0)  # builds the weights
    for b in cross.biases:  # zero at start: give the bias term something to show
        b.assign(rng.normal(size=b.shape).astype(np.float32))
    got = cross(x0).numpy()
    assert [tuple(v.shape) for v in cross.kernels_v] == [(12, 5)] * 3
    assert [tuple(u.shape) for u in cross.kernels_u] == [(5, 12)] * 3
    weights = [[np.asarray(w, np.float64) for w in ws] for ws in (cross.kernels_v, cross.kernels_u, cross.biases)]
    np.testing.assert_allclose(got, numpy_cross(x0.astype(np.float64), *weights), rtol=1e-5, atol=1e-5)


def oracle_logits(tower: DCNv2Tower, dense: np.ndarray, pooled: list) -> np.ndarray:
    """The tower's forward from its weights in NumPy: ReLU MLP, cross network, ReLU MLP, linear."""

    def mlp(x: np.ndarray, layers: list, last_linear: bool) -> np.ndarray:
        for i, layer in enumerate(layers):
            kernel, bias = (np.asarray(w, np.float64) for w in layer.weights)
            x = x @ kernel + bias
            if not (last_linear and i == len(layers) - 1):
                x = np.maximum(x, 0.0)
        return x

    x = mlp(dense.astype(np.float64), tower.bottom, last_linear=False)
    x0 = np.concatenate([x] + [np.asarray(p, np.float64) for p in pooled], axis=1)
    cross = tower.cross
    weights = [[np.asarray(w, np.float64) for w in ws] for ws in (cross.kernels_v, cross.kernels_u, cross.biases)]
    return mlp(numpy_cross(x0, *weights), tower.top, last_linear=True)


@pytest.mark.parametrize("layout", ["ragged", "sparse"])
def test_forward_matches_plain_tensorflow_with_embedding_lookup_sparse(layout):
    gen = MultiHotGenerator(seed=3, max_rows=64, hotness=SMALL_HOTNESS)
    counts, ids, _ = gen.batch(0, 16)
    dense = preprocess_dense(counts)
    embeddings = SokEmbeddings(gen.rows, dim=4, tables="mixed", var_types=["hbm", "hybrid"], dynamic_rows=32, seed=2)
    assert {"static", "hbm", "hybrid"} <= set(embeddings.kinds)
    tower = DCNv2Tower(dim=4, bottom=(8,), top=(16, 8), cross_layers=2, low_rank=3, seed=4)
    tower.build_for()
    for b in tower.cross.biases:  # zero at start
        b.assign(np.random.default_rng(5).normal(size=b.shape).astype(np.float32))
    bags = split_bags(tf.constant(ids), gen.hotness)
    if layout == "sparse":
        bags = [bag.to_sparse() for bag in bags]
    pooled = embeddings.lookup(bags)
    logits = tower((tf.constant(dense), pooled)).numpy()

    oracle_pooled = []
    for i, (table, dynamic) in enumerate(zip(embeddings.tables, embeddings.dynamic)):
        bag = ids[:, gen.offsets[i] : gen.offsets[i + 1]]
        if dynamic:  # the rows the lookup created, read back by key; the oracle indexes them by position
            unique, position = np.unique(bag, return_inverse=True)
            rows = table.sparse_read(tf.constant(dynamic_keys(unique))).numpy()
            bag = position.reshape(bag.shape)
        else:
            rows = table.numpy()
        sparse = tf.sparse.from_dense(tf.constant(bag + 1))  # + 1: from_dense drops zeros
        sparse = tf.SparseTensor(sparse.indices, sparse.values - 1, sparse.dense_shape)
        oracle_pooled.append(tf.nn.embedding_lookup_sparse(tf.constant(rows), sparse, None, combiner="sum").numpy())
    for got, want in zip(pooled, oracle_pooled):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(logits, oracle_logits(tower, dense, oracle_pooled), rtol=1e-4, atol=1e-5)


def test_training_reduces_the_loss_and_gives_a_finite_auc(tmp_path):
    config = DemoConfig(
        model="dcnv2", steps=40, epochs=2, batch_size=256, eval_batches=2, dim=4, max_rows=2048, low_rank=8, seed=1
    )
    results = train(config, str(tmp_path))
    losses = np.asarray(results["loss"])
    assert np.all(np.isfinite(losses)) and losses[-10:].mean() < losses[:10].mean()
    assert all(np.isfinite(results["eval_auc"])) and 0.5 < results["eval_auc"][-1] <= 1.0
    record = json.loads((tmp_path / CONFIG_FILE).read_text(encoding="utf-8"))
    assert record["config"]["model"] == "dcnv2" and record["config"]["hotness"] == list(MLPERF_HOTNESS)
    assert record["rows"] == list(capped_cardinalities(2048))


# -- the data -----------------------------------------------------------------------------------
def test_mlperf_hotness_and_rows():
    assert len(MLPERF_HOTNESS) == len(MLPERF_ROWS) == NUM_CATEGORICAL and sum(MLPERF_HOTNESS) == 214
    assert capped_cardinalities(1 << 22) == tuple(min(r, 1 << 22) for r in MLPERF_ROWS)
    assert max(capped_cardinalities(1 << 22)) == 1 << 22 and min(capped_cardinalities(1 << 22)) == 3


@pytest.mark.parametrize("hotness", [MLPERF_HOTNESS, SMALL_HOTNESS])
def test_multi_hot_batches_have_the_hotness_and_id_ranges(hotness):
    gen = MultiHotGenerator(seed=0, max_rows=1000, hotness=hotness)
    counts, ids, labels = gen.batch(2, 512)
    assert counts.shape == (512, NUM_DENSE) and labels.shape == (512,)
    assert ids.shape == (512, sum(hotness)) and ids.dtype == np.int64 and gen.ids_per_sample == sum(hotness)
    assert gen.offsets == tuple(np.concatenate([[0], np.cumsum(hotness)]))
    assert gen.rows == capped_cardinalities(1000)
    for i, rows in enumerate(gen.rows):
        bag = ids[:, gen.offsets[i] : gen.offsets[i + 1]]
        assert bag.shape == (512, hotness[i]) and bag.min() >= 0 and bag.max() < rows
    big = ids[:, gen.offsets[0] : gen.offsets[1]]  # 1000 rows: power law, id 0 the most frequent
    assert np.bincount(big.ravel()).argmax() == 0 and len(np.unique(big)) > 50


def test_multi_hot_batches_are_deterministic_by_seed_stream_and_index():
    a, b = MultiHotGenerator(seed=5, max_rows=500), MultiHotGenerator(seed=5, max_rows=500)
    for x, y in zip(a.batch(1, 64), b.batch(1, 64)):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a.batch(1, 64)[1], a.batch(2, 64)[1])
    assert not np.array_equal(a.batch(1, 64, "eval")[1], a.batch(1, 64)[1])
    assert not np.array_equal(MultiHotGenerator(seed=6, max_rows=500).batch(1, 64)[1], a.batch(1, 64)[1])


def test_multi_hot_labels_follow_the_hidden_model_of_the_bags():
    gen = MultiHotGenerator(seed=0, max_rows=1000)
    counts, ids, labels = gen.batch(0, 8000)
    p = gen.click_probability(counts, ids)
    assert abs(labels.mean() - p.mean()) < 0.015
    # A feature's effect is its bag's summed effects over sqrt(hotness): check one feature by hand.
    effects = gen._effects(ids)
    i = 20  # 100 ids a sample
    want = effects[:, gen.offsets[i] : gen.offsets[i + 1]].sum(axis=1) / np.sqrt(100)
    np.testing.assert_allclose(gen._feature_effects(ids)[:, i], want)


def test_multi_hot_dataset_yields_the_batches():
    gen = MultiHotGenerator(seed=1, max_rows=300, hotness=SMALL_HOTNESS)
    dense, ids, labels = next(iter(gen.dataset(steps=1, batch_size=32)))
    counts, want_ids, want_labels = gen.batch(0, 32)
    assert ids.shape == (32, sum(SMALL_HOTNESS)) and dense.shape == (32, NUM_DENSE) and labels.shape == (32, 1)
    np.testing.assert_array_equal(ids.numpy(), want_ids)
    np.testing.assert_array_equal(labels.numpy()[:, 0], want_labels)


# -- bad input ----------------------------------------------------------------------------------
@pytest.mark.parametrize("hotness", [MLPERF_HOTNESS[:25], [1] * 27, [0] + [1] * 25, [1.5] * 26])
def test_generator_refuses_a_bad_hotness(hotness):
    with pytest.raises(ValueError, match=r"hotness .* is not valid.*26 integers >= 1"):
        MultiHotGenerator(hotness=hotness)


def test_compiled_tower_returns_nothing_in_host_memory_for_its_gradient():
    """The tower's forward function (XLA-compiled, as dlrm.py's --xla and the GPU demo run it) keeps
    for its gradient only float tensors: an int32 one (a concat's axis) lives in host memory, so the
    GPU would copy it back at every step (run p's DCNv2 trace)."""
    tower = DCNv2Tower(dim=4, bottom=(8,), top=(16, 8), cross_layers=2, low_rank=3, seed=4)
    tower.build_for()
    forward = tf.function(lambda dense, pooled: tower((dense, pooled)), jit_compile=True)

    @tf.function(input_signature=[tf.TensorSpec([16, NUM_DENSE]), tf.TensorSpec([NUM_CATEGORICAL, 16, 4])])
    def gradients(dense: tf.Tensor, pooled: tf.Tensor) -> list[tf.Tensor]:
        bags = tf.unstack(pooled)
        with tf.GradientTape() as tape:
            tape.watch(bags)
            loss = tf.reduce_sum(forward(dense, bags))
        return tape.gradient(loss, bags + tower.trainable_variables)

    calls = [
        op for op in gradients.get_concrete_function().graph.get_operations() if op.type == "StatefulPartitionedCall"
    ]
    assert calls, "the compiled tower is not a function call in the graph"
    kept = [(op.name, i, x.dtype.name) for op in calls for i, x in enumerate(op.outputs) if x.dtype.is_integer]
    assert kept == []


@pytest.mark.parametrize("dtype", [tf.int32, tf.int64], ids=["int32", "int64"])
@pytest.mark.parametrize("static_batch", [True, False], ids=["static", "dynamic"])
def test_split_bags_equal_ragged_from_tensor(dtype, static_batch):
    """Each feature's bag as tf.RaggedTensor.from_tensor makes it (values of the ids' dtype, int64
    row splits), with the batch's size known when traced or not; known, the splits are constants
    (a Range of constants placed on a GPU copies its start and limit to the host at every step)."""
    ids = tf.constant(np.arange(5 * sum(SMALL_HOTNESS)).reshape(5, -1), dtype)
    spec = tf.TensorSpec([5 if static_batch else None, sum(SMALL_HOTNESS)], dtype)
    split = tf.function(lambda x: split_bags(x, SMALL_HOTNESS), input_signature=[spec])
    bags = split(ids)
    ops = {op.type for op in split.get_concrete_function().graph.get_operations()}
    assert ("Range" in ops) != static_batch, ops
    start = 0
    for bag, width in zip(bags, SMALL_HOTNESS):
        expected = tf.RaggedTensor.from_tensor(ids[:, start : start + width])
        assert bag.values.dtype == dtype and bag.row_splits.dtype == tf.int64
        np.testing.assert_array_equal(bag.row_splits.numpy(), expected.row_splits.numpy())
        np.testing.assert_array_equal(bag.values.numpy(), expected.values.numpy())
        start += width


def test_split_bags_refuses_ids_of_another_hotness():
    with pytest.raises(ValueError, match=r"do not hold the bags of hotness .* valid: \[batch, 214\]"):
        split_bags(tf.zeros([4, 26], tf.int64), MLPERF_HOTNESS)


@pytest.mark.parametrize(
    ("option", "value"), [("cross_layers", 0), ("low_rank", -1), ("dim", 0), ("max_rows", 0), ("top", [8, 0])]
)
def test_config_refuses_non_positive_sizes(option, value):
    with pytest.raises(ValueError, match=f"{option} .* is not valid"):
        DemoConfig(model="dcnv2", **{option: value}).check(1)


def test_config_refuses_an_unknown_model_and_criteo_files_for_dcnv2():
    with pytest.raises(ValueError, match=r"model 'dcn' is not valid; valid: 'dlrm', 'dcnv2'"):
        DemoConfig(model="dcn").check(1)
    with pytest.raises(ValueError, match="one id per feature.*model 'dlrm'"):
        DemoConfig(model="dcnv2", train_tsv=["day_0"], eval_tsv=["day_1"]).check(1)


def test_layers_refuse_non_positive_sizes():
    with pytest.raises(ValueError, match="low_rank 0 is not valid"):
        LowRankCrossNet(num_layers=2, low_rank=0)
    with pytest.raises(ValueError, match=r"bottom \[0\] is not valid"):
        DCNv2Tower(dim=4, bottom=[0])


def test_cli_refuses_an_unknown_model(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--model", "dcn"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'dcn'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--hotness", "1", "2", "3"], "hotness [1, 2, 3] is not valid (3 entries); valid: 26 integers >= 1"),
        (["--low-rank", "0"], "low_rank 0 is not valid"),
        (["--batch-size", "0"], "batch_size 0 is not valid"),
    ],
)
def test_cli_refuses_bad_dcnv2_options_before_training(argv, message, capsys, tmp_path):
    assert main(["demo", "--model", "dcnv2", "--output", str(tmp_path), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not os.listdir(tmp_path)  # refused before anything ran


def test_cli_refuses_dcnv2_options_with_dlrm(capsys):
    assert main(["demo", "--part", "train", "--hotness", *["1"] * 26, "--mlperf"]) == 2
    assert "--hotness, --mlperf are options of --model dcnv2" in capsys.readouterr().err


def test_cli_dcnv2_runs_all_parts_by_default_and_mlperf_sets_the_sizes_not_given():
    args = build_parser().parse_args(["demo", "--model", "dcnv2", "--mlperf", "--dim", "64"])
    assert _demo_part(args) == "all"  # as the DLRM: train, serve, storage tour
    config = _demo_config(args)
    assert config.model == "dcnv2" and config.dim == 64  # given: kept
    for option in ("bottom", "top", "cross_layers", "low_rank", "hotness", "max_rows"):
        assert getattr(config, option) == MLPERF_DCNV2[option]
    assert MLPERF_DCNV2["max_rows"] == 1 << 22 and MLPERF_DCNV2["low_rank"] == 512
    plain = _demo_config(build_parser().parse_args(["demo", "--model", "dcnv2"]))
    assert (plain.dim, plain.low_rank, plain.max_rows) == (
        DemoConfig().dim,
        DemoConfig().low_rank,
        DemoConfig().max_rows,
    )
    assert _demo_part(build_parser().parse_args(["demo"])) == "all"


def test_cli_trains_a_tiny_dcnv2(capsys, tmp_path):
    sizes = ["--steps", "4", "--epochs", "1", "--batch-size", "64", "--eval-batches", "1", "--dim", "4"]
    command = ["demo", "--model", "dcnv2", "--part", "train", "--output", str(tmp_path), "--max-rows", "512"]
    assert main([*command, *sizes]) == 0
    out = capsys.readouterr().out
    assert "DLRM-DCNv2 on multi-hot Criteo-shaped data (214 ids per sample)" in out and "epoch 1: eval AUC" in out
    assert (tmp_path / "checkpoint").is_dir()
