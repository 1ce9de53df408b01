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

import json
import logging
import os
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from hierarchical_parameter_server import config as config_module
from hierarchical_parameter_server.config import MAX_PARTITIONS, ConfigError, load_config

sys.path.insert(0, str(Path(__file__).parent))  # the helper modules beside the tests (importlib mode)

from ps_config_cases import (  # noqa: E402
    ALIAS_CASES,
    BAD_VALUES,
    CONFIGS,
    FLOAT_KEYS,
    HARD_MODEL_KEYS,
    HARD_TOP_LEVEL_KEYS,
    NON_FINITE,
    NON_FINITE_IDS,
    NON_FINITE_LITERALS,
    minimal,
    reference_section_4,
    with_alias,
    with_value,
    without,
)

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
    cfg = load_config(CONFIGS["empty-sections"])
    assert cfg.volatile_db == load_config(minimal()).volatile_db
    assert cfg.persistent_db == load_config(minimal()).persistent_db
    assert cfg.update_source == load_config(minimal()).update_source


def test_unit_test_config_of_reference_section_4(tmp_path):
    raw = reference_section_4()
    path = tmp_path / "hps.json"
    path.write_text(json.dumps(raw))
    cfg = load_config(path)
    assert cfg.supportlonglong is False
    assert [m.model for m in cfg.models] == ["foo", "bar"]
    for model in raw["models"]:
        m = cfg.model(model["model"])
        for key, value in model.items():
            got = getattr(m, key)
            assert (list(got) if isinstance(got, tuple) else got) == value, key
    assert cfg.model("bar").table_tag(1) == "hps_et.bar.sparse_embedding1"


@pytest.mark.parametrize(("section", "key", "alias", "canonical"), ALIAS_CASES)
def test_aliases_become_canonical_names(section, key, alias, canonical):
    assert getattr(getattr(load_config(with_alias(section, key, alias)), section), key) == canonical


def test_use_static_table_forces_the_static_cache():
    assert load_config(CONFIGS["static-table"]).model("m").embedding_cache_type == "static"


def test_unknown_key_is_warned_with_the_nearest_name(caplog):
    with caplog.at_level(logging.WARNING, logger="hierarchical_parameter_server.config"):
        cfg = load_config(CONFIGS["unknown-keys-near-valid-ones"])
    text = caplog.text
    assert "models[0].gpucacheperc" in text and "'gpucacheper'" in text
    assert "volatile_db.overflow_polcy" in text and "'overflow_policy'" in text
    assert cfg.model("m").gpucacheper == 0.2


def test_unknown_key_far_from_any_name_lists_the_valid_keys(caplog):
    with caplog.at_level(logging.WARNING, logger="hierarchical_parameter_server.config"):
        load_config(CONFIGS["unknown-key-far-from-valid-ones"])
    assert "zzzz" in caplog.text and "supportlonglong" in caplog.text


def test_keys_the_original_does_not_parse_are_ignored_with_a_note(caplog):
    with caplog.at_level(logging.WARNING, logger="hierarchical_parameter_server.config"):
        load_config(CONFIGS["keys-the-original-does-not-parse"])
    assert "models[0].slot_num is ignored" in caplog.text


@pytest.mark.parametrize(("path", "value", "words"), BAD_VALUES)
def test_bad_values_name_the_path(path, value, words):
    with pytest.raises(ConfigError) as e:
        load_config(with_value(minimal(), path, value))
    assert path in str(e.value) and words in str(e.value)


@pytest.mark.parametrize("key", HARD_MODEL_KEYS)
def test_missing_hard_model_key_is_named(key):
    with pytest.raises(ConfigError, match=rf"models\[0\]\.{key}: required"):
        load_config(without(minimal(), f"models[0].{key}"))


@pytest.mark.parametrize("key", HARD_TOP_LEVEL_KEYS)
def test_missing_hard_top_level_key_is_named(key):
    with pytest.raises(ConfigError, match=rf"^{key}: required"):
        load_config(without(minimal(), key))


def test_empty_models_and_duplicate_names_are_refused():
    with pytest.raises(ConfigError, match="models: expected a non-empty"):
        load_config(CONFIGS["empty-models"])
    with pytest.raises(ConfigError, match=r"models\[1\]\.model: 'm' is also the name of models\[0\]"):
        load_config(CONFIGS["duplicate-model-names"])


def test_redis_needs_as_many_partitions_as_connections():
    with pytest.raises(ConfigError, match="volatile_db.num_partitions: 2 .*num_node_connections"):
        load_config(CONFIGS["redis-with-too-few-partitions"])


def test_directory_update_source_needs_a_path():
    with pytest.raises(ConfigError, match="update_source.path: required"):
        load_config(CONFIGS["directory-source-without-path"])
    cfg = load_config(CONFIGS["directory-source"])
    assert (cfg.update_source.type, cfg.update_source.path, cfg.update_source.poll_interval_ms) == (
        "directory",
        "/u",
        1000,
    )


def test_addresses_parse_host_and_port():
    cfg = load_config(CONFIGS["addresses"])
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
    assert load_config(CONFIGS["most-partitions"]).volatile_db.num_partitions == MAX_PARTITIONS
    with pytest.raises(ConfigError) as e:
        load_config(CONFIGS["too-many-partitions"])
    assert f"volatile_db.num_partitions: expected an integer in [1, {MAX_PARTITIONS}]" in str(e.value)
    assert "got 100000000 (int)" in str(e.value)


def test_redis_connections_cannot_lift_num_partitions_past_the_bound():
    # An absent num_partitions of redis_cluster is raised to num_node_connections.
    with pytest.raises(
        ConfigError, match=rf"volatile_db\.num_node_connections: expected an integer in \[1, {MAX_PARTITIONS}\]"
    ):
        load_config(CONFIGS["redis-connections-beyond-the-partition-bound"])


@pytest.mark.parametrize("value", [*NON_FINITE, 1e39], ids=[*NON_FINITE_IDS, "beyond-float32"])
def test_default_value_must_be_a_finite_float32(value):
    with pytest.raises(ConfigError) as e:
        load_config(minimal(default_value_for_each_table=[0.5, value]))
    message = str(e.value)
    assert "models[0].default_value_for_each_table[1] (model 'm')" in message
    assert "finite" in message and (repr(value) if value != 10**400 else "int") in message


def test_default_value_nan_and_infinity_written_in_the_json_file_are_refused(tmp_path):
    for literal in NON_FINITE_LITERALS:
        path = tmp_path / f"{literal}.json"
        path.write_text(json.dumps(minimal()).replace("[1.5]", f"[{literal}]"))
        with pytest.raises(ConfigError, match=r"models\[0\]\.default_value_for_each_table\[0\] \(model 'm'\)"):
            load_config(path)


@pytest.mark.parametrize("path", FLOAT_KEYS)
@pytest.mark.parametrize("value", NON_FINITE, ids=NON_FINITE_IDS)
def test_every_float_key_refuses_non_finite_values(path, value):
    with pytest.raises(ConfigError) as e:
        load_config(with_value(minimal(), path, value))
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
