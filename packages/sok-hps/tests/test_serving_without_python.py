"""SavedModels with HPS's layers served from C++ with no Python in the process (issue 39).

A Keras model of ``hps.LookupLayer`` s exported before HPS runs (NVIDIA's flow: the model saved
before its ps_config is written) holds one lookup per table that names its ps_config file; sok-core's
C++ serving program (:mod:`sparse_operation_kit.testing.serving_cpp`) loads sok-core's op libraries
and sok-hps's ``libsok_hps_serving.so``, whose C++ server reads the ps_config and the model files
(a sparse-model folder and a ``sok.dump`` checkpoint table) and answers. Its predictions must
equal Python's bit for bit, keys of no table must read the default value, libpython must never be
mapped, and what it cannot serve must fail with a message that names the setting or the file.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

sys.path.insert(0, str(Path(__file__).parent))  # the helper modules beside the tests (importlib mode)
import hierarchical_parameter_server as hps  # noqa: E402
import serve_support as support  # noqa: E402
import sparse_operation_kit as sok  # noqa: E402
from hierarchical_parameter_server import graph_calls, init  # noqa: E402
from sparse_operation_kit.testing import serving_cpp  # noqa: E402
from sparse_operation_kit.testing.device import skip_unless_gpu_tensorflow  # noqa: E402

BATCH, SLOTS, ROWS, DIMS, UNSEEN = 32, 3, 40, (8, 4), 10


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> Path:
    built, why_not = serving_cpp.build(tmp_path_factory.mktemp("serve"))
    if built is None:
        pytest.skip(why_not)
    return built


@pytest.fixture(scope="module")
def libraries() -> list[str]:
    try:
        return graph_calls.serving_libraries()
    except FileNotFoundError as error:
        pytest.skip(str(error))


def dumped_table(path: Path) -> tuple[str, np.ndarray]:
    """A ``sok.Variable`` of ROWS x DIMS[1] dumped with ``sok.dump``: ``(its sparse_files entry, rows)``."""
    rows = np.random.default_rng(7).normal(size=(ROWS, DIMS[1])).astype(np.float32)
    table = sok.Variable(rows, name="wide")
    sok.dump(str(path), [table])
    names = [name[: -len("-weight")] for name in os.listdir(path) if name.endswith("-weight")]
    assert len(names) == 1, names
    return os.fspath(path / names[0]), rows


def export(tmp_path: Path, config_path: Path, running: bool = False, key_dtype: str = "int64") -> Path:
    """The model, two lookups (one per table), flattened and concatenated, exported while HPS is
    not running (NVIDIA's flow: the graph holds the whole lookup, found by name when it runs), or
    ``running`` from ``config_path`` (the graph holds the lookup: its tables and its misses' fetch).
    Its ids are ``key_dtype`` (int32 where the ps_config says ``supportlonglong: false``)."""
    init.shutdown()
    if running:
        init.Init(ps_config_file=str(config_path), global_batch_size=BATCH)
    ids = keras.Input(shape=(SLOTS,), dtype=key_dtype)
    common = {"emb_vec_dtype": tf.float32, "ps_config_file": str(config_path), "global_batch_size": BATCH}
    parts = [
        keras.layers.Flatten()(hps.LookupLayer(model_name="m", table_id=i, emb_vec_size=dim, **common)(ids))
        for i, dim in enumerate(DIMS)
    ]
    model = keras.Model(ids, keras.layers.Concatenate()(parts))
    try:
        model.export(tmp_path / "saved", verbose=False)
    finally:
        init.shutdown()
    return tmp_path / "saved"


def files(tmp_path: Path) -> tuple[list[str], list[np.ndarray]]:
    folder, narrow = support.write_table(tmp_path / "t0", ROWS, DIMS[0], seed=1)
    entry, wide = dumped_table(tmp_path / "ckpt")
    return [folder, entry], [narrow, wide]


def write(config_path: Path, sparse_files: list[str], entry: dict | None = None, **top) -> None:
    model = support.model_entry("m", sparse_files, list(DIMS), **(entry or {}))
    config_path.write_text(json.dumps(support.ps_config([model], **top)))


def python_serves(saved: Path, ids: np.ndarray) -> np.ndarray:
    try:
        return tf.saved_model.load(str(saved)).serve(tf.constant(ids)).numpy()
    finally:
        init.shutdown()


def cpp_serves(program, saved: Path, ids: np.ndarray, tmp_path: Path, libraries, shape, **options) -> np.ndarray:
    """The C++ program's output (of ``shape``) for ``ids`` through ``saved`` (``serving_cpp.serve``'s
    ``options``), once it ran to the end with no libpython in the process."""
    done = serving_cpp.serve(program, saved, ids, tmp_path, libraries, **options)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "libpython: absent" in done.stdout
    return np.fromfile(tmp_path / "out.bin", np.float32).reshape(shape)


def tables_rows(tables: list[np.ndarray], ids: np.ndarray) -> np.ndarray:
    """The model's output from the tables themselves: each table's rows of ``ids`` (0.5 past its
    rows, the default value), flattened and concatenated as :func:`export`'s model does."""
    return np.concatenate([support.oracle(t, 0.5, UNSEEN)[ids].reshape(len(ids), -1) for t in tables], axis=1)


EVICTING = {"type": "hash_map", "num_partitions": 2, "overflow_margin": 1000, "overflow_policy": "evict_oldest"}
SETUPS = {
    "cache of every row": ({}, support.DISABLED_DBS),
    "hash_map, no cache": ({"gpucache": False}, {"volatile_db": {"type": "hash_map", "num_partitions": 3}}),
    "parallel_hash_map and cache": ({}, {"volatile_db": {"type": "parallel_hash_map"}}),
    "evicting hash_map, no cache": ({"gpucache": False}, {"volatile_db": EVICTING}),
    "evicting hash_map and cache": ({}, {"volatile_db": EVICTING}),
    "evicting cache over a hash_map": ({"gpucacheper": 0.5}, {"volatile_db": {"type": "hash_map"}}),
    "evicting cache over an evicting hash_map": ({"gpucacheper": 0.25}, {"volatile_db": EVICTING}),
}


@pytest.mark.parametrize("running", [False, True], ids=["traced before Init", "traced on a running server"])
@pytest.mark.parametrize("setup", sorted(SETUPS))
def test_an_hps_savedmodel_serves_from_cpp_as_from_python(program, libraries, tmp_path, setup, running):
    entry, top = SETUPS[setup]
    config_path = tmp_path / "ps.json"
    sparse_files, tables = files(tmp_path)
    write(config_path, sparse_files, entry, **top)
    saved = export(tmp_path, config_path, running)
    ids = np.random.default_rng(5).integers(0, ROWS + UNSEEN, size=(BATCH, SLOTS)).astype(np.int64)
    ids[0] = [ROWS, ROWS + 1, 0]  # keys of no table: the default value
    expected = python_serves(saved, ids)

    served = cpp_serves(program, saved, ids, tmp_path, libraries, expected.shape)
    np.testing.assert_array_equal(served, expected)  # bit for bit
    np.testing.assert_array_equal(served, tables_rows(tables, ids))  # the default value past the rows


DATABASE_SETUPS = {
    "cache of every row over rocks_db": ({}, {"persistent_db": "rocks"}),
    "evicting cache over a hash_map and rocks_db": (
        {"gpucacheper": 0.5},
        {"volatile_db": {"type": "hash_map"}, "persistent_db": "rocks"},
    ),
    "rocks_db only, no cache": ({"gpucache": False}, {"volatile_db": {"type": "disabled"}, "persistent_db": "rocks"}),
    "evicting hash_map copying back from rocks_db, no cache": (
        {"gpucache": False},
        {"volatile_db": {**EVICTING, "overflow_margin": 8, "cache_missed_embeddings": True}, "persistent_db": "rocks"},
    ),
    "redis_cluster, no cache": ({"gpucache": False}, {"volatile_db": "redis"}),
    "evicting cache over redis_cluster and rocks_db": (
        {"gpucacheper": 0.5},
        {"volatile_db": "redis", "persistent_db": "rocks"},
    ),
}


def database_config(top: dict, tmp_path: Path, request) -> dict:
    """``top`` with ``"rocks"`` a RocksDB under ``tmp_path`` and ``"redis"`` a Redis
    cluster of its own; skips where this build or this machine lacks either."""
    from hierarchical_parameter_server import _tiers

    out = dict(top)
    if out.get("persistent_db") == "rocks":
        if not _tiers.WITH_ROCKSDB:
            pytest.skip("this build of sok-hps has no C++ RocksDB tier (librocksdb-dev: ci/setup.sh)")
        support.require_rocksdict()
        out["persistent_db"] = {"type": "rocks_db", "path": str(tmp_path / "rocks")}
    if out.get("volatile_db") == "redis":
        if not _tiers.WITH_REDIS:
            pytest.skip("this build of sok-hps has no C++ Redis tier (libhiredis-dev: ci/setup.sh)")
        cluster = request.getfixturevalue("fresh_redis_cluster")  # the session cluster holds other tests' tables
        out["volatile_db"] = {"type": "redis_cluster", "address": cluster.address, "num_partitions": 5}
    return out


@pytest.mark.parametrize("running", [False, True], ids=["traced before Init", "traced on a running server"])
@pytest.mark.parametrize("setup", sorted(DATABASE_SETUPS))
def test_an_hps_savedmodel_over_databases_serves_from_cpp_as_from_python(
    program, libraries, tmp_path, setup, running, request
):
    """The C++ server's chain of tiers (its RocksDB and Redis tiers, the copy-back, the evicting
    cache) over the same databases the Python server used: the same predictions, bit for bit, and
    the tables' rows (the default value for keys no tier has)."""
    entry, top = DATABASE_SETUPS[setup]
    config_path = tmp_path / "ps.json"
    sparse_files, tables = files(tmp_path)
    write(config_path, sparse_files, entry, **database_config(top, tmp_path, request))
    saved = export(tmp_path, config_path, running)
    ids = np.random.default_rng(5).integers(0, ROWS + UNSEEN, size=(BATCH, SLOTS)).astype(np.int64)
    expected = python_serves(saved, ids)

    served = cpp_serves(program, saved, ids, tmp_path, libraries, expected.shape)
    np.testing.assert_array_equal(served, expected)
    np.testing.assert_array_equal(served, tables_rows(tables, ids))


UPDATE_SETUPS = {
    "cache of every row": ({}, support.DISABLED_DBS),
    "hash_map, no cache": ({"gpucache": False}, {"volatile_db": {"type": "hash_map"}}),
    "evicting cache over an evicting hash_map": ({"gpucacheper": 0.25}, {"volatile_db": EVICTING}),
}


@pytest.mark.parametrize("running", [False, True], ids=["traced before Init", "traced on a running server"])
@pytest.mark.parametrize("setup", sorted(UPDATE_SETUPS))
def test_online_updates_reach_the_cpp_server(program, libraries, tmp_path, setup, running):
    """An update directory with updates of both tables (rows changed, a key new to the table): the
    C++ server's update source applies them (a run after its first poll serves them), as Python's."""
    from hierarchical_parameter_server import updates

    entry, top = UPDATE_SETUPS[setup]
    config_path = tmp_path / "ps.json"
    sparse_files, tables = files(tmp_path)
    directory = tmp_path / "updates"
    source = {"type": "directory", "path": str(directory), "poll_interval_ms": 20}
    write(config_path, sparse_files, entry, **top, update_source=source)
    saved = export(tmp_path, config_path, running)
    rng = np.random.default_rng(11)
    changed = np.array([3, 7, ROWS + 2], np.int64)  # ROWS + 2: a key no model file has
    for t, (table, dim) in enumerate(zip(tables, DIMS)):
        rows = rng.normal(size=(len(changed), dim)).astype(np.float32)
        updates.write_update(str(directory), "m", f"sparse_embedding{t}", changed, rows)
        oracle = support.oracle(table, 0.5, UNSEEN)
        oracle[changed] = rows
        tables[t] = oracle
    ids = np.random.default_rng(5).integers(0, ROWS + UNSEEN, size=(BATCH, SLOTS)).astype(np.int64)
    ids[0] = changed
    try:
        model = tf.saved_model.load(str(saved))
        model.serve(tf.constant(ids))
        time.sleep(1.0)  # the source polls every 20 ms
        expected = model.serve(tf.constant(ids)).numpy()
    finally:
        init.shutdown()
    want = np.concatenate([table[ids].reshape(BATCH, -1) for table in tables], axis=1)
    np.testing.assert_array_equal(expected, want)

    served = cpp_serves(program, saved, ids, tmp_path, libraries, want.shape, runs=3, pause_ms=500)
    np.testing.assert_array_equal(served, want)


def serve_expecting_failure(program, libraries, tmp_path, saved) -> str:
    ids = np.zeros((BATCH, SLOTS), np.int64)
    done = serving_cpp.serve(program, saved, ids, tmp_path, libraries)
    assert done.returncode == 1, done.stdout
    return " ".join(done.stderr.split())


@pytest.mark.parametrize("running", [False, True], ids=["traced before Init", "traced on a running server"])
def test_an_evicting_hash_map_serves_what_the_python_one_keeps(program, libraries, tmp_path, running):
    """With rows evicted from the volatile hash map (evict_oldest: the same survivors in the C++ and
    the Python tier after the same calls), C++ serves what Python does: survivors' rows, the
    default value for the rest."""
    config_path = tmp_path / "ps.json"
    sparse_files, _ = files(tmp_path)
    tight = {**EVICTING, "num_partitions": 1, "overflow_margin": 16, "overflow_resolution_target": 0.5}
    write(config_path, sparse_files, {"gpucache": False}, volatile_db=tight)
    saved = export(tmp_path, config_path, running)
    ids = np.random.default_rng(9).integers(0, ROWS, size=(BATCH, SLOTS)).astype(np.int64)
    expected = python_serves(saved, ids)
    assert (expected == 0.5).any() and (expected != 0.5).any()  # some rows evicted, some kept

    done = serving_cpp.serve(program, saved, ids, tmp_path, libraries)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    np.testing.assert_array_equal(np.fromfile(tmp_path / "out.bin", np.float32).reshape(expected.shape), expected)


def test_an_evicting_cache_smaller_than_a_batch_still_serves_every_row(program, libraries, tmp_path):
    """A cache of 128 rows (gpucacheper 0.1 of 1,000) over a hash map, a batch of about 700
    distinct keys: the fill of its misses evicts within the batch, and every key still reads its
    row (hit_rate_threshold 1.0: exact), as in Python."""
    rows = 1000
    folders = [support.write_table(tmp_path / f"t{i}", rows, dim, seed=i)[0] for i, dim in enumerate(DIMS)]
    tables = [
        np.fromfile(Path(folder) / "emb_vector", np.float32).reshape(rows, dim) for folder, dim in zip(folders, DIMS)
    ]
    config_path = tmp_path / "ps.json"
    write(config_path, folders, {"gpucacheper": 0.1}, volatile_db={"type": "hash_map"})
    saved = export(tmp_path, config_path, running=True)
    ids = np.random.default_rng(3).integers(0, rows + UNSEEN, size=(400, SLOTS)).astype(np.int64)
    expected = python_serves(saved, ids)

    done = serving_cpp.serve(program, saved, ids, tmp_path, libraries)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    served = np.fromfile(tmp_path / "out.bin", np.float32).reshape(expected.shape)
    np.testing.assert_array_equal(served, expected)
    oracle = [support.oracle(table, 0.5, UNSEEN)[ids].reshape(len(ids), -1) for table in tables]
    np.testing.assert_array_equal(served, np.concatenate(oracle, axis=1))


def lookup_devices(saved: Path) -> set[str]:
    """The devices the SavedModel's graph puts its table finds (SokFind, SokFindOrDefault) on."""
    from tensorflow.core.protobuf import saved_model_pb2

    model = saved_model_pb2.SavedModel()
    model.ParseFromString((saved / "saved_model.pb").read_bytes())
    graph = model.meta_graphs[0].graph_def
    nodes = [*graph.node, *(node for function in graph.library.function for node in function.node_def)]
    return {node.device for node in nodes if node.op in ("SokFind", "SokFindOrDefault")}


LARGE_BATCH = 50_000  # x SLOTS: 150,000 keys a table
GPU_CACHES = {
    # the C++ server's caches are on the GPU as Python's, keyed as the graph's ids: found in place
    "evicting cache, int64 keys": ({"gpucacheper": 0.5}, {"volatile_db": {"type": "hash_map"}}, "int64"),
    "evicting cache, int32 keys": ({"gpucacheper": 0.5}, {"volatile_db": {"type": "hash_map"}}, "int32"),
    "cache of every row, int32 keys": ({}, support.DISABLED_DBS, "int32"),
}


@pytest.mark.gpu
@pytest.mark.parametrize("setup", sorted(GPU_CACHES))
def test_a_large_gpu_lookup_of_the_gpu_caches_serves_as_python(program, libraries, tmp_path, setup):
    """On a GPU, a graph traced on a running server (its finds on the GPU, where Python's cache is)
    reads the C++ server's cache on that GPU (an hkv cache that evicts, or det's cache of every row,
    with int64 or int32 keys): a batch of 150,000 keys a table, served three times in a row (the
    later runs read rows the first ones cached), equals Python's bit for bit and the tables' rows,
    the default value past them."""
    skip_unless_gpu_tensorflow()
    entry, top, key_dtype = GPU_CACHES[setup]
    rows = 1000
    folders = [support.write_table(tmp_path / f"t{i}", rows, dim, seed=i)[0] for i, dim in enumerate(DIMS)]
    tables = [
        np.fromfile(Path(folder) / "emb_vector", np.float32).reshape(rows, dim) for folder, dim in zip(folders, DIMS)
    ]
    config_path = tmp_path / "ps.json"
    model = support.model_entry("m", folders, list(DIMS), max_batch_size=LARGE_BATCH, **entry)
    config_path.write_text(json.dumps(support.ps_config([model], supportlonglong=key_dtype == "int64", **top)))
    saved = export(tmp_path, config_path, running=True, key_dtype=key_dtype)
    devices = lookup_devices(saved)
    assert devices and all("GPU" in device.upper() for device in devices), devices  # the finds run on the GPU
    ids = np.random.default_rng(11).integers(0, rows + UNSEEN, size=(LARGE_BATCH, SLOTS)).astype(key_dtype)
    expected = python_serves(saved, ids)

    gpu = {"TF_FORCE_GPU_ALLOW_GROWTH": "true"}
    served = cpp_serves(program, saved, ids, tmp_path, libraries, expected.shape, env=gpu, runs=3)
    np.testing.assert_array_equal(served, expected)  # bit for bit
    np.testing.assert_array_equal(served, tables_rows(tables, ids))


TORN_SETUPS = {
    "cache of every row": ({}, support.DISABLED_DBS),
    "hash_map, no cache": ({"gpucache": False}, {"volatile_db": {"type": "hash_map"}}),
    "evicting cache over a hash_map": ({"gpucacheper": 0.5}, {"volatile_db": {"type": "hash_map"}}),
}


@pytest.mark.parametrize("setup", sorted(TORN_SETUPS))
def test_lookups_while_updates_apply_never_see_a_row_half_written(program, libraries, tmp_path, setup):
    """Online updates that set every row of both tables to one value per version, written all the
    while the C++ server looks the same keys up 60 times: every row of every lookup is whole (one
    version's value in all its columns), and no key's version goes back."""
    from hierarchical_parameter_server import updates

    entry, top = TORN_SETUPS[setup]
    folders = []
    for t, dim in enumerate(DIMS):
        folder = tmp_path / f"t{t}"
        folder.mkdir()
        np.arange(ROWS, dtype=np.int64).tofile(folder / "key")
        np.zeros((ROWS, dim), np.float32).tofile(folder / "emb_vector")
        folders.append(str(folder))
    directory = tmp_path / "updates"
    config_path = tmp_path / "ps.json"
    source = {"type": "directory", "path": str(directory), "poll_interval_ms": 5}
    write(config_path, folders, entry, **top, update_source=source)
    saved = export(tmp_path, config_path)
    keys = np.arange(ROWS, dtype=np.int64)
    done = threading.Event()

    def writer() -> None:
        version = 0
        while not done.is_set():
            version += 1
            for t, dim in enumerate(DIMS):
                updates.write_update(str(directory), "m", f"sparse_embedding{t}", keys, np.full((ROWS, dim), version))
            time.sleep(0.005)

    ids = np.random.default_rng(8).integers(0, ROWS, size=(BATCH, SLOTS)).astype(np.int64)
    thread = threading.Thread(target=writer)
    thread.start()
    try:
        served = serving_cpp.serve(program, saved, ids, tmp_path, libraries, runs=60, pause_ms=10, every_run=True)
    finally:
        done.set()
        thread.join()
    assert served.returncode == 0, served.stdout + served.stderr[-3000:]
    out = np.fromfile(tmp_path / "out.bin", np.float32).reshape(60, BATCH, SLOTS * sum(DIMS))
    parts = np.split(out, [SLOTS * DIMS[0]], axis=2)
    seen = set()
    for part, dim in zip(parts, DIMS):
        rows = part.reshape(60, BATCH, SLOTS, dim)
        np.testing.assert_array_equal(rows.min(axis=3), rows.max(axis=3))  # no row half written
        versions = rows[..., 0]
        assert (np.diff(versions, axis=0) >= 0).all()  # no key's version goes back
        seen.update(np.unique(versions).tolist())
    assert len(seen) > 3, seen  # lookups ran while versions changed


def test_an_update_source_path_that_cannot_be_a_directory_is_refused_as_in_python(program, libraries, tmp_path):
    config_path = tmp_path / "ps.json"
    saved = export(tmp_path, config_path)
    sparse_files, _ = files(tmp_path)
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    write(config_path, sparse_files, update_source={"type": "directory", "path": str(blocker)})
    message = serve_expecting_failure(program, libraries, tmp_path, saved)
    assert (
        f"update_source.path '{blocker}' cannot be the directory of online updates: File exists; nothing was" in message
    )
    with pytest.raises(Exception, match="cannot be the directory of online updates: File exists; nothing was written"):
        python_serves(saved, np.zeros((BATCH, SLOTS), np.int64))


def test_an_update_filter_only_pythons_re_can_run_is_refused_naming_it(program, libraries, tmp_path):
    config_path = tmp_path / "ps.json"
    saved = export(tmp_path, config_path)
    sparse_files, _ = files(tmp_path)
    write(config_path, sparse_files, volatile_db={"type": "hash_map", "update_filters": ["(?P<m>m)"]})
    message = serve_expecting_failure(program, libraries, tmp_path, saved)
    assert "volatile_db.update_filters entry '(?P<m>m)' is a regular expression of Python's re that C++'s" in message


def test_config_and_model_file_errors_are_the_python_readers(program, libraries, tmp_path):
    """The C++ readers' messages: a missing config file, then a corrupt checkpoint."""
    config_path = tmp_path / "ps.json"
    saved = export(tmp_path, config_path)
    message = serve_expecting_failure(program, libraries, tmp_path, saved)
    assert f"ps_config file '{config_path}' cannot be read (No such file or directory)" in message

    sparse_files, _ = files(tmp_path)
    write(config_path, sparse_files, **support.DISABLED_DBS)
    weight = Path(sparse_files[1] + "-weight")
    data = bytearray(weight.read_bytes())
    data[-1] ^= 0x40
    weight.write_bytes(bytes(data))
    message = serve_expecting_failure(program, libraries, tmp_path, saved)
    assert "does not match the checkpoint's checksum" in message


def test_without_the_serving_library_the_lookup_says_what_to_load(program, libraries, tmp_path):
    config_path = tmp_path / "ps.json"
    saved = export(tmp_path, config_path)
    sparse_files, _ = files(tmp_path)
    write(config_path, sparse_files, **support.DISABLED_DBS)
    message = serve_expecting_failure(program, libraries[:-1], tmp_path, saved)
    assert f"SokPyCall of {graph_calls.LOOKUP}: this process has no Python interpreter" in message
    assert "libsok_hps_serving.so" in message


def test_the_serving_libraries_list_the_backends_storages_before_the_serving_library(libraries):
    """The C++ server keeps its rows in sok-backend-det's storage and its evicting caches in
    sok-backend-hkv's, which it reaches by dlopen RTLD_NOLOAD: the process loads both libraries (no
    ops) before libsok_hps_serving.so."""
    import sok_backend_det
    import sok_backend_hkv

    det = os.path.join(os.path.dirname(sok_backend_det.__file__), graph_calls.DET_STORAGE_LIBRARY)
    hkv = os.path.join(os.path.dirname(sok_backend_hkv.__file__), graph_calls.HKV_STORAGE_LIBRARY)
    serving = os.path.join(os.path.dirname(libraries[-1]), graph_calls.SERVING_LIBRARY)
    assert libraries[-3:] == [det, hkv, serving]


def test_the_cpp_evicting_cache_is_made_as_the_python_one():
    """The C++ server's evicting cache is an hkv storage of cache.py's capacity and options (its
    own copy of them, storage_options.hpp)."""
    from hierarchical_parameter_server import _serving, cache

    for rows, fraction in [(1, 0.1), (100, 0.0001), (1000, 0.5), (30000, 0.2), (10**7, 0.3), (10**9, 0.99)]:
        assert _serving.capacity_of(rows, fraction) == cache.capacity_of(rows, fraction), (rows, fraction)
    for capacity in (128, 4096, 8192, 16384, 1 << 24):
        python = {name: str(value) for name, value in cache.hkv_options(capacity).items() if name != "var_type"}
        assert dict(_serving.hkv_cache_options(capacity)) == python, capacity


STORAGE_LIBRARIES = {
    # the library left out, and a ps_config whose server needs it (hkv: an evicting cache)
    "det": (graph_calls.DET_STORAGE_LIBRARY, {}, support.DISABLED_DBS),
    "hkv": (graph_calls.HKV_STORAGE_LIBRARY, {"gpucacheper": 0.5}, {"volatile_db": {"type": "hash_map"}}),
}


@pytest.mark.parametrize("backend", sorted(STORAGE_LIBRARIES))
def test_without_a_backends_storage_library_the_lookup_says_what_to_load(program, libraries, tmp_path, backend):
    library, entry, top = STORAGE_LIBRARIES[backend]
    config_path = tmp_path / "ps.json"
    saved = export(tmp_path, config_path)
    sparse_files, _ = files(tmp_path)
    write(config_path, sparse_files, entry, **top)
    without = [path for path in libraries if os.path.basename(path) != library]
    assert len(without) == len(libraries) - 1
    message = serve_expecting_failure(program, without, tmp_path, saved)
    assert f"this process has not loaded its library {library}: load it (TF_LoadLibrary)" in message
    assert "graph_calls.serving_libraries()" in message


def test_a_savedmodel_of_nvidias_plugin_ops_serves_from_cpp(program, libraries, tmp_path):
    """NVIDIA's plugin's Init and Lookup (sok-hps's libsok_tf_hps_compat.so, after sok-core's op
    library): Init starts the C++ server from its ps_config_file, Lookup reads its rows."""
    sparse_files, tables = files(tmp_path)
    config_path = tmp_path / "ps.json"
    write(config_path, sparse_files, **support.DISABLED_DBS)
    lib = graph_calls.compat_library()

    def lookup(ids: tf.Tensor) -> tf.Tensor:
        status = lib.init(
            global_replica_id=0,
            num_replicas_in_sync=1,
            visible_devices=[0],
            ps_config_file=str(config_path),
            global_batch_size=BATCH,
        )
        common = {"global_replica_id": 0, "init_status": status, "model_name": "m", "dtype": tf.float32}
        return lib.lookup(values=ids, table_id=1, emb_vec_size=DIMS[1], **common)

    module = tf.Module()
    module.lookup = tf.function(lookup, input_signature=[tf.TensorSpec([None, SLOTS], tf.int64)])
    tf.saved_model.save(module, str(tmp_path / "saved"))
    init.shutdown()
    ids = np.random.default_rng(6).integers(0, ROWS + UNSEEN, size=(BATCH, SLOTS)).astype(np.int64)
    compat = os.path.join(os.path.dirname(libraries[-1]), graph_calls.COMPAT_LIBRARY)
    served = cpp_serves(program, tmp_path / "saved", ids, tmp_path, [*libraries, compat], (BATCH, SLOTS, DIMS[1]))
    np.testing.assert_array_equal(served, support.oracle(tables[1], 0.5, UNSEEN)[ids])
