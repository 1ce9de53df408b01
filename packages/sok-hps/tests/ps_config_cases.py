"""The ps_config cases of test_config.py; test_ps_config_cpp.py makes its configs with the same
helpers.

Example::

    from ps_config_cases import BAD_VALUES, minimal, with_value

    raw = with_value(minimal(), "volatile_db.type", "redis")   # a copy; minimal() is unchanged
"""

from __future__ import annotations

import copy

from hierarchical_parameter_server.config import MAX_PARTITIONS, MAX_POLL_INTERVAL_MS, MAX_THREAD_POOL_SIZE


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


def with_value(raw: dict, path: str, value) -> dict:
    """A copy of ``raw`` with ``value`` at ``path`` (``models[0].gpucacheper``; sections are made)."""
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


def reference_section_4() -> dict:
    """The unit-test config of reference §4: models foo (one table) and bar (two)."""
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
    return {"supportlonglong": False, "models": [foo, bar]}


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
ALIAS_CASES = [
    (section, key, alias, name) for (section, key), names in ALIASES.items() for alias, name in names.items()
]


def with_alias(section: str, key: str, alias: str) -> dict:
    """minimal() with ``section.key`` set to ``alias`` (and the path a directory source needs)."""
    raw = minimal()
    raw[section] = {key: alias, "path": "/tmp/x"} if section == "update_source" else {key: alias}
    return raw


# (path, bad value, words of the message)
BAD_VALUES = [
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
]

HARD_MODEL_KEYS = [
    "sparse_files",
    "deployed_device_list",
    "embedding_vecsize_per_table",
    "maxnum_catfeature_query_per_table_per_sample",
    "default_value_for_each_table",
]
HARD_TOP_LEVEL_KEYS = ["supportlonglong", "models"]


def without(raw: dict, path: str) -> dict:
    """A copy of ``raw`` without the key at ``path`` (``models[0].sparse_files``, ``models``)."""
    raw = copy.deepcopy(raw)
    *parents, last = path.split(".")
    node = raw
    for p in parents:
        name, index = p[:-1].split("[")
        node = node[name][int(index)]
    del node[last]
    return raw


NON_FINITE = [float("nan"), float("inf"), float("-inf"), 10**400]
NON_FINITE_IDS = ["nan", "inf", "-inf", "10**400"]
FLOAT_KEYS = [
    "models[0].gpucacheper",
    "models[0].hit_rate_threshold",
    "models[0].cache_refresh_percentage_per_iteration",
    "models[0].refresh_delay",
    "volatile_db.overflow_resolution_target",
    "volatile_db.initial_cache_rate",
]
# JSON literals of numbers no float32 holds, written into a file in place of a default value.
NON_FINITE_LITERALS = ["NaN", "1e999", "-Infinity"]


def _redis(**volatile) -> dict:
    raw = with_value(minimal(), "volatile_db.type", "redis")
    raw["volatile_db"].update(volatile)
    return raw


def _duplicate_model() -> dict:
    raw = minimal()
    raw["models"].append(copy.deepcopy(raw["models"][0]))
    return raw


# The other configs test_config.py loads, by name.
CONFIGS = {
    "empty-sections": dict(minimal(), volatile_db={}, persistent_db={}, update_source={}),
    "static-table": minimal(use_static_table=True),
    "unknown-keys-near-valid-ones": with_value(minimal(gpucacheperc=0.5), "volatile_db.overflow_polcy", "oldest"),
    "unknown-key-far-from-valid-ones": dict(minimal(), zzzz=1),
    "keys-the-original-does-not-parse": minimal(slot_num=3, network_file="x.json"),
    "empty-models": {"supportlonglong": True, "models": []},
    "duplicate-model-names": _duplicate_model(),
    "redis-with-too-few-partitions": _redis(num_partitions=2, num_node_connections=5),
    "directory-source-without-path": with_value(minimal(), "update_source.type", "directory"),
    "directory-source": with_value(
        with_value(minimal(), "update_source.type", "directory"), "update_source.path", "/u"
    ),
    "addresses": with_value(minimal(), "volatile_db.address", "10.0.0.1:7000, h2"),
    "most-partitions": with_value(minimal(), "volatile_db.num_partitions", MAX_PARTITIONS),
    "too-many-partitions": with_value(minimal(), "volatile_db.num_partitions", 10**8),
    "redis-connections-beyond-the-partition-bound": _redis(num_node_connections=MAX_PARTITIONS + 1),
    "beyond-float32-default": minimal(default_value_for_each_table=[0.5, 1e39]),
}
