"""8 threads looking up one model at once get the right rows: through one tf.function and eagerly,
with a small cache (every batch misses, fills and evicts while the others read) and with the cache
alone."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
sys.path.insert(0, str(Path(__file__).parent))
import hierarchical_parameter_server as hps  # noqa: E402
import serve_support as support  # noqa: E402

ROWS, EXTRA, DIM, THREADS, STEPS = 5000, 100, 8, 8, 12


@pytest.mark.parametrize(
    ("overrides", "top"),
    [
        ({"gpucacheper": 0.02}, {"volatile_db": {"type": "parallel_hash_map", "num_partitions": 4}}),
        ({"gpucacheper": 1.0}, support.DISABLED_DBS),
    ],
    ids=["small-cache+hash_map", "cache-only"],
)
@pytest.mark.parametrize("graph", [True, False], ids=["tf.function", "eager"])
def test_eight_threads_get_right_rows(tmp_path, overrides, top, graph, run_in_threads):
    folder0, w0 = support.write_table(tmp_path / "t0", ROWS, DIM, seed=5)
    folder1, w1 = support.write_table(tmp_path / "t1", ROWS, DIM * 2, seed=6)
    entry = support.model_entry("m", [folder0, folder1], [DIM, DIM * 2], **overrides)
    path = support.write_config(tmp_path / "ps.json", support.ps_config([entry], **top))
    oracles = [support.oracle(w0, 0.5, EXTRA), support.oracle(w1, 0.5, EXTRA)]
    with support.served(path):
        layers = [
            hps.LookupLayer(model_name="m", table_id=t, emb_vec_size=DIM * (t + 1), emb_vec_dtype=tf.float32)
            for t in (0, 1)
        ]
        steps = [tf.function(layer) if graph else layer for layer in layers]

        def worker(seed):
            rng = np.random.default_rng(seed)
            for _ in range(STEPS):
                table = int(rng.integers(0, 2))
                ids = tf.constant(rng.integers(0, ROWS + EXTRA, size=(64, 5)), tf.int64)
                got = steps[table](ids).numpy()
                np.testing.assert_array_equal(got, oracles[table][ids.numpy()])

        run_in_threads(THREADS, worker)
