"""The ps_config parser: defaults of reference §2, aliases, warnings for unknown keys, errors that
name the key's path.

* A minimal config (reference §2.6) gets every default of §2.1-2.5; the unit-test config of §4 is
  read as written.
* Aliases become canonical names; refused values (Kafka, the multi-process hash map) and unknown
  type strings are errors.
* An unknown key is logged with the nearest valid name; wrong types and impossible values raise
  ConfigError naming e.g. ``models[1].gpucacheper``.
* Values that would take the server down are refused: ``num_partitions`` above MAX_PARTITIONS, a
  NaN or infinite number (a default row of NaN, an infinite threshold).
* A file that is not a ps_config (binary, too deep, too large, not an object, a directory, a FIFO
  without a writer) raises ConfigError naming the file, and never hangs.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import tempfile
import threading

import pytest
from hierarchical_parameter_server import config as config_module
from hierarchical_parameter_server.config import (
    MAX_PARTITIONS,
    MAX_POLL_INTERVAL_MS,
    MAX_THREAD_POOL_SIZE,
    ConfigError,
    load_config,
)


def minimal(**model_overrides) -> dict:
    """Reference §2.6: the top-level and per-model hard keys and a valid model name."""
    model = {
        "model": "m",
        "sparse_files": ["a", "b"],
        "deployed_device_list": [0],
        "embedding_vecsize_per_table": [8, 4],
        "maxnum_catfeature_query_per_table_per_sample": [3, 2],
        "default_value_for_each_table": [1.5],
    }
    model.update(model_overrides)
    return {"supportlonglong": True, "models": [model]}


# The defaults of reference §2.2-2.5, written from the tables there.
MODEL_DEFAULTS = {
    "dense_file": "",
    "max_batch_size": 64,
    "gpucache": True,
    "gpucacheper": 0.2,
    "hit_rate_threshold": 0.9,
    "cache_refresh_percentage_per_iteration": 0.0,
    "num_of_worker_buffer_in_pool": 1,
    "num_of_refresher_buffer_in_pool": 1,
    "thread_pool_size": 16,
    "embedding_cache_type": "dynamic",
    "use_static_table": False,
    "use_context_stream": True,
    "use_hctr_cache_implementation": True,
    "init_ec": True,
    "enable_pagelock": False,
    "fp8_quant": False,
    "fuse_embedding_table": True,
    "maxnum_des_feature_per_sample": 26,
    "refresh_delay": 0.0,
    "refresh_interval": 0,
}
VOLATILE_DEFAULTS = {
    "address": "127.0.0.1:7000",
    "user_name": "default",
    "password": "",
    "num_partitions": min(16, os.cpu_count() or 1),
    "allocation_rate": 268435456,
    "shared_memory_size": 17179869184,
    "shared_memory_name": "hctr_mp_hash_map_database",
    "shared_memory_auto_remove": True,
    "num_node_connections": 5,
    "max_batch_size": 65536,
    "enable_tls": False,
    "tls_ca_certificate": "cacertbundle.crt",
    "tls_client_certificate": "client_cert.pem",
    "tls_client_key": "client_key.pem",
    "tls_server_name_identification": "redis.localhost",
    "overflow_margin": 2**64 - 1,
    "overflow_policy": "evict_random",
    "overflow_resolution_target": 0.8,
    "initial_cache_rate": 1.0,
    "cache_missed_embeddings": False,
    "update_filters": (".+",),
    "initialize_after_startup": True,
}
PERSISTENT_DEFAULTS = {
    "type": "disabled",
    "path": os.path.join(tempfile.gettempdir(), "rocksdb"),
    "num_threads": 16,
    "read_only": False,
    "max_batch_size": 65536,
    "update_filters": (".+",),
    "initialize_after_startup": True,
}


def test_minimal_config_gets_every_default():
    cfg = load_config(minimal())
    assert cfg.supportlonglong is True and cfg.fuse_embedding_table is False
    m = cfg.model("m")
    for key, value in MODEL_DEFAULTS.items():
        assert getattr(m, key) == value, key
    assert m.embedding_table_names == ("sparse_embedding0", "sparse_embedding1")
    assert m.default_value_for_each_table == (1.5, 0.0)
    assert m.num_tables == 2 and m.table_tag(1) == "hps_et.m.sparse_embedding1"
    assert cfg.volatile_db.type == "parallel_hash_map"
    for key, value in VOLATILE_DEFAULTS.items():
        assert getattr(cfg.volatile_db, key) == value, key
    for key, value in PERSISTENT_DEFAULTS.items():
        assert getattr(cfg.persistent_db, key) == value, key
    assert cfg.update_source.type == "null"


def test_sections_present_but_empty_get_the_same_defaults():
    raw = minimal()
    raw.update(volatile_db={}, persistent_db={}, update_source={})
    cfg = load_config(raw)
    assert cfg.volatile_db == load_config(minimal()).volatile_db
    assert cfg.persistent_db == load_config(minimal()).persistent_db
    assert cfg.update_source == load_config(minimal()).update_source


def test_unit_test_config_of_reference_section_4(tmp_path):
    foo = {
        "model": "foo",
        "sparse_files": ["foo_sparse.model"],
        "num_of_worker_buffer_in_pool": 3,
        "embedding_table_names": ["sparse_embedding0"],
        "embedding_vecsize_per_table": [16],
        "maxnum_catfeature_query_per_table_per_sample": [10],
        "default_value_for_each_table": [1.0],
        "deployed_device_list": [0],
        "max_batch_size": 16384,
        "cache_refresh_percentage_per_iteration": 0.2,
        "hit_rate_threshold": 1.0,
        "gpucacheper": 1.0,
        "gpucache": True,
    }
    bar = dict(
        foo,
        model="bar",
        sparse_files=["bar_sparse_0.model", "bar_sparse_1.model"],
        embedding_table_names=["sparse_embedding0", "sparse_embedding1"],
        embedding_vecsize_per_table=[64, 32],
        maxnum_catfeature_query_per_table_per_sample=[3, 5],
        default_value_for_each_table=[1.0, 1.0],
        max_batch_size=1024,
    )
    path = tmp_path / "hps.json"
    path.write_text(json.dumps({"supportlonglong": False, "models": [foo, bar]}))
    cfg = load_config(path)
    assert cfg.supportlonglong is False
    assert [m.model for m in cfg.models] == ["foo", "bar"]
    for raw in (foo, bar):
        m = cfg.model(raw["model"])
        for key, value in raw.items():
            got = getattr(m, key)
            assert (list(got) if isinstance(got, tuple) else got) == value, key
    assert cfg.model("bar").table_tag(1) == "hps_et.bar.sparse_embedding1"


# Per (section, key): alias -> the canonical name it becomes.
ALIASES = {
    ("volatile_db", "type"): {
        "hashmap": "hash_map",
        "map": "hash_map",
        "parallel_hash": "parallel_hash_map",
        "redis": "redis_cluster",
        "none": "disabled",
        "Disable": "disabled",
    },
    ("volatile_db", "overflow_policy"): {
        "least_used": "evict_least_used",
        "oldest": "evict_oldest",
        "random": "evict_random",
    },
    ("persistent_db", "type"): {"rocksdb": "rocks_db", "rocks": "rocks_db"},
    ("update_source", "type"): {"none": "null"},
}


@pytest.mark.parametrize(
    ("section", "key", "alias", "canonical"),
    [(section, key, alias, name) for (section, key), names in ALIASES.items() for alias, name in names.items()],
)
def test_aliases_become_canonical_names(section, key, alias, canonical):
    raw = minimal()
    raw[section] = {key: alias, "path": "/tmp/x"} if section == "update_source" else {key: alias}
    assert getattr(getattr(load_config(raw), section), key) == canonical


def test_use_static_table_forces_the_static_cache():
    assert load_config(minimal(use_static_table=True)).model("m").embedding_cache_type == "static"


def test_unknown_key_is_warned_with_the_nearest_name(caplog):
    raw = minimal(gpucacheperc=0.5)
    raw["volatile_db"] = {"overflow_polcy": "oldest"}
    with caplog.at_level(logging.WARNING, logger="hierarchical_parameter_server.config"):
        cfg = load_config(raw)
    text = caplog.text
    assert "models[0].gpucacheperc" in text and "'gpucacheper'" in text
    assert "volatile_db.overflow_polcy" in text and "'overflow_policy'" in text
    assert cfg.model("m").gpucacheper == 0.2


def test_unknown_key_far_from_any_name_lists_the_valid_keys(caplog):
    raw = minimal()
    raw["zzzz"] = 1
    with caplog.at_level(logging.WARNING, logger="hierarchical_parameter_server.config"):
        load_config(raw)
    assert "zzzz" in caplog.text and "supportlonglong" in caplog.text


def test_keys_the_original_does_not_parse_are_ignored_with_a_note(caplog):
    raw = minimal(slot_num=3, network_file="x.json")
    with caplog.at_level(logging.WARNING, logger="hierarchical_parameter_server.config"):
        load_config(raw)
    assert "models[0].slot_num is ignored" in caplog.text


def _set(raw: dict, path: str, value) -> dict:
    raw = copy.deepcopy(raw)
    *parents, last = path.split(".")
    node = raw
    for p in parents:
        if p.endswith("]"):
            name, index = p[:-1].split("[")
            node = node[name][int(index)]
        else:
            node = node.setdefault(p, {})
    node[last] = value
    return raw


@pytest.mark.parametrize(
    ("path", "value", "words"),
    [
        ("supportlonglong", "true", "true or false"),
        ("models[0].gpucacheper", -0.1, "[0.0, 1.0]"),
        ("models[0].gpucacheper", 1.5, "[0.0, 1.0]"),
        ("models[0].gpucacheper", "0.5", "number"),
        ("models[0].max_batch_size", -1, ">= 1"),
        ("models[0].max_batch_size", 2.5, "integer"),
        ("models[0].max_batch_size", True, "integer"),
        ("models[0].hit_rate_threshold", -0.1, ">= 0.0"),
        ("models[0].cache_refresh_percentage_per_iteration", 2.0, "[0.0, 1.0]"),
        ("models[0].num_of_worker_buffer_in_pool", 0, ">= 1"),
        ("models[0].gpucache", 1, "true or false"),
        ("models[0].embedding_vecsize_per_table", [8], "one per table"),
        ("models[0].embedding_vecsize_per_table", [8, 0], ">= 1"),
        ("models[0].maxnum_catfeature_query_per_table_per_sample", [1, 2, 3], "one per table"),
        ("models[0].default_value_for_each_table", [1.0, 2.0, 3.0], "at most one per table"),
        ("models[0].default_value_for_each_table", 1.0, "JSON array"),
        ("models[0].embedding_table_names", ["a.b", "c"], "letters, digits"),
        ("models[0].embedding_table_names", ["a", "a"], "unique"),
        ("models[0].model", "A.1", "letters, digits"),
        ("models[0].model", "", "letters, digits"),
        ("models[0].sparse_files", [], "non-empty"),
        ("models[0].deployed_device_list", [0, 0], "repeat"),
        ("models[0].deployed_device_list", [-1], ">= 0"),
        ("models[0].embedding_cache_type", "fancy", "'dynamic'"),
        ("volatile_db.type", "memcached", "'hash_map'"),
        ("volatile_db.type", "multi_process_hash_map", "parallel_hash_map"),
        ("volatile_db.num_partitions", 0, f"[1, {MAX_PARTITIONS}]"),
        ("volatile_db.num_partitions", MAX_PARTITIONS + 1, f"[1, {MAX_PARTITIONS}]"),
        ("volatile_db.overflow_policy", "evict_newest", "'evict_oldest'"),
        ("volatile_db.overflow_resolution_target", 0.0, "(0.0, 1.0]"),
        ("volatile_db.overflow_margin", 0, f"[1, {2**64 - 1}]"),
        ("volatile_db.overflow_margin", 2**64, f"[1, {2**64 - 1}]"),
        ("models[0].thread_pool_size", MAX_THREAD_POOL_SIZE + 1, f"[1, {MAX_THREAD_POOL_SIZE}]"),
        ("update_source.poll_interval_ms", 10**13, f"[1, {MAX_POLL_INTERVAL_MS}]"),
        ("volatile_db.address", "host:notaport", "host[:port]"),
        ("volatile_db.update_filters", ["("], "regular expression"),
        ("persistent_db.type", "leveldb", "'rocks_db'"),
        ("persistent_db.num_threads", 0, ">= 1"),
        ("persistent_db.read_only", "no", "true or false"),
        ("update_source.type", "kafka_message_queue", "directory"),
        ("update_source.type", "kafka", "directory"),
    ],
)
def test_bad_values_name_the_path(path, value, words):
    with pytest.raises(ConfigError) as e:
        load_config(_set(minimal(), path, value))
    assert path in str(e.value) and words in str(e.value)


@pytest.mark.parametrize(
    "key",
    [
        "sparse_files",
        "deployed_device_list",
        "embedding_vecsize_per_table",
        "maxnum_catfeature_query_per_table_per_sample",
        "default_value_for_each_table",
    ],
)
def test_missing_hard_model_key_is_named(key):
    raw = minimal()
    del raw["models"][0][key]
    with pytest.raises(ConfigError, match=rf"models\[0\]\.{key}: required"):
        load_config(raw)


@pytest.mark.parametrize("key", ["supportlonglong", "models"])
def test_missing_hard_top_level_key_is_named(key):
    raw = minimal()
    del raw[key]
    with pytest.raises(ConfigError, match=rf"^{key}: required"):
        load_config(raw)


def test_empty_models_and_duplicate_names_are_refused():
    with pytest.raises(ConfigError, match="models: expected a non-empty"):
        load_config({"supportlonglong": True, "models": []})
    raw = minimal()
    raw["models"].append(copy.deepcopy(raw["models"][0]))
    with pytest.raises(ConfigError, match=r"models\[1\]\.model: 'm' is also the name of models\[0\]"):
        load_config(raw)


def test_redis_needs_as_many_partitions_as_connections():
    raw = _set(minimal(), "volatile_db.type", "redis")
    raw["volatile_db"].update(num_partitions=2, num_node_connections=5)
    with pytest.raises(ConfigError, match="volatile_db.num_partitions: 2 .*num_node_connections"):
        load_config(raw)


def test_directory_update_source_needs_a_path():
    with pytest.raises(ConfigError, match="update_source.path: required"):
        load_config(_set(minimal(), "update_source.type", "directory"))
    cfg = load_config(_set(_set(minimal(), "update_source.type", "directory"), "update_source.path", "/u"))
    assert (cfg.update_source.type, cfg.update_source.path, cfg.update_source.poll_interval_ms) == (
        "directory",
        "/u",
        1000,
    )


def test_addresses_parse_host_and_port():
    cfg = load_config(_set(minimal(), "volatile_db.address", "10.0.0.1:7000, h2"))
    assert cfg.volatile_db.addresses == (("10.0.0.1", 7000), ("h2", 6379))


def test_unknown_model_and_table_lists_what_exists():
    cfg = load_config(minimal())
    with pytest.raises(ConfigError, match=r"'x' is not in the ps_config; its models are \['m'\]"):
        cfg.model("x")
    with pytest.raises(ConfigError, match=r"table_id 2 is out of range; it has 2 table\(s\)"):
        cfg.model("m").table_tag(2)


def test_file_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot be read"):
        load_config(tmp_path / "absent.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(ConfigError, match="is not valid JSON"):
        load_config(str(bad))


def test_num_partitions_is_bounded():
    assert load_config(_set(minimal(), "volatile_db.num_partitions", MAX_PARTITIONS)).volatile_db.num_partitions == (
        MAX_PARTITIONS
    )
    with pytest.raises(ConfigError) as e:
        load_config(_set(minimal(), "volatile_db.num_partitions", 10**8))
    assert f"volatile_db.num_partitions: expected an integer in [1, {MAX_PARTITIONS}]" in str(e.value)
    assert "got 100000000 (int)" in str(e.value)


def test_redis_connections_cannot_lift_num_partitions_past_the_bound():
    # An absent num_partitions of redis_cluster is raised to num_node_connections.
    raw = _set(minimal(), "volatile_db.type", "redis")
    raw["volatile_db"]["num_node_connections"] = MAX_PARTITIONS + 1
    with pytest.raises(
        ConfigError, match=rf"volatile_db\.num_node_connections: expected an integer in \[1, {MAX_PARTITIONS}\]"
    ):
        load_config(raw)


NON_FINITE = [float("nan"), float("inf"), float("-inf"), 10**400]


@pytest.mark.parametrize("value", [*NON_FINITE, 1e39], ids=["nan", "inf", "-inf", "10**400", "beyond-float32"])
def test_default_value_must_be_a_finite_float32(value):
    with pytest.raises(ConfigError) as e:
        load_config(minimal(default_value_for_each_table=[0.5, value]))
    message = str(e.value)
    assert "models[0].default_value_for_each_table[1] (model 'm')" in message
    assert "finite" in message and (repr(value) if value != 10**400 else "int") in message


def test_default_value_nan_and_infinity_written_in_the_json_file_are_refused(tmp_path):
    for literal in ("NaN", "1e999", "-Infinity"):
        path = tmp_path / f"{literal}.json"
        path.write_text(json.dumps(minimal()).replace("[1.5]", f"[{literal}]"))
        with pytest.raises(ConfigError, match=r"models\[0\]\.default_value_for_each_table\[0\] \(model 'm'\)"):
            load_config(path)


@pytest.mark.parametrize(
    "path",
    [
        "models[0].gpucacheper",
        "models[0].hit_rate_threshold",
        "models[0].cache_refresh_percentage_per_iteration",
        "models[0].refresh_delay",
        "volatile_db.overflow_resolution_target",
        "volatile_db.initial_cache_rate",
    ],
)
@pytest.mark.parametrize("value", NON_FINITE, ids=["nan", "inf", "-inf", "10**400"])
def test_every_float_key_refuses_non_finite_values(path, value):
    with pytest.raises(ConfigError) as e:
        load_config(_set(minimal(), path, value))
    assert str(e.value).startswith(f"{path}: expected a ") and f"got {value!r}" in str(e.value)


def test_a_binary_file_is_refused(tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ConfigError, match=r"model\.bin' is not UTF-8 text .*byte 0x80 at offset 128"):
        load_config(path)


def test_a_too_deeply_nested_file_is_refused(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ConfigError, match=r"deep\.json' nests arrays or objects too deeply"):
        load_config(path)


def test_an_integer_of_too_many_digits_is_refused(tmp_path):
    path = tmp_path / "digits.json"
    path.write_text('{"supportlonglong": true, "models": ' + "1" * 5000 + "}")
    with pytest.raises(ConfigError, match=r"digits\.json' cannot be parsed: .*4300 digits"):
        load_config(path)


@pytest.mark.parametrize(("text", "kind"), [("[1, 2]", "an array"), ('"ps"', "a string"), ("null", "null")])
def test_a_file_that_is_not_a_json_object_is_refused(tmp_path, text, kind):
    path = tmp_path / "top.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"top\.json' holds {kind}; a ps_config is a JSON object"):
        load_config(path)


def test_a_directory_and_an_empty_file_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=rf"{tmp_path.name}' cannot be read \(Is a directory\)"):
        load_config(tmp_path)
    empty = tmp_path / "empty.json"
    empty.write_text(" \n")
    with pytest.raises(ConfigError, match=r"empty\.json' is empty"):
        load_config(empty)


def test_a_device_that_never_ends_is_refused_after_the_size_limit(monkeypatch):
    monkeypatch.setattr(config_module, "MAX_CONFIG_BYTES", 4096)
    with pytest.raises(ConfigError, match=r"'/dev/zero' is larger than 4096 bytes"):
        load_config("/dev/zero")


def test_a_fifo_without_a_writer_does_not_hang(tmp_path):
    fifo = tmp_path / "ps.fifo"
    os.mkfifo(fifo)
    errors: list[BaseException] = []

    def load() -> None:
        try:
            load_config(fifo)
        except BaseException as e:  # noqa: BLE001 -- handed to the test thread
            errors.append(e)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(timeout=10)
    if thread.is_alive():
        os.close(os.open(fifo, os.O_WRONLY))  # a writer that closes at once: the blocked open returns
        thread.join(timeout=10)
        pytest.fail("load_config blocked on a FIFO without a writer")
    assert len(errors) == 1 and isinstance(errors[0], ConfigError), errors
    assert "ps.fifo' is empty" in str(errors[0])
