"""A model with HPS layers saves and, loaded in a fresh process that never calls hps.Init, serves
the same numbers:

* a Keras 3 model file (``model.save("m.keras")``): the layers initialise HPS from their
  ps_config_file;
* a TensorFlow SavedModel (``model.export``, ``tf.saved_model.save``) over every kind of tier
  chain: the lookup graph names its tables and fetches by function (``SokResolveTable``,
  ``SokPyCall``), and its first lookup initialises HPS from the ps_config file it recorded.

A graph traced before ``init.shutdown()`` serves the server started after it, and a lookup graph
with nothing to initialise HPS from says to call hps.Init. A graph traced for a table of one width
(or key dtype), served after the ps_config changed it, fails with an error saying to re-export
(in a fresh process and in-process, whichever way it was saved). A SavedModel naming a function
HPS did not register (``builtins:exec``) is refused where HPS serves, the function never run.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
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
from hierarchical_parameter_server import graph_calls, init  # noqa: E402
from sparse_operation_kit import python_ops, tf_ops  # noqa: E402

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


def save_batch(path, ids, sp_ids=None):
    """The batch a fresh process serves: dense ``ids`` and, if given, the SparseTensor's parts."""
    parts = {}
    if sp_ids is not None:
        parts = {
            "indices": sp_ids.indices.numpy(),
            "values": sp_ids.values.numpy(),
            "dense_shape": sp_ids.dense_shape.numpy(),
        }
    np.savez(path, ids=ids, **parts)


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
    save_batch(tmp_path / "batch.npz", ids, sp_ids)
    run = subprocess.run(
        [sys.executable, "-c", LOAD, str(tmp_path / "m.keras"), str(tmp_path / "batch.npz"), str(tmp_path / "out.npy")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), served)


SERVE = textwrap.dedent(
    """
    import sys
    import numpy as np
    import tensorflow as tf
    import hierarchical_parameter_server  # loads the ops the SavedModel names
    from hierarchical_parameter_server import init

    served = tf.saved_model.load(sys.argv[1])
    batch = np.load(sys.argv[2])
    args = [tf.constant(batch["ids"])]
    if "values" in batch:
        args.append(tf.SparseTensor(batch["indices"], batch["values"], batch["dense_shape"]))
    endpoint = served.serve if hasattr(served, "serve") else served.lookup
    outputs = [endpoint(*args).numpy() for _ in range(2)]  # the second call: the tables resolved
    np.testing.assert_array_equal(outputs[0], outputs[1])
    np.save(sys.argv[3], outputs[0])
    assert init.is_initialized()
    """
)


def _hps_imported_first(then: str) -> str:
    """SERVE with HPS imported first, then ``then`` (NVIDIA's notebooks: ``import tensorflow``; a
    Keras user: ``import keras``, whose import imports TensorFlow halfway through its own)."""
    return SERVE.replace(
        "import tensorflow as tf\nimport hierarchical_parameter_server  # loads the ops the SavedModel names\n",
        f"import hierarchical_parameter_server\n{then}\nimport tensorflow as tf  # HPS has loaded its ops\n",
    )


SERVE_HPS_FIRST = _hps_imported_first("")
SERVE_HPS_THEN_KERAS = _hps_imported_first("import keras")
SERVE_HPS_THEN_TF_KERAS = _hps_imported_first("import tf_keras")
#: A module of the package first, one that imports TensorFlow in its midst (the layers import it).
SERVE_HPS_MODULE_FIRST = SERVE.replace(
    "import tensorflow as tf\nimport hierarchical_parameter_server  # loads the ops the SavedModel names\n",
    "import hierarchical_parameter_server.tiers.hash_map\nimport tensorflow as tf  # HPS has loaded its ops\n",
)


def _serve_in_a_fresh_process(saved, batch_file, out, script=SERVE):
    """Runs ``script`` in a fresh process; tf_keras' import order runs under TF_USE_LEGACY_KERAS=1
    (tf.keras is then the tf_keras being imported)."""
    legacy = {"TF_USE_LEGACY_KERAS": "1"} if script is SERVE_HPS_THEN_TF_KERAS else {}
    run = subprocess.run(
        [sys.executable, "-c", script, str(saved), str(batch_file), str(out)],
        env={**os.environ, **legacy},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return np.load(out)


@pytest.mark.parametrize(
    ("kind", "script"),
    [
        ("cache", SERVE),
        ("chain", SERVE),
        ("hash_map", SERVE),
        ("rocks_db", SERVE),
        ("cache", SERVE_HPS_FIRST),
        ("cache", SERVE_HPS_THEN_KERAS),
        ("cache", SERVE_HPS_THEN_TF_KERAS),
        ("cache", SERVE_HPS_MODULE_FIRST),
    ],
    ids=[
        "cache",
        "chain",
        "hash_map",
        "rocks_db",
        "hps-then-tensorflow",
        "hps-then-keras",
        "hps-then-tf_keras",
        "hps-module-first",
    ],
)
def test_an_exported_savedmodel_serves_in_a_fresh_process(tmp_path, kind, script):
    """model.export of a Keras model with a LookupLayer over each tier chain: the cache alone (one
    SokFindOrDefault), the evicting chain cache -> hash map -> RocksDB (misses fetched by
    SokPyCall), and gpucache off with the hash map read in the graph or RocksDB alone; and served
    by processes that import HPS before TensorFlow, itself or through Keras 3 or tf_keras."""
    if script is SERVE_HPS_THEN_TF_KERAS:
        pytest.importorskip("tf_keras", reason="the tf_keras import order needs tf_keras")
    folder, weights = support.write_table(tmp_path / "t0", ROWS, DIM0, seed=5)
    model_kw, top = support.tier_setup(kind, tmp_path)
    entry = support.model_entry("dlrm", [folder], [DIM0], **model_kw)
    path = support.write_config(tmp_path / "ps.json", support.ps_config([entry], **top))
    rng = np.random.default_rng(2)
    ids = rng.integers(0, ROWS + 10, size=(64, 3)).astype(np.int64)
    init.shutdown()
    try:
        ids_in = keras.Input(shape=(3,), dtype="int64")
        lookup = hps.LookupLayer(
            model_name="dlrm",
            table_id=0,
            emb_vec_size=DIM0,
            emb_vec_dtype=tf.float32,
            ps_config_file=path,
            global_batch_size=64,
        )
        emb = keras.layers.Flatten()(lookup(ids_in))
        dense = keras.layers.Dense(2, kernel_initializer=keras.initializers.RandomNormal(seed=3))(emb)
        model = keras.Model(ids_in, keras.layers.Concatenate()([emb, dense]))
        served = model(tf.constant(ids)).numpy()
        rows = support.oracle(weights, 0.5, 10)[ids].reshape(64, -1)
        np.testing.assert_array_equal(served[:, :-2], rows)
        kernel, bias = model.layers[-2].get_weights()
        np.testing.assert_allclose(served[:, -2:], rows @ kernel + bias, rtol=2e-3, atol=1e-4)  # TF32 on a GPU
        model.export(tmp_path / "saved", verbose=False)
    finally:
        init.shutdown()  # the fresh process opens the same RocksDB
    save_batch(tmp_path / "batch.npz", ids)
    got = _serve_in_a_fresh_process(tmp_path / "saved", tmp_path / "batch.npz", tmp_path / "out.npy", script)
    np.testing.assert_array_equal(got[:, :-2], served[:, :-2])
    np.testing.assert_allclose(got[:, -2:], served[:, -2:], rtol=1e-5, atol=1e-6)


def test_a_saved_module_with_a_sparse_lookup_serves_in_a_fresh_process(tmp_path):
    """tf.saved_model.save of a tf.Module whose function takes a SparseTensor; hps.Init explicit
    (the layers have no ps_config_file): the graph records the file Init was given."""
    folder0, w0 = support.write_table(tmp_path / "t0", ROWS, DIM0, seed=1)
    folder1, w1 = support.write_table(tmp_path / "t1", ROWS, DIM1, seed=2)
    entry = support.model_entry("dlrm", [folder0, folder1], [DIM0, DIM1])
    path = support.write_config(tmp_path / "ps.json", support.ps_config([entry], **support.DISABLED_DBS))
    rng = np.random.default_rng(0)
    ids = rng.integers(0, ROWS + 10, size=(64, 3)).astype(np.int64)
    sp_ids = tf.sparse.from_dense(
        tf.constant(rng.integers(0, 2, size=(64, 5)) * rng.integers(1, ROWS + 10, size=(64, 5)))
    )
    with support.served(path, global_batch_size=64):
        lookup = hps.LookupLayer(model_name="dlrm", table_id=0, emb_vec_size=DIM0, emb_vec_dtype=tf.float32)
        sparse = hps.SparseLookupLayer(model_name="dlrm", table_id=1, emb_vec_size=DIM1, emb_vec_dtype=tf.float32)
        module = tf.Module()
        module.lookup = tf.function(
            lambda ids, sp: tf.concat(
                [tf.reshape(lookup(ids), [-1, 3 * DIM0]), sparse(sp, None, combiner="sqrtn", max_norm=0.8)], axis=1
            ),
            input_signature=[tf.TensorSpec([None, 3], tf.int64), tf.SparseTensorSpec([None, None], tf.int64)],
        )
        served = module.lookup(tf.constant(ids), sp_ids).numpy()
        want = np.concatenate(
            [
                support.oracle(w0, 0.5, 10)[ids].reshape(64, -1),
                tf.nn.embedding_lookup_sparse(
                    support.oracle(w1, 0.5, 10), sp_ids, None, combiner="sqrtn", max_norm=0.8
                ).numpy(),
            ],
            axis=1,
        )
        np.testing.assert_allclose(served, want, rtol=1e-6, atol=1e-7)
        tf.saved_model.save(module, str(tmp_path / "saved"))
    save_batch(tmp_path / "batch.npz", ids, sp_ids)
    got = _serve_in_a_fresh_process(tmp_path / "saved", tmp_path / "batch.npz", tmp_path / "out.npy")
    np.testing.assert_array_equal(got, served)


def test_a_graph_traced_before_shutdown_serves_the_next_server(tmp_path):
    """The tables of a lookup graph are resolved by name: after shutdown and an Init with other
    model files, the same tf.function serves the new rows (no stale table, no crash)."""
    ids = tf.constant([[0, 5, ROWS + 1]], tf.int64)
    paths = []
    for i in range(2):
        folder, weights = support.write_table(tmp_path / f"t{i}", ROWS, DIM0, seed=10 + i)
        entry = support.model_entry("dlrm", [folder], [DIM0])
        paths.append(
            (
                support.write_config(tmp_path / f"ps{i}.json", support.ps_config([entry], **support.DISABLED_DBS)),
                weights,
            )
        )
    with support.served(paths[0][0]):
        lookup = hps.LookupLayer(model_name="dlrm", table_id=0, emb_vec_size=DIM0, emb_vec_dtype=tf.float32)
        step = tf.function(lambda ids: lookup(ids))
        np.testing.assert_array_equal(step(ids).numpy(), support.oracle(paths[0][1], 0.5, 10)[ids.numpy()])
    with support.served(paths[1][0]):
        np.testing.assert_array_equal(step(ids).numpy(), support.oracle(paths[1][1], 0.5, 10)[ids.numpy()])


def test_a_lookup_graph_with_nothing_to_start_hps_from_says_to_call_init():
    """A context whose server is gone and that records no ps_config file (its server was not
    started by hps.Init), in a process where HPS is not initialised: a clear error, not a crash."""
    init.shutdown()
    context = json.dumps({"server": "gone", "ps_config_file": "", "global_batch_size": 1, "model": "m", "table_id": 0})
    with pytest.raises(tf.errors.FailedPreconditionError, match="call hps.Init"):
        python_ops.py_call(graph_calls.FETCH, context, [tf.constant([1], tf.int64)], [tf.float32])
    with pytest.raises(tf.errors.FailedPreconditionError, match="call hps.Init"):
        python_ops.resolved_table_inputs(graph_calls.CACHE_TABLE, context)


# -- a table whose width changed after the graph was traced -------------------------------------
WIDE = 8  # the width the ps_config gives the table after the model was exported at DIM1


def write_model_files(tmp_path, dim, kind="cache", supportlonglong=True):
    """The ps_config ``tmp_path/ps.json`` and the table files under ``tmp_path/t0``, table 0 of
    model ``dlrm`` of width ``dim`` (overwritten by a later call): ``(ps_config path, weights)``."""
    folder, weights = support.write_table(tmp_path / "t0", ROWS, dim, seed=dim)
    model_kw, top = support.tier_setup(kind, tmp_path)
    entry = support.model_entry("dlrm", [folder], [dim], **model_kw)
    config = support.ps_config([entry], supportlonglong=supportlonglong, **top)
    return support.write_config(tmp_path / "ps.json", config), weights


def save_lookup(saved, path, how):
    """A model of a LookupLayer of width DIM1 over table 0 of ``dlrm``, served by ``path``, saved
    to ``saved`` by ``model.export`` or ``tf.saved_model.save``; HPS shut down after."""
    lookup = hps.LookupLayer(
        model_name="dlrm", table_id=0, emb_vec_size=DIM1, ps_config_file=path, global_batch_size=64
    )
    ids = tf.constant([[1, 2, ROWS + 1]], tf.int64)
    try:
        if how == "export":
            ids_in = keras.Input(shape=(3,), dtype="int64")
            model = keras.Model(ids_in, keras.layers.Flatten()(lookup(ids_in)))
            assert model(ids).shape == (1, 3 * DIM1)
            model.export(saved, verbose=False)
        else:
            module = tf.Module()
            module.lookup = tf.function(lookup, input_signature=[tf.TensorSpec([None, 3], tf.int64)])
            assert module.lookup(ids).shape == (1, 3, DIM1)
            tf.saved_model.save(module, str(saved))
    finally:
        init.shutdown()


#: What a graph of width DIM1 served a table of width WIDE fails with.
WIDTH_CHANGED = (
    rf"model 'dlrm' table 0 was traced for width {DIM1} .*the ps_config '.*ps\.json' serves it at width {WIDE}"
    r".*[Rr]e-export the model"
)


@pytest.mark.parametrize("how", ["export", "saved_model.save"])
def test_a_savedmodel_of_another_width_than_the_served_table_fails_clearly(tmp_path, how):
    """Exported at width DIM1; the ps_config and files then make the table WIDE: the SavedModel
    fails (no first DIM1 columns of WIDE) in a fresh process and in-process after shutdown + Init."""
    path, _ = write_model_files(tmp_path, DIM1)
    save_lookup(tmp_path / "saved", path, how)
    write_model_files(tmp_path, WIDE)
    save_batch(tmp_path / "batch.npz", np.array([[1, 2, ROWS + 1]], np.int64))
    run = subprocess.run(
        [sys.executable, "-c", SERVE, str(tmp_path / "saved"), str(tmp_path / "batch.npz"), str(tmp_path / "out.npy")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode != 0, "served a table of another width"
    assert "InvalidArgumentError" in run.stderr, run.stderr[-3000:]
    assert re.search(WIDTH_CHANGED, run.stderr), run.stderr[-3000:]
    with support.served(path):
        served = tf.saved_model.load(str(tmp_path / "saved"))
        endpoint = served.serve if how == "export" else served.lookup
        with pytest.raises(tf.errors.InvalidArgumentError, match=WIDTH_CHANGED):
            endpoint(tf.constant([[1, 2, ROWS + 1]], tf.int64))


@pytest.mark.parametrize("kind", ["cache", "hash_map", "evicting_hash_map"])
def test_a_graph_traced_before_the_table_changed_width_fails_clearly(tmp_path, kind):
    """The same tf.function after shutdown and an Init whose table is WIDE, over each way a graph
    reaches its table: the cache (SokResolveTable), the hash map read in the graph
    (SokResolveTable), the databases (SokPyCall)."""
    ids = tf.constant([[0, 5, ROWS + 1]], tf.int64)
    path, weights = write_model_files(tmp_path, DIM1, kind)
    with support.served(path):
        lookup = hps.LookupLayer(model_name="dlrm", table_id=0, emb_vec_size=DIM1)
        step = tf.function(lambda ids: lookup(ids))
        np.testing.assert_array_equal(step(ids).numpy(), support.oracle(weights, 0.5, 10)[ids.numpy()])
    write_model_files(tmp_path, WIDE, kind)
    with support.served(path), pytest.raises(tf.errors.InvalidArgumentError, match=WIDTH_CHANGED):
        step(ids)


def test_a_graph_traced_before_the_key_dtype_changed_fails_clearly(tmp_path):
    """Traced with int64 keys (supportlonglong true); the ps_config then says int32 keys."""
    ids = tf.constant([[0, 5, ROWS + 1]], tf.int64)
    path, _ = write_model_files(tmp_path, DIM1)
    with support.served(path):
        lookup = hps.LookupLayer(model_name="dlrm", table_id=0, emb_vec_size=DIM1)
        step = tf.function(lambda ids: lookup(ids))
        step(ids)
    write_model_files(tmp_path, DIM1, supportlonglong=False)
    key_dtype_changed = (
        rf"table 0 was traced for width {DIM1} and keys of int64, .*at width {DIM1} with keys of int32.*Re-export"
    )
    with support.served(path), pytest.raises(tf.errors.InvalidArgumentError, match=key_dtype_changed):
        step(ids)


def test_a_context_saved_before_widths_were_recorded_still_serves(tmp_path):
    """Graphs saved before contexts recorded the traced width name only the server, model and
    table: they still resolve their table (no check is possible)."""
    path, _ = write_model_files(tmp_path, DIM1)
    with support.served(path) as server:
        served = server.table("dlrm", 0)
        old = {k: v for k, v in json.loads(served.context).items() if k not in ("dim", "key_dtype")}
        assert graph_calls.served_table(json.dumps(old)) is served


# -- a graph naming a function HPS did not register --------------------------------------------
SERVE_ANY_CODE = textwrap.dedent(
    """
    import sys
    import tensorflow as tf
    import hierarchical_parameter_server  # loads the ops and registers the functions HPS's graphs name
    loaded = tf.saved_model.load(sys.argv[1])
    for endpoint in ("exec", "system", "resolve"):
        try:
            getattr(loaded, endpoint)()
            print(endpoint, "ran")
        except tf.errors.InvalidArgumentError as error:
            print(endpoint, "refused:", " ".join(error.message.split()))
    """
)


def test_a_savedmodel_naming_an_unregistered_function_is_refused_where_hps_serves(tmp_path):
    """A SavedModel made with the raw ops (no check where the graph is made), naming
    ``builtins:exec`` and ``os:system`` with code that creates a file: loaded in a fresh process that
    imported hierarchical_parameter_server, every call is refused and the file never appears."""
    marker = str(tmp_path / "ran")
    code = f"open({marker!r}, 'w').close()"
    raw = tf_ops.python_library()
    module = tf.Module()
    module.exec = tf.function(
        lambda: raw.sok_py_call(args=[], Tout=[tf.int32], function="builtins:exec", context=code), input_signature=[]
    )
    module.system = tf.function(
        lambda: raw.sok_py_call(args=[], Tout=[tf.int32], function="os:system", context=f"touch {shlex.quote(marker)}"),
        input_signature=[],
    )
    module.resolve = tf.function(
        lambda: raw.sok_resolve_table(function="builtins:exec", context=code), input_signature=[]
    )
    tf.saved_model.save(module, str(tmp_path / "saved"))
    run = subprocess.run(
        [sys.executable, "-c", SERVE_ANY_CODE, str(tmp_path / "saved")], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.strip().splitlines()[-3:]
    assert [line.split(" ", 2)[:2] for line in lines] == [[e, "refused:"] for e in ("exec", "system", "resolve")], lines
    assert all("is not registered: only functions registered with" in line for line in lines), lines
    assert not (tmp_path / "ran").exists()


# -- SavedModels of NVIDIA's plugin: its ops Init and Lookup ----------------------------------------
#: The plugin's op definitions (reference hps.md §1.5): inputs in order, then attrs and their types.
NVIDIA_OPS = {
    "Init": (
        [("global_replica_id", "int32"), ("num_replicas_in_sync", "int32"), ("visible_devices", "int32")],
        {"ps_config_file": "string", "global_batch_size": "int"},
    ),
    "Lookup": (
        [("values", "value_dtype"), ("global_replica_id", "int32"), ("init_status", "status_dtype")],
        {
            "value_dtype": "type",
            "model_name": "string",
            "table_id": "int",
            "emb_vec_size": "int",
            "dtype": "type",
            "status_dtype": "type",
        },
    ),
}


@pytest.mark.parametrize("name", sorted(NVIDIA_OPS))
def test_nvidias_ops_are_registered_with_the_plugins_signatures(name):
    from tensorflow.python.framework import op_def_registry

    graph_calls.load_ops()  # what importing the package does where TensorFlow is imported first
    op = op_def_registry.get(name)
    assert op is not None, f"{name} is not registered"
    inputs = [(a.name, a.type_attr or tf.as_dtype(a.type).name) for a in op.input_arg]
    attrs = {a.name: a.type for a in op.attr}
    assert (inputs, attrs) == NVIDIA_OPS[name]
    assert all(not a.HasField("default_value") for a in op.attr)  # a stripped NodeDef loses nothing


@pytest.mark.parametrize("script", [SERVE, SERVE_HPS_FIRST], ids=["tensorflow-first", "hps-imported-first"])
def test_a_savedmodel_of_nvidias_ops_serves_in_a_fresh_process(tmp_path, script):
    """A SavedModel whose graph holds the plugin's Init and Lookup, as one exported with it does:
    loaded in a fresh process (which imports HPS after TensorFlow, or before it as NVIDIA's
    notebooks do), Init starts HPS from its ps_config_file and Lookup serves the rows (the default
    value for keys no tier has)."""
    folder, weights = support.write_table(tmp_path / "t0", ROWS, DIM0, seed=8)
    path = support.write_config(
        tmp_path / "ps.json", support.ps_config([support.model_entry("dlrm", [folder], [DIM0])], **support.DISABLED_DBS)
    )
    lib = graph_calls.compat_library()

    def lookup(ids):
        status = lib.init(
            global_replica_id=0, num_replicas_in_sync=1, visible_devices=[0], ps_config_file=path, global_batch_size=64
        )
        return lib.lookup(
            values=ids,
            global_replica_id=0,
            init_status=status,
            model_name="dlrm",
            table_id=0,
            emb_vec_size=DIM0,
            dtype=tf.float32,
        )

    module = tf.Module()
    module.lookup = tf.function(lookup, input_signature=[tf.TensorSpec([None, 3], tf.int64)])
    tf.saved_model.save(module, str(tmp_path / "saved"))
    ids = np.random.default_rng(3).integers(0, ROWS + 10, size=(16, 3)).astype(np.int64)
    save_batch(tmp_path / "batch.npz", ids)
    got = _serve_in_a_fresh_process(tmp_path / "saved", tmp_path / "batch.npz", tmp_path / "out.npy", script)
    np.testing.assert_array_equal(got, support.oracle(weights, 0.5, 10)[ids])


def test_nvidias_lookup_checks_its_init_status_and_its_width(tmp_path):
    folder, _ = support.write_table(tmp_path / "t0", ROWS, DIM0, seed=8)
    path = support.write_config(
        tmp_path / "ps.json", support.ps_config([support.model_entry("dlrm", [folder], [DIM0])], **support.DISABLED_DBS)
    )
    lib = graph_calls.compat_library()
    ids = tf.constant([[1, 2]], tf.int64)
    common = {"global_replica_id": 0, "model_name": "dlrm", "table_id": 0, "dtype": tf.float32}
    with pytest.raises(tf.errors.FailedPreconditionError, match="not initialized"):
        lib.lookup(values=ids, init_status="", emb_vec_size=DIM0, **common)
    with support.served(path):
        wrong_width = r"emb_vec_size 3 of Lookup \(NVIDIA HPS\) is not the width of table 0"
        with pytest.raises(tf.errors.InvalidArgumentError, match=wrong_width):
            lib.lookup(values=ids, init_status="OK", emb_vec_size=3, **common)
        rows = lib.lookup(values=ids, init_status="OK", emb_vec_size=DIM0, **common)
        assert rows.shape == (1, 2, DIM0)


# -- NVIDIA's flow: the model is built and saved before its ps_config exists ------------------------
def test_a_model_saved_before_its_config_exists_serves_once_it_does(tmp_path):
    """The layer's ps_config_file is written only after the model is exported (NVIDIA's notebooks
    and its Triton flow): tracing and exporting need no config; the first lookup starts HPS from the
    file, in this process and in a fresh one."""
    path = str(tmp_path / "later" / "ps.json")
    init.shutdown()
    ids_in = keras.Input(shape=(3,), dtype="int64")
    common = {"emb_vec_dtype": tf.float32, "ps_config_file": path, "global_batch_size": 64}
    emb = hps.LookupLayer(model_name="dlrm", table_id=0, emb_vec_size=DIM0, **common)(ids_in)
    keras.Model(ids_in, keras.layers.Flatten()(emb)).export(tmp_path / "saved", verbose=False)
    assert not init.is_initialized()

    folder, weights = support.write_table(tmp_path / "t0", ROWS, DIM0, seed=1)
    os.makedirs(os.path.dirname(path))
    entry = support.model_entry("dlrm", [folder], [DIM0])
    support.write_config(path, support.ps_config([entry], **support.DISABLED_DBS))
    ids = np.random.default_rng(4).integers(0, ROWS + 10, size=(64, 3)).astype(np.int64)
    want = support.oracle(weights, 0.5, 10)[ids].reshape(64, -1)
    try:
        served = tf.saved_model.load(str(tmp_path / "saved")).serve(tf.constant(ids)).numpy()
        assert init.is_initialized()  # the first lookup started HPS from the file
        np.testing.assert_array_equal(served, want)
    finally:
        init.shutdown()
    save_batch(tmp_path / "batch.npz", ids)
    got = _serve_in_a_fresh_process(tmp_path / "saved", tmp_path / "batch.npz", tmp_path / "out.npy")
    np.testing.assert_array_equal(got, want)


def test_a_model_traced_where_its_config_cannot_serve_yet_serves_once_it_can(tmp_path, caplog):
    """The layer's ps_config is in place but names model files not there yet (its paths are the
    serving host's): exporting does not fail on the config, it says once why HPS did not start, and
    the export serves once the files are there."""
    folder = tmp_path / "later" / "t0"
    entry = support.model_entry("dlrm", [str(folder)], [DIM0])
    path = support.write_config(tmp_path / "ps.json", support.ps_config([entry], **support.DISABLED_DBS))
    init.shutdown()
    ids_in = keras.Input(shape=(3,), dtype="int64")
    common = {"emb_vec_dtype": tf.float32, "ps_config_file": path, "global_batch_size": 64}
    emb = hps.LookupLayer(model_name="dlrm", table_id=0, emb_vec_size=DIM0, **common)(ids_in)
    with caplog.at_level(logging.WARNING, logger="hierarchical_parameter_server.layers"):
        keras.Model(ids_in, keras.layers.Flatten()(emb)).export(tmp_path / "saved", verbose=False)
    assert not init.is_initialized()
    assert [r.getMessage().count(str(folder)) > 0 for r in caplog.records] == [True]

    _, weights = support.write_table(folder, ROWS, DIM0, seed=1)
    ids = np.random.default_rng(4).integers(0, ROWS + 10, size=(64, 3)).astype(np.int64)
    try:
        served = tf.saved_model.load(str(tmp_path / "saved")).serve(tf.constant(ids)).numpy()
        np.testing.assert_array_equal(served, support.oracle(weights, 0.5, 10)[ids].reshape(64, -1))
    finally:
        init.shutdown()


def test_functions_traced_before_init_serve_after_it(tmp_path):
    """Layers without ps_config_file traced before hps.Init: a first run says HPS is not
    initialised; after hps.Init the same functions serve."""
    folder, weights = support.write_table(tmp_path / "t0", ROWS, DIM0, seed=6)
    entry = support.model_entry("m", [folder], [DIM0])
    path = support.write_config(tmp_path / "ps.json", support.ps_config([entry], **support.DISABLED_DBS))
    init.shutdown()
    common = {"model_name": "m", "table_id": 0, "emb_vec_size": DIM0, "emb_vec_dtype": tf.float32}
    dense, sparse = hps.LookupLayer(**common), hps.SparseLookupLayer(**common)
    lookup = tf.function(lambda ids: dense(ids)).get_concrete_function(tf.TensorSpec([None, 2], tf.int64))
    pool = tf.function(lambda ids: sparse(ids, None, combiner="sqrtn")).get_concrete_function(
        tf.SparseTensorSpec([None, None], tf.int64)
    )
    ids = tf.constant([[3, 1], [ROWS + 2, 0]], tf.int64)
    sp_ids = tf.sparse.from_dense(tf.constant([[5, 0, 7], [0, 0, 0], [ROWS + 1, 2, 0]], tf.int64))
    with pytest.raises(tf.errors.OpError, match="HPS is not initialised"):
        lookup(ids)
    hps.Init(ps_config_file=path, global_batch_size=16)
    try:
        oracle = support.oracle(weights, 0.5, 10)
        np.testing.assert_array_equal(lookup(ids).numpy(), oracle[ids.numpy()])
        want = tf.nn.embedding_lookup_sparse(oracle, sp_ids, None, combiner="sqrtn").numpy()
        np.testing.assert_array_equal(pool(sp_ids).numpy()[[0, 2]], want[[0, 2]])
        np.testing.assert_array_equal(pool(sp_ids).numpy()[1], np.zeros(DIM0, np.float32))
    finally:
        init.shutdown()
