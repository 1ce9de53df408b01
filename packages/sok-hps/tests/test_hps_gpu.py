"""HPS under a CUDA TensorFlow: the caches live on the GPU and the layers' outputs equal
tf.nn.embedding_lookup(_sparse) on a GPU-resident copy of the table, bit for bit, with the cache
alone and with a 1% cache in front of the hash map.

Skipped without a GPU visible to a CUDA TensorFlow and sok-core's GPU kernels (the lead runs them
on the GPU host: ci/gpu_test.sh --tf, or pytest -m gpu there).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
from sparse_operation_kit.testing.device import skip_unless_gpu_tensorflow  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import hierarchical_parameter_server as hps  # noqa: E402
import serve_support as support  # noqa: E402

pytestmark = pytest.mark.gpu

ROWS, EXTRA, DIM = 20000, 100, 32


@pytest.fixture(autouse=True)
def gpu_tensorflow() -> None:
    skip_unless_gpu_tensorflow()


@pytest.fixture(params=["cache-only", "small-cache+hash_map"])
def served_table(request, tmp_path):
    folder, weights = support.write_table(tmp_path / "t0", ROWS, DIM, seed=9)
    if request.param == "cache-only":
        entry, top = support.model_entry("g", [folder], [DIM]), support.DISABLED_DBS
    else:
        entry = support.model_entry("g", [folder], [DIM], gpucacheper=0.01)
        top = {"volatile_db": {"type": "hash_map"}}
    path = support.write_config(tmp_path / "ps.json", support.ps_config([entry], **top))
    with support.served(path) as server:
        with tf.device("/GPU:0"):
            oracle = tf.constant(support.oracle(weights, 0.5, EXTRA))
        yield server, oracle


def test_the_cache_lives_on_the_gpu(served_table):
    server, _ = served_table
    assert "GPU" in server.table("g", 0).cache.variable.table_device.upper()


@pytest.mark.parametrize("max_norm", [None, 0.5])
def test_lookup_layer_on_the_gpu_equals_embedding_lookup(served_table, max_norm):
    _, oracle = served_table
    layer = hps.LookupLayer(model_name="g", table_id=0, emb_vec_size=DIM, emb_vec_dtype=tf.float32)
    step = tf.function(lambda ids: layer(ids, max_norm=max_norm))
    rng = np.random.default_rng(0)
    for _ in range(4):
        with tf.device("/GPU:0"):
            ids = tf.constant(rng.integers(0, ROWS + EXTRA, size=(512, 26)), tf.int64)
            want = tf.nn.embedding_lookup(oracle, ids, max_norm=max_norm)
            got = step(ids)
        assert "GPU" in got.device.upper()
        np.testing.assert_array_equal(got.numpy(), want.numpy())


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_sparse_lookup_layer_on_the_gpu_equals_embedding_lookup_sparse(served_table, combiner):
    _, oracle = served_table
    layer = hps.SparseLookupLayer(model_name="g", table_id=0, emb_vec_size=DIM, emb_vec_dtype=tf.float32)
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 8, size=256)
    with tf.device("/GPU:0"):
        ids = tf.RaggedTensor.from_row_lengths(
            tf.constant(rng.integers(0, ROWS + EXTRA, size=lengths.sum()), tf.int64), lengths
        )
        weights = tf.RaggedTensor.from_row_lengths(tf.constant(rng.random(lengths.sum()), tf.float32), lengths)
        step = tf.function(lambda i, w: layer(i, w, combiner=combiner))
        oracle_step = tf.function(lambda i, w: tf.nn.embedding_lookup_sparse(oracle, i, w, combiner=combiner))
        np.testing.assert_array_equal(step(ids, weights).numpy(), oracle_step(ids, weights).numpy())
