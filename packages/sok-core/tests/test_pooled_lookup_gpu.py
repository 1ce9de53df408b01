"""The DEVICE_GPU kernels of SokPooledLookup and SokPooledLookupGrad against their CPU kernels.

The same inputs go to the op on /CPU:0 and on /GPU:0: forward outputs, gradient rows and gradient
ids must be equal to the bit, but for the gradient rows of hot ids (more than ``HOT`` occurrences,
summed in segments on the GPU: equal within float rounding, and the same bits run after run), and
bad inputs must fail with the same InvalidArgument text. Then ``sok.lookup_sparse`` over
``sok.Variable`` tables on the GPU, against ``tf.nn.embedding_lookup_sparse``. Soft device
placement is off, so an op without a GPU kernel fails instead of running on the CPU.

Skipped unless TensorFlow sees a GPU and sok-core's GPU kernels were built (``ci/gpu_test.sh``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")

tf = pytest.importorskip("tensorflow")

import sparse_operation_kit as sok  # noqa: E402
from sparse_operation_kit import communication, pooled_lookup, tf_ops  # noqa: E402
from sparse_operation_kit.lookup.plan import fused_tables  # noqa: E402
from sparse_operation_kit.testing.device import skip_unless_gpu_tensorflow  # noqa: E402

pytestmark = pytest.mark.gpu

CPU, GPU = "/CPU:0", "/GPU:0"
COMBINERS = ("sum", "mean", "sqrtn")
DIMS = (1, 3, 128, 1000)
# kHotSegment of gpu/pooled_lookup_kernels.cu: ids with more occurrences are summed in segments.
HOT = 1024


@pytest.fixture(autouse=True)
def gpu_tensorflow(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Skips without a GPU or GPU kernels; runs the test on one rank with soft placement off."""
    skip_unless_gpu_tensorflow()
    monkeypatch.setattr(communication, "_tool", communication.SingleProcess())
    soft = tf.config.get_soft_device_placement()
    tf.config.set_soft_device_placement(False)
    try:
        yield
    finally:
        tf.config.set_soft_device_placement(soft)


def _inputs(
    seed: int,
    dims: tuple[int, ...],
    batch: int,
    id_dtype: Any,
    shard: tuple[int, int] | None,
    max_ids: int = 40,
) -> dict[str, list[np.ndarray]]:
    """One table per dim: rows of mixed magnitudes, 0..max_ids ids per sample (a quarter of the
    samples empty, a third of the ids one hot id, for long runs in the gradient), weights of both
    signs, and the cotangents of the outputs. With a shard, ids range over the full table and the
    shard holds ceil(rows / stride) rows (5 for offset -1, which holds none)."""
    rng = np.random.default_rng(seed)
    stride, offset = shard or (1, 0)
    out: dict[str, list[np.ndarray]] = {"params": [], "ids": [], "splits": [], "weights": [], "grads": []}
    for dim in dims:
        full_rows = int(rng.integers(stride, 3000))
        rows = 5 if offset < 0 else -(-(full_rows - offset) // stride)
        lengths = rng.integers(0, max_ids + 1, batch)
        lengths[rng.random(batch) < 0.25] = 0
        nnz = int(lengths.sum())
        ids = rng.integers(0, full_rows, nnz)
        ids[rng.random(nnz) < 0.3] = int(rng.integers(0, full_rows))
        if offset >= 0:  # held ids within the shard's rows
            ids = np.where((ids % stride == offset) & (ids // stride >= rows), offset, ids)
        scale = rng.choice(np.float32([1e-3, 1.0, 1e3]), (rows, dim))
        out["params"].append((rng.standard_normal((rows, dim)) * scale).astype(np.float32))
        out["ids"].append(ids.astype(id_dtype))
        out["splits"].append(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
        out["weights"].append(rng.standard_normal(nnz).astype(np.float32))
        out["grads"].append(rng.standard_normal((batch, dim)).astype(np.float32))
    return out


def _attrs(n: int, shard: tuple[int, int] | None) -> dict[str, list[int]]:
    return {"strides": [] if shard is None else [shard[0]] * n, "offsets": [] if shard is None else [shard[1]] * n}


def _forward(
    device: str, x: dict, combiners: list[str], weighted: bool, shard=None, row_dtype: str = "float32"
) -> list[tf.Tensor]:
    n = len(x["params"])
    with tf.device(device):
        return tf_ops.library().sok_pooled_lookup(
            params=[tf.cast(tf.constant(p), row_dtype) for p in x["params"]],
            ids=[tf.constant(i) for i in x["ids"]],
            row_splits=[tf.constant(s) for s in x["splits"]],
            weights=[tf.constant(w) for w in x["weights"]] if weighted else [],
            combiners=combiners,
            names=[f"table{t}" for t in range(n)],
            positions=list(range(n)),
            **_attrs(n, shard),
        )


def _gradient(
    device: str, x: dict, combiners: list[str], weighted: bool, shard=None, padded: bool = False
) -> tuple[list, list]:
    n = len(x["params"])
    with tf.device(device):
        return tf_ops.library().sok_pooled_lookup_grad(
            grads=[tf.constant(g) for g in x["grads"]],
            ids=[tf.constant(i) for i in x["ids"]],
            row_splits=[tf.constant(s) for s in x["splits"]],
            weights=[tf.constant(w) for w in x["weights"]] if weighted else [],
            combiners=combiners,
            table_rows=[p.shape[0] for p in x["params"]],
            padded=padded,
            **_attrs(n, shard),
        )


def _assert_close(cpu: np.ndarray, gpu: np.ndarray, message: str = "") -> None:
    """Equal within the rounding of sums taken in another order: an error that scales with the
    partial sums (up to the largest value), not with each result, hence atol from the largest."""
    atol = 1e-6 + 1e-4 * float(np.abs(cpu).max(initial=0.0))
    np.testing.assert_allclose(gpu, cpu, rtol=1e-5, atol=atol, err_msg=message)


def _has_hot_ids(ids: np.ndarray) -> bool:
    """Whether an id occurs more than HOT times (its gradient row is then summed in segments)."""
    return ids.size > 0 and int(np.unique(ids, return_counts=True)[1].max()) > HOT


def _assert_same_on_both(x: dict, combiners: list[str], weighted: bool, shard=None) -> None:
    cpu = _forward(CPU, x, combiners, weighted, shard)
    gpu = _forward(GPU, x, combiners, weighted, shard)
    for t, (a, b) in enumerate(zip(cpu, gpu)):
        assert "GPU" in b.device, b.device
        np.testing.assert_array_equal(b.numpy(), a.numpy(), err_msg=f"forward of table {t}")
    # padded: a row per id, the distinct ids' rows first, then index -1 (rows unspecified: zeros on
    # the CPU, unwritten on the GPU).
    for padded in (False, True):
        (cpu_rows, cpu_ids), (gpu_rows, gpu_ids) = (
            _gradient(d, x, combiners, weighted, shard, padded) for d in (CPU, GPU)
        )
        for t in range(len(combiners)):
            assert "GPU" in gpu_rows[t].device, gpu_rows[t].device
            ids = gpu_ids[t].numpy()
            np.testing.assert_array_equal(ids, cpu_ids[t].numpy(), err_msg=f"gradient ids of table {t}, {padded=}")
            distinct = np.count_nonzero(ids >= 0)
            if padded:
                assert ids.shape == x["ids"][t].shape and (ids[distinct:] == -1).all()
            message = f"gradient rows of table {t}, {padded=}"
            cpu, gpu = cpu_rows[t].numpy()[:distinct], gpu_rows[t].numpy()[:distinct]
            if _has_hot_ids(x["ids"][t]):
                _assert_close(cpu, gpu, message)
            else:
                np.testing.assert_array_equal(gpu, cpu, err_msg=message)


def test_no_hot_ids_equal_the_cpu_kernel_to_the_bit() -> None:
    """At most HOT occurrences per id: every gradient row is summed in the CPU's order."""
    x = _inputs(9, DIMS, batch=97, id_dtype=np.int64, shard=None, max_ids=6)
    x["ids"] = [np.arange(ids.size, dtype=np.int64) % p.shape[0] for ids, p in zip(x["ids"], x["params"])]
    assert not any(_has_hot_ids(ids) for ids in x["ids"])
    _assert_same_on_both(x, ["mean", "sqrtn", "sum", "mean"], weighted=True)


@pytest.mark.parametrize("combiner", COMBINERS)
def test_a_very_hot_id_is_close_to_the_cpu_and_deterministic(combiner: str) -> None:
    """200k occurrences of one id among others of about 460 each: the GPU's gradient is within float
    rounding of the CPU's for that id (summed in segments), equal to the bit for the others (one
    segment each), and the same bits on a second run."""
    rng = np.random.default_rng(10)
    batch, per_sample, dims = 25_000, 10, (32, 128)
    x: dict[str, list[np.ndarray]] = {"params": [], "ids": [], "splits": [], "weights": [], "grads": []}
    for dim in dims:
        ids = rng.integers(0, 5000, batch * per_sample)
        ids[rng.permutation(ids.size)[:200_000]] = 17
        x["params"].append(rng.standard_normal((5000, dim)).astype(np.float32))
        x["ids"].append(ids.astype(np.int64))
        x["splits"].append(np.arange(0, batch * per_sample + 1, per_sample, dtype=np.int64))
        x["weights"].append(rng.uniform(0.5, 2.0, ids.size).astype(np.float32))
        x["grads"].append(rng.standard_normal((batch, dim)).astype(np.float32))
    combiners = [combiner] * len(dims)
    cpu_rows, cpu_ids = _gradient(CPU, x, combiners, weighted=True)
    first_rows, first_ids = _gradient(GPU, x, combiners, weighted=True)
    second_rows, second_ids = _gradient(GPU, x, combiners, weighted=True)
    for t in range(len(dims)):
        np.testing.assert_array_equal(first_ids[t].numpy(), cpu_ids[t].numpy())
        _assert_close(cpu_rows[t].numpy(), first_rows[t].numpy())
        others = first_ids[t].numpy() != 17
        np.testing.assert_array_equal(first_rows[t].numpy()[others], cpu_rows[t].numpy()[others])
        np.testing.assert_array_equal(second_ids[t].numpy(), first_ids[t].numpy())
        np.testing.assert_array_equal(second_rows[t].numpy(), first_rows[t].numpy())


@pytest.mark.parametrize("shard", [None, (2, 1), (2, -1), (3, 2)], ids=["whole", "2-1", "2-none", "3-2"])
@pytest.mark.parametrize("id_dtype", [np.int32, np.int64], ids=["int32", "int64"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("combiner", COMBINERS)
def test_equals_the_cpu_kernel_to_the_bit(combiner: str, weighted: bool, id_dtype: Any, shard) -> None:
    x = _inputs(0, DIMS, batch=97, id_dtype=id_dtype, shard=shard)
    _assert_same_on_both(x, [combiner] * len(DIMS), weighted, shard)


@pytest.mark.parametrize("max_ids", [1, 2, 3])
@pytest.mark.parametrize("shard", [None, (2, 1)], ids=["whole", "2-1"])
def test_short_samples_equal_the_cpu_kernel_to_the_bit(max_ids: int, shard) -> None:
    """Up to three ids per sample (most of DCNv2's features): the forward pools runs of up to 32
    such samples per warp and the gradient streams spans of the sorted ids, both in the CPU's order,
    over many runs and spans and a hot id of several hundred occurrences."""
    x = _inputs(11, (4, 32, 128, 130), batch=4096, id_dtype=np.int64, shard=shard, max_ids=max_ids)
    for weighted in (False, True):
        _assert_same_on_both(x, ["sum", "mean", "sqrtn", "sum"], weighted, shard)


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_many_tables_of_mixed_combiners_and_id_dtypes(weighted: bool) -> None:
    rng = np.random.default_rng(1)
    dims = tuple(int(d) for d in rng.choice([1, 2, 3, 8, 16, 33, 64, 128, 257], 40))
    x = _inputs(1, dims, batch=150, id_dtype=np.int64, shard=None, max_ids=12)
    x["ids"] = [ids.astype(np.int32) if t % 2 else ids for t, ids in enumerate(x["ids"])]
    _assert_same_on_both(x, [COMBINERS[t % 3] for t in range(len(dims))], weighted)


@pytest.mark.parametrize("batch,max_ids", [(0, 5), (1, 0), (200, 0)], ids=["batch-0", "one-empty", "all-empty"])
def test_empty_batches_and_samples(batch: int, max_ids: int) -> None:
    for weighted in (False, True):
        x = _inputs(2, (1, 4), batch=batch, id_dtype=np.int64, shard=None, max_ids=max_ids)
        _assert_same_on_both(x, ["mean", "sqrtn"], weighted)
        _assert_same_on_both(x, ["sum", "sum"], weighted, shard=(2, 1))


def test_zero_divisors_give_zeros_as_on_the_cpu() -> None:
    """Weights summing to 0 (mean) and all-zero weights (sqrtn): zeros and no gradient."""
    x = {
        "params": [np.arange(36, dtype=np.float32).reshape(9, 4)] * 2,
        "ids": [np.array([1, 2, 3, 3, 4, 5, 6], np.int64)] * 2,
        "splits": [np.array([0, 2, 2, 4, 7], np.int64)] * 2,
        "weights": [np.float32([1, -1, 0, 0, 0.5, -0.25, -0.25])] * 2,
        "grads": [np.random.default_rng(3).standard_normal((4, 4)).astype(np.float32)] * 2,
    }
    _assert_same_on_both(x, ["mean", "sqrtn"], weighted=True)


def test_a_large_call() -> None:
    """Enough ids for multi-block sorts and scans: about 120k per table, a batch of 8192."""
    x = _inputs(4, (64, 7), batch=8192, id_dtype=np.int64, shard=None, max_ids=40)
    _assert_same_on_both(x, ["sum", "mean"], weighted=False)
    _assert_same_on_both(x, ["sqrtn", "sum"], weighted=True, shard=(3, 1))


def test_padded_gradient_of_ids_that_fail_the_checks_is_all_padding() -> None:
    """padded reads no check back: a table whose ids are outside its rows (the forward op of the same
    ids raised) gets index -1 only, the other tables their gradient."""
    x = _inputs(6, (4, 3), batch=20, id_dtype=np.int64, shard=None, max_ids=5)
    good_rows, good_ids = _gradient(GPU, x, ["sum", "sum"], weighted=False)
    x["ids"][0] = x["ids"][0].copy()
    x["ids"][0][-1] = x["params"][0].shape[0]
    rows, ids = _gradient(GPU, x, ["sum", "sum"], weighted=False, padded=True)
    np.testing.assert_array_equal(ids[0].numpy(), np.full(x["ids"][0].size, -1))
    assert rows[0].shape == (x["ids"][0].size, 4)
    distinct = good_ids[1].shape[0]
    np.testing.assert_array_equal(ids[1].numpy()[:distinct], good_ids[1].numpy())
    np.testing.assert_array_equal(rows[1].numpy()[:distinct], good_rows[1].numpy())


def _error_text(op, *args: Any) -> str:
    """The InvalidArgumentError message of op(*args), without TensorFlow's op and device decorations."""
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        op(*args)
    message = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", error.value.message)
    return re.sub(r"\s*\[Op:\w+\].*$", "", message, flags=re.S).strip()


def _bad_inputs(case: str) -> tuple[dict, Any]:
    x = _inputs(5, (3, 2), batch=6, id_dtype=np.int64, shard=None, max_ids=4)
    x["splits"] = [s.copy() for s in x["splits"]]
    x["ids"] = [i.copy() for i in x["ids"]]
    shard = None
    if case == "id-too-large":
        x["ids"][1][-1] = x["params"][1].shape[0]
    elif case == "negative-id-int32":
        x["ids"][0] = x["ids"][0].astype(np.int32)
        x["ids"][0][0] = -4
    elif case == "sharded-id-outside":  # held by the shard (odd) but past its rows; even ids are skipped
        shard = (2, 1)
        x["ids"][0][:] = 2 * x["params"][0].shape[0] + 1
        x["ids"][1][:] = 10**9
    elif case == "splits-start":
        x["splits"][1][0] = 1
    elif case == "splits-end":
        x["splits"][0][-1] += 1
    elif case == "splits-decrease":
        x["splits"][1][3] = x["splits"][1][4] + 1
    elif case == "splits-after-weights":  # table 0's row_splits fail before table 1's weights
        x["splits"][0][-1] += 1
        x["weights"][1] = x["weights"][1][:-1]
    return x, shard


BAD_CASES = [
    "id-too-large",
    "negative-id-int32",
    "sharded-id-outside",
    "splits-start",
    "splits-end",
    "splits-decrease",
    "splits-after-weights",
]


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_inputs_fail_with_the_cpu_kernels_messages(case: str) -> None:
    x, shard = _bad_inputs(case)
    assert all(len(i) for i in x["ids"]), "the case needs ids in every table"
    combiners = ["mean", "sum"]
    for op in (_forward, _gradient):
        cpu = _error_text(op, CPU, x, combiners, True, shard)
        gpu = _error_text(op, GPU, x, combiners, True, shard)
        assert gpu == cpu
    # The device is still usable after an error.
    good = _inputs(6, (2,), batch=3, id_dtype=np.int64, shard=None)
    _assert_same_on_both(good, ["sum"], weighted=False)


def test_gradient_through_the_tape_on_the_gpu() -> None:
    """pooled_lookup on tables on the GPU: forward and gradient ops run there, and equal the CPU's."""
    x = _inputs(7, (5, 130), batch=64, id_dtype=np.int64, shard=None)
    results = {}
    for device in (CPU, GPU):
        with tf.device(device):
            tables = [tf.Variable(p) for p in x["params"]]
        ids = [tf.RaggedTensor.from_row_splits(i, s) for i, s in zip(x["ids"], x["splits"])]
        weights = [tf.RaggedTensor.from_row_splits(w, s) for w, s in zip(x["weights"], x["splits"])]
        with tf.GradientTape() as tape:
            outputs = pooled_lookup.pooled_lookup(tables, ids, weights, ["mean", "sqrtn"], [0, 1])
            loss = tf.add_n([tf.reduce_sum(o * g) for o, g in zip(outputs, x["grads"])])
        grads = tape.gradient(loss, tables)
        assert all(device[1:4] in o.device for o in outputs), [o.device for o in outputs]
        assert all(device[1:4] in g.values.device for g in grads), [g.values.device for g in grads]
        results[device] = (outputs, grads)
    for a, b in zip(results[CPU][0], results[GPU][0]):
        np.testing.assert_array_equal(b.numpy(), a.numpy())
    for a, b in zip(results[CPU][1], results[GPU][1]):  # the data has hot ids
        np.testing.assert_array_equal(b.indices.numpy(), a.indices.numpy())
        _assert_close(a.values.numpy(), b.values.numpy())


@pytest.mark.parametrize("combiner", COMBINERS)
def test_lookup_sparse_of_gpu_tables_equals_tensorflow(combiner: str) -> None:
    rng = np.random.default_rng(8)
    shapes = [(300, 16), (20, 3), (1000, 128)]
    with tf.device(GPU):
        tables = [sok.Variable(rng.random(s, dtype=np.float32) - 0.5, dtype=tf.float32) for s in shapes]
    assert fused_tables(tables, ["distributed"] * 3) == [0, 1, 2]
    lengths = [rng.integers(1, 9, 32) for _ in shapes]  # no empty sample: TF's ragged path drops trailing ones
    ids = [tf.RaggedTensor.from_row_lengths(rng.integers(0, rows, n.sum()), n) for (rows, _), n in zip(shapes, lengths)]
    weights = [tf.RaggedTensor.from_row_lengths(rng.uniform(0.1, 2, n.sum()).astype(np.float32), n) for n in lengths]
    cotangents = [rng.random((32, dim), dtype=np.float32) for _, dim in shapes]
    with tf.GradientTape() as tape:
        embeddings = sok.lookup_sparse(tables, ids, weights, combiners=[combiner] * 3)
        loss = tf.add_n([tf.reduce_sum(e * c) for e, c in zip(embeddings, cotangents)])
    grads = tape.gradient(loss, tables)
    for t, table in enumerate(tables):
        assert "GPU" in embeddings[t].device, embeddings[t].device
        full = tf.constant(table.numpy())
        with tf.GradientTape() as reference_tape:
            reference_tape.watch(full)
            expected = tf.nn.embedding_lookup_sparse(full, ids[t], weights[t], combiner=combiner)
            reference_loss = tf.reduce_sum(expected * cotangents[t])
        np.testing.assert_allclose(embeddings[t].numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(
            tf.convert_to_tensor(grads[t]).numpy(),
            tf.convert_to_tensor(reference_tape.gradient(reference_loss, full)).numpy(),
            rtol=1e-5,
            atol=1e-6,
        )


def test_host_tables_are_fused_before_gpu_tables_and_stay_on_the_host() -> None:
    with tf.device(CPU):
        host = sok.Variable(np.ones((10, 2), np.float32), dtype=tf.float32)
    with tf.device(GPU):
        device = sok.Variable(np.ones((10, 2), np.float32), dtype=tf.float32)
    assert fused_tables([device, host, device], ["distributed"] * 3) == [1]
    assert fused_tables([device, host], ["dynamic", "distributed"]) == [1]
    ids = tf.ragged.constant([[1, 2], [3]], dtype=tf.int64)
    host_out, device_out = sok.lookup_sparse([host, device], [ids, ids], combiners=["sum", "sum"])
    assert "CPU" in host_out.device, host_out.device
    np.testing.assert_array_equal(device_out.numpy(), host_out.numpy())


@pytest.mark.parametrize("row_dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("shard", [None, (2, 1)], ids=["whole", "2-1"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_half_rows_equal_the_cpu_kernel_and_the_widened_rows_to_the_bit(row_dtype: str, shard, weighted: bool) -> None:
    """float16 / bfloat16 params (every dim of DIMS: 4 columns per load where the dim allows, one
    otherwise) read widened to float32: the GPU equals the CPU kernel, and both equal float32
    params of the same values."""
    x = _inputs(11, DIMS, batch=211, id_dtype=np.int64, shard=shard)
    combiners = ["sum", "mean", "sqrtn", "mean"]
    cpu = _forward(CPU, x, combiners, weighted, shard, row_dtype)
    gpu = _forward(GPU, x, combiners, weighted, shard, row_dtype)
    widened = dict(x, params=[tf.cast(tf.cast(p, row_dtype), tf.float32).numpy() for p in x["params"]])
    full = _forward(GPU, widened, combiners, weighted, shard)
    for t, (a, b, c) in enumerate(zip(cpu, gpu, full)):
        assert "GPU" in b.device and b.dtype == tf.float32, (b.device, b.dtype)
        np.testing.assert_array_equal(b.numpy(), a.numpy(), err_msg=f"table {t}: GPU against CPU")
        np.testing.assert_array_equal(b.numpy(), c.numpy(), err_msg=f"table {t}: half against widened rows")


#: A unit in the last place of each row dtype, relative.
ULP = {"float32": 2.0**-22, "float16": 2.0**-10, "bfloat16": 2.0**-7}


@pytest.mark.parametrize("row_dtype", ["float32", "float16", "bfloat16"])
def test_row_wise_step_on_the_gpu_equals_the_cpu(row_dtype: str) -> None:
    """sok.RowWiseAdagrad's fused step (SokSparseApplyAdagradTables, row_wise) on tables of each row
    dtype: float32 accumulators, the row in float32 and stored rounded; the GPU's squares are summed
    in another order than the CPU's (equal within rounding, then rounded to the row dtype alike but
    where a sum lands on a rounding boundary), padding rows (-1) skipped, other rows untouched."""
    rng = np.random.default_rng(12)
    values = rng.standard_normal((300, 128)).astype(np.float32)
    grads = rng.standard_normal((50, 128)).astype(np.float32)
    indices = np.concatenate([rng.permutation(300)[:40], -np.ones(10, np.int64)]).astype(np.int64)
    results = {}
    for device in (CPU, GPU):
        with tf.device(device):
            table = tf.Variable(tf.cast(values, row_dtype))
            accumulator = tf.Variable(np.full((300, 1), 0.1, np.float32))
            tf_ops.library().sok_sparse_apply_adagrad_tables(
                tables=[table.handle],
                accumulators=[accumulator.handle],
                learning_rate=tf.constant(0.05),
                indices=[tf.constant(indices)],
                grads=[tf.constant(grads)],
                epsilon=1e-7,
                check_indices=False,
                row_wise=True,
                names=["t"],
            )
        results[device] = (tf.cast(table, tf.float32).numpy(), accumulator.numpy())
    (w_cpu, a_cpu), (w_gpu, a_gpu) = results[CPU], results[GPU]
    np.testing.assert_allclose(a_gpu, a_cpu, rtol=1e-6)
    ulp = np.abs(w_cpu) * ULP[row_dtype] + 1e-6
    assert (np.abs(w_gpu - w_cpu) <= ulp).all()
    untouched = np.setdiff1d(np.arange(300), indices)
    np.testing.assert_array_equal(w_gpu[untouched], tf.cast(tf.cast(values, row_dtype), tf.float32).numpy()[untouched])


def test_lookup_sparse_and_row_wise_training_of_a_bfloat16_gpu_table() -> None:
    """The user's path on the GPU: sok.Variable(dtype=tf.bfloat16), sok.lookup_sparse and
    sok.RowWiseAdagrad in a tf.function: the lookup equals the float32 table of the same values,
    the step runs on the GPU in one fused op and moves the table."""
    rng = np.random.default_rng(13)
    with tf.device(GPU):
        table = sok.Variable(rng.standard_normal((1000, 64)).astype(np.float32), dtype=tf.bfloat16)
        widened = sok.Variable(tf.cast(table, tf.float32))
    ids = tf.RaggedTensor.from_row_lengths(rng.integers(0, 1000, 400), np.full(100, 4))
    np.testing.assert_array_equal(
        sok.lookup_sparse(table, ids, combiners="sum").numpy(), sok.lookup_sparse(widened, ids, combiners="sum").numpy()
    )
    optimizer = sok.OptimizerWrapper(sok.RowWiseAdagrad(learning_rate=0.05))

    @tf.function
    def step() -> None:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(sok.lookup_sparse(table, ids, combiners="sum") ** 2)
        optimizer.apply_gradients(zip(tape.gradient(loss, [table]), [table]))

    before = tf.cast(table, tf.float32).numpy()
    step()
    graph = step.get_concrete_function().graph
    graphs = [graph] + [f.graph for f in graph._functions.values()]
    assert "SokSparseApplyAdagradTables" in {op.type for g in graphs for op in g.get_operations()}
    after = tf.cast(table, tf.float32).numpy()
    assert table.dtype == tf.bfloat16 and "GPU" in table.device
    assert not np.array_equal(after, before) and np.isfinite(after).all()
    assert optimizer.static_slots(table)["accumulator"].dtype == "float32"
