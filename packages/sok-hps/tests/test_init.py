"""hps.Init: once per process, thread-safe, retried after a failure; its checks raise; the layers
initialise implicitly from their ps_config_file."""

from __future__ import annotations

import re
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
sys.path.insert(0, str(Path(__file__).parent))
import hierarchical_parameter_server as hps  # noqa: E402
import serve_support as support  # noqa: E402
from hierarchical_parameter_server import init  # noqa: E402
from hierarchical_parameter_server.config import ConfigError  # noqa: E402

DIM = 4


@pytest.fixture
def config_path(tmp_path):
    folder, weights = support.write_table(tmp_path / "t0", 100, DIM)
    config = support.ps_config([support.model_entry("m", [folder], [DIM])], **support.DISABLED_DBS)
    path = support.write_config(tmp_path / "ps.json", config)
    init.shutdown()
    yield path, weights
    init.shutdown()


def test_init_returns_ok_once_per_process(config_path, tmp_path):
    path, _ = config_path
    status = hps.Init(ps_config_file=path, global_batch_size=16)
    assert status.dtype == tf.string and status.numpy() == b"OK"
    server = init.get_server()
    # A later call with another config, even one that does not exist, changes nothing.
    assert hps.Init(ps_config_file=str(tmp_path / "missing.json"), global_batch_size=1).numpy() == b"OK"
    assert init.get_server() is server


def test_a_failed_init_is_retried(config_path, tmp_path):
    path, _ = config_path
    with pytest.raises(ConfigError, match="cannot be read"):
        hps.Init(ps_config_file=str(tmp_path / "missing.json"), global_batch_size=16)
    assert not init.is_initialized()
    assert hps.Init(ps_config_file=path, global_batch_size=16).numpy() == b"OK"
    assert init.is_initialized()


def test_concurrent_inits_make_one_server(config_path):
    path, _ = config_path
    servers, errors = [], []

    def start():
        try:
            hps.Init(ps_config_file=path, global_batch_size=16)
            servers.append(init.get_server())
        except Exception as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=start) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(servers) == 8 and all(s is servers[0] for s in servers)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"global_batch_size": 16}, TypeError, "missing: ps_config_file"),
        ({"ps_config_file": "PATH", "global_batch_size": 1, "visible": 0}, TypeError, "unknown: visible"),
        ({"ps_config_file": "PATH", "global_batch_size": 0}, ValueError, "global_batch_size must be an integer > 0"),
        ({"ps_config_file": "PATH", "global_batch_size": 4096}, ValueError, "larger than models\\[0\\].max_batch_size"),
    ],
    ids=["missing", "unknown", "zero-batch", "batch-over-max"],
)
def test_init_checks_raise(config_path, kwargs, error, match):
    path, _ = config_path
    kwargs = {k: path if v == "PATH" else v for k, v in kwargs.items()}
    with pytest.raises(error, match=match):
        hps.Init(**kwargs)
    assert not init.is_initialized()


@pytest.mark.parametrize("devices", [[1], [0, 2], [1, 2, 3]])
def test_deployed_device_list_must_be_the_first_devices(tmp_path, devices):
    folder, _ = support.write_table(tmp_path / "t0", 10, DIM)
    entry = support.model_entry("m", [folder], [DIM], deployed_device_list=devices)
    path = support.write_config(tmp_path / "ps.json", support.ps_config([entry], **support.DISABLED_DBS))
    init.shutdown()
    words = re.escape(f"models[0].deployed_device_list is {devices}; valid: the devices 0 .. n-1")
    with pytest.raises(ValueError, match=words):
        hps.Init(ps_config_file=path, global_batch_size=16)
    assert not init.is_initialized()


@pytest.mark.parametrize(
    ("batch", "words"),
    [(18, "does not divide among the 4 replicas"), (40, "40 / 4 replicas = 10 is larger than models\\[0\\]")],
)
def test_the_global_batch_is_split_among_the_replicas(tmp_path, batch, words):
    """As NVIDIA's init_check: global_batch_size divides among the replicas, and each replica's share
    is at most max_batch_size (8 here)."""
    folder, _ = support.write_table(tmp_path / "t0", 10, DIM)
    entry = support.model_entry("m", [folder], [DIM], deployed_device_list=[0, 1, 2, 3], max_batch_size=8)
    path = support.write_config(tmp_path / "ps.json", support.ps_config([entry], **support.DISABLED_DBS))
    init.shutdown()
    with pytest.raises(ValueError, match=words):
        hps.Init(ps_config_file=path, global_batch_size=batch)
    hps.Init(ps_config_file=path, global_batch_size=32)  # 8 per replica
    assert init.is_initialized()
    init.shutdown()


def test_several_deployed_devices_are_served_by_one_cache(tmp_path):
    """NVIDIA's multi-GPU configs (deployed_device_list [0, 1, 2, 3], any order) start, and the
    lookups return the table's rows."""
    folder, weights = support.write_table(tmp_path / "t0", 10, DIM)
    entry = support.model_entry("m", [folder], [DIM], deployed_device_list=[2, 0, 3, 1])
    path = support.write_config(tmp_path / "ps.json", support.ps_config([entry], **support.DISABLED_DBS))
    init.shutdown()
    hps.Init(ps_config_file=path, global_batch_size=16)
    try:
        layer = hps.LookupLayer(model_name="m", table_id=0, emb_vec_size=DIM, emb_vec_dtype=tf.float32)
        ids = tf.constant([[3, 1], [9, 0]], tf.int64)
        np.testing.assert_array_equal(layer(ids).numpy(), weights[ids.numpy()])
    finally:
        init.shutdown()


@pytest.mark.parametrize(
    ("overrides", "words"),
    [({"gpucache": False}, "gpucache: false"), ({"gpucacheper": 0.0}, "gpucacheper: 0.0 \\(no cache\\)")],
)
def test_no_cache_and_no_database_is_refused(tmp_path, overrides, words):
    folder, _ = support.write_table(tmp_path / "t0", 10, DIM)
    entry = support.model_entry("m", [folder], [DIM], **overrides)
    path = support.write_config(tmp_path / "ps.json", support.ps_config([entry], **support.DISABLED_DBS))
    init.shutdown()
    with pytest.raises(ValueError, match=f"{words} and the ps_config has no database"):
        hps.Init(ps_config_file=path, global_batch_size=16)
    assert not init.is_initialized()


def test_layers_initialise_implicitly(config_path):
    path, weights = config_path
    layer = hps.LookupLayer(
        model_name="m",
        table_id=0,
        emb_vec_size=DIM,
        emb_vec_dtype=tf.float32,
        ps_config_file=path,
        global_batch_size=16,
    )
    assert not init.is_initialized()
    ids = tf.constant([[3, 1], [99, 0]], tf.int64)
    np.testing.assert_array_equal(layer(ids).numpy(), tf.nn.embedding_lookup(weights, ids).numpy())
    assert init.is_initialized()


def test_a_layer_without_config_before_init_says_how_to_fix(config_path):
    layer = hps.LookupLayer(model_name="m", table_id=0, emb_vec_size=DIM, emb_vec_dtype=tf.float32)
    with pytest.raises(RuntimeError, match="HPS is not initialised: call hps.Init"):
        layer(tf.constant([1], tf.int64))
