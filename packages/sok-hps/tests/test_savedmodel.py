"""A Keras 3 model with HPS layers saves (``model.save("m.keras")``) and, loaded in a fresh process
that never calls hps.Init (the layers initialise HPS from their ps_config_file), serves the same
numbers."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
sys.path.insert(0, str(Path(__file__).parent))
import hierarchical_parameter_server as hps  # noqa: E402
import serve_support as support  # noqa: E402
from hierarchical_parameter_server import init  # noqa: E402

DIM0, DIM1, ROWS = 8, 4, 500

LOAD = textwrap.dedent(
    """
    import sys
    import numpy as np
    import keras
    import tensorflow as tf
    import hierarchical_parameter_server  # registers the layers with Keras
    from hierarchical_parameter_server import init

    model = keras.models.load_model(sys.argv[1])
    batch = np.load(sys.argv[2])
    sp_ids = tf.SparseTensor(batch["indices"], batch["values"], batch["dense_shape"])
    np.save(sys.argv[3], model([tf.constant(batch["ids"]), sp_ids]).numpy())
    assert init.is_initialized()
    """
)


def test_keras_model_saves_and_serves_in_a_fresh_process(tmp_path):
    folder0, w0 = support.write_table(tmp_path / "t0", ROWS, DIM0, seed=1)
    folder1, w1 = support.write_table(tmp_path / "t1", ROWS, DIM1, seed=2)
    entry = support.model_entry("dlrm", [folder0, folder1], [DIM0, DIM1])
    path = support.write_config(tmp_path / "ps.json", support.ps_config([entry], **support.DISABLED_DBS))
    init.shutdown()
    try:
        ids_in = keras.Input(shape=(3,), dtype="int64")
        sp_in = keras.Input(shape=(None,), sparse=True, dtype="int64")
        common = {"emb_vec_dtype": tf.float32, "ps_config_file": path, "global_batch_size": 64}
        emb0 = hps.LookupLayer(model_name="dlrm", table_id=0, emb_vec_size=DIM0, **common)(ids_in)
        pooled = hps.SparseLookupLayer(model_name="dlrm", table_id=1, emb_vec_size=DIM1, **common)(
            sp_in, None, combiner="mean"
        )
        x = keras.layers.Concatenate()([keras.layers.Flatten()(emb0), pooled])
        out = keras.layers.Dense(1, kernel_initializer=keras.initializers.RandomNormal(seed=3))(x)
        model = keras.Model([ids_in, sp_in], out)
        rng = np.random.default_rng(0)
        ids = rng.integers(0, ROWS + 10, size=(64, 3)).astype(np.int64)
        sp_ids = tf.sparse.from_dense(
            tf.constant(rng.integers(0, 2, size=(64, 5)) * rng.integers(1, ROWS + 10, size=(64, 5)))
        )
        served = model([tf.constant(ids), sp_ids]).numpy()
        kernel, bias = model.layers[-1].get_weights()
        oracle0 = support.oracle(w0, 0.5, 10)[ids].reshape(64, -1)
        oracle1 = tf.nn.embedding_lookup_sparse(support.oracle(w1, 0.5, 10), sp_ids, None, combiner="mean").numpy()
        want = np.concatenate([oracle0, oracle1], axis=1) @ kernel + bias
        np.testing.assert_allclose(served, want, rtol=1e-5, atol=1e-6)
        model.save(tmp_path / "m.keras")
    finally:
        init.shutdown()
    np.savez(
        tmp_path / "batch.npz",
        ids=ids,
        indices=sp_ids.indices.numpy(),
        values=sp_ids.values.numpy(),
        dense_shape=sp_ids.dense_shape.numpy(),
    )
    run = subprocess.run(
        [sys.executable, "-c", LOAD, str(tmp_path / "m.keras"), str(tmp_path / "batch.npz"), str(tmp_path / "out.npy")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), served)
