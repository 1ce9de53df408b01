"""The ``ps_config`` JSON of HPS: parsed, checked and filled with the original's defaults.

:func:`load_config` reads a file (or an already parsed ``dict``) into frozen dataclasses whose field
names are the JSON keys: :class:`PSConfig` at the top, one :class:`ModelConfig` per entry of
``models``, and :class:`VolatileDBConfig`, :class:`PersistentDBConfig` and
:class:`UpdateSourceConfig` for the tiers and the update source.

* Every key of HPS's parser is known here and gets the original's default when absent; the keys
  the original requires (``supportlonglong``, ``models``, and per model ``sparse_files``,
  ``deployed_device_list``, ``embedding_vecsize_per_table``,
  ``maxnum_catfeature_query_per_table_per_sample``, ``default_value_for_each_table``) are required.
* Aliases of type and policy strings (``"redis"``, ``"rocksdb"``, ``"least_used"``, ...) become the
  canonical names.
* A key this parser does not know is logged as a warning that names the nearest valid key; it is
  otherwise ignored, as the original ignores it.
* A wrong JSON type or an impossible value raises :class:`ConfigError` naming the key's path
  (``models[1].gpucacheper``), the value and what is valid. Every number must be finite (JSON
  ``NaN`` and ``1e999`` are refused), a ``default_value_for_each_table`` must fit a float32, and
  ``volatile_db.num_partitions`` is at most :data:`MAX_PARTITIONS`.
* A file that is not a ps_config (missing, a directory, not UTF-8, empty, over
  :data:`MAX_CONFIG_BYTES`, nested too deeply to parse, not a JSON object) raises
  :class:`ConfigError` naming the file. A FIFO without a writer reads as empty instead of blocking.

Where this parser differs from the original on purpose (the original's behaviour in brackets):

* an unknown ``type`` string of ``volatile_db`` or ``persistent_db`` is an error [silently
  ``disabled``]; so is an unknown ``embedding_cache_type`` [silently ``dynamic``];
* a ``volatile_db`` object without ``type`` is a ``parallel_hash_map`` like an absent one
  [``disabled``, a quirk of the original's struct default];
* ``update_filters`` are regular expressions on the model name, default ``[".+"]`` [the default
  ``"^hps_.+$"`` matches no table];
* the update source is ``"directory"`` (files of :mod:`hierarchical_parameter_server.updates`);
  ``kafka_message_queue`` is refused [Kafka];
* for ``redis_cluster`` an absent ``num_partitions`` is at least ``num_node_connections`` [the
  default ``min(16, cores)`` can be below it and then fails];
* ``multi_process_hash_map`` is refused (use ``parallel_hash_map`` or ``redis_cluster``);
* the lengths of ``maxnum_catfeature_query_per_table_per_sample`` and ``embedding_table_names``
  must equal the number of tables, ``default_value_for_each_table`` may not be longer, and
  ``deployed_device_list`` may not repeat a device [unchecked].

Example::

    from hierarchical_parameter_server.config import load_config

    cfg = load_config({
        "supportlonglong": True,
        "models": [{
            "model": "demo", "sparse_files": ["demo_sparse/emb0"], "deployed_device_list": [0],
            "embedding_vecsize_per_table": [16],
            "maxnum_catfeature_query_per_table_per_sample": [26],
            "default_value_for_each_table": [0.0],
        }],
    })
    cfg.model("demo").table_tag(0)       # 'hps_et.demo.sparse_embedding0'
    cfg.volatile_db.type                 # 'parallel_hash_map'
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import logging
import math
import os
import re
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ConfigError",
    "ModelConfig",
    "PSConfig",
    "PersistentDBConfig",
    "UpdateSourceConfig",
    "VolatileDBConfig",
    "load_config",
    "parse_address",
]

log = logging.getLogger(__name__)

#: Model and table names: the characters the original allows in a table tag.
NAME_PATTERN = re.compile(r"[a-zA-Z0-9_\-]{1,120}")
#: ``overflow_margin``'s default: no limit (the original's ``SIZE_MAX``).
NO_OVERFLOW_LIMIT = 2**64 - 1
#: The most partitions per table (``volatile_db.num_partitions``): Redis cluster's 16384 hash slots.
#: A partition is one Redis hash, which lives in one slot, so more partitions spread no further.
MAX_PARTITIONS = 16384
#: The largest float32, the dtype of every row: the bound of ``default_value_for_each_table``.
FLOAT32_MAX = float.fromhex("0x1.fffffep+127")
#: The most bytes of a ps_config file read (a ps_config is a few KiB; this stops e.g. ``/dev/zero``).
MAX_CONFIG_BYTES = 64 * 2**20
#: The longest ``update_source.poll_interval_ms``: a day (longer waits overflow the poller's timer).
MAX_POLL_INTERVAL_MS = 24 * 3600 * 1000
#: The most threads of a model's background pool (``thread_pool_size``).
MAX_THREAD_POOL_SIZE = 1024
#: Redis pipelines longer than this many commands are not advised (reference §2.3).
REDIS_MAX_BATCH = 262143

VOLATILE_TYPES = {
    "disabled": ("disable", "none"),
    "hash_map": ("hashmap", "hash", "map"),
    "parallel_hash_map": ("parallel_hashmap", "parallel_hash", "parallel_map"),
    "redis_cluster": ("redis",),
}
PERSISTENT_TYPES = {"disabled": ("disable", "none"), "rocks_db": ("rocksdb", "rocks")}
UPDATE_SOURCE_TYPES = {"null": ("none",), "directory": ("dir", "directory_watcher")}
OVERFLOW_POLICIES = {
    "evict_random": ("random",),
    "evict_least_used": ("least_used",),
    "evict_oldest": ("oldest",),
}
CACHE_TYPES = {"dynamic": (), "static": (), "uvm": (), "stochastic": ()}

# Values the original accepts that this package refuses, with the reason and the fix.
_NO_MULTI_PROCESS = (
    "the multi-process hash map is not supported here; use 'parallel_hash_map' (one process) or "
    "'redis_cluster' (shared between processes)"
)
_NO_KAFKA = (
    "Kafka is not supported here; the update source is 'directory' (files written by "
    "hierarchical_parameter_server.updates.write_update or dump_increment)"
)
_REFUSED = {
    **dict.fromkeys(
        ("multi_process_hash_map", "multi_process_hashmap", "multi_process_hash", "multi_process_map"),
        _NO_MULTI_PROCESS,
    ),
    **dict.fromkeys(("kafka_message_queue", "kafka_mq", "kafka"), _NO_KAFKA),
}

# Keys of the original's documentation or of its Kafka source that are accepted and not used.
_IGNORED = {
    "network_file": "not parsed by HPS",
    "label_dim": "not parsed by HPS",
    "slot_num": "not parsed by HPS",
    "brokers": "Kafka is not supported",
    "metadata_refresh_interval_ms": "Kafka is not supported",
    "receive_buffer_size": "Kafka is not supported",
    "poll_timeout_ms": "Kafka is not supported",
    "failure_backoff_ms": "Kafka is not supported",
    "max_commit_interval": "Kafka is not supported",
    # update_source.max_batch_size: the Kafka consumer's buffer (the other sections know the key).
    "max_batch_size": "Kafka is not supported",
}


class ConfigError(ValueError):
    """A ps_config that cannot be served: the message names the key's path, the value and what is
    valid.

    Example::

        try:
            load_config({"supportlonglong": "yes", "models": []})
        except ConfigError as e:
            print(e)  # supportlonglong: expected true or false, got 'yes' (str) ...
    """


# The default of a key that must be present.
_REQUIRED = object()


def _describe(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def _finite(value: Any) -> float | None:
    """``value`` as a float when it is a finite JSON number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer beyond float's range, e.g. 10**400
        return None
    return number if math.isfinite(number) else None


class _Reader:
    """Reads the keys of one JSON object at ``path``; remembers which keys it was asked for so that
    :meth:`finish` can warn about the others."""

    def __init__(self, obj: Any, path: str) -> None:
        if not isinstance(obj, Mapping):
            raise ConfigError(f"{path or 'ps_config'}: expected a JSON object, got {_describe(obj)}")
        self.obj = obj
        self.path = path
        self.known: set[str] = set()

    def where(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def error(self, key: str, value: Any, valid: str) -> ConfigError:
        return ConfigError(f"{self.where(key)}: {valid}, got {_describe(value)}")

    def raw(self, key: str, default: Any) -> Any:
        self.known.add(key)
        if key in self.obj:
            return self.obj[key]
        if default is _REQUIRED:
            raise ConfigError(f"{self.where(key)}: required key is missing; add it to the JSON object")
        log.debug("%s is not specified, using the default %r", self.where(key), default)
        return default

    def boolean(self, key: str, default: Any = _REQUIRED) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise self.error(key, value, "expected true or false")
        return value

    def integer(self, key: str, default: Any = _REQUIRED, minimum: int = 0, maximum: int | None = None) -> int:
        value = self.raw(key, default)
        bounds = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        valid = f"expected an integer {bounds}"
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, value, valid)
        if value < minimum or (maximum is not None and value > maximum):
            raise self.error(key, value, valid)
        return value

    def number(
        self, key: str, default: Any = _REQUIRED, low: float = 0.0, high: float = float("inf"), low_open=False
    ) -> float:
        value = self.raw(key, default)
        if high == float("inf"):
            valid = f"expected a finite number {'>' if low_open else '>='} {low}"
        else:
            valid = f"expected a finite number in {'(' if low_open else '['}{low}, {high}]"
        number = _finite(value)
        if number is None or not low <= number <= high or (low_open and number == low):
            raise self.error(key, value, valid)
        return number

    def string(self, key: str, default: Any = _REQUIRED, nonempty: bool = False) -> str:
        value = self.raw(key, default)
        if not isinstance(value, str) or (nonempty and not value):
            raise self.error(key, value, "expected a non-empty string" if nonempty else "expected a string")
        return value

    def choice(self, key: str, default: Any, choices: Mapping[str, tuple[str, ...]]) -> str:
        value = self.raw(key, default)
        valid = ", ".join(repr(c) for c in choices)
        if not isinstance(value, str):
            raise self.error(key, value, f"expected one of {valid}")
        lowered = value.lower()
        for name, aliases in choices.items():
            if lowered == name or lowered in aliases:
                return name
        if lowered in _REFUSED:
            raise ConfigError(f"{self.where(key)}: {value!r} is refused: {_REFUSED[lowered]}")
        raise self.error(key, value, f"expected one of {valid} (or an alias of them)")

    def array(
        self, key: str, item: Callable[[str, Any], Any], default: Any = _REQUIRED, nonempty: bool = True
    ) -> tuple:
        value = self.raw(key, default)
        if not isinstance(value, (list, tuple)) or (nonempty and not value):
            raise self.error(key, value, "expected a non-empty JSON array" if nonempty else "expected a JSON array")
        return tuple(item(f"{self.where(key)}[{i}]", v) for i, v in enumerate(value))

    def finish(self) -> None:
        for key in self.obj:
            if key in self.known:
                continue
            where = self.where(key)
            if key in _IGNORED:
                log.warning("ps_config: %s is ignored (%s)", where, _IGNORED[key])
                continue
            near = difflib.get_close_matches(key, sorted(self.known), n=1, cutoff=0.6)
            hint = f"; did you mean {near[0]!r}?" if near else f"; valid keys: {', '.join(sorted(self.known))}"
            log.warning("ps_config: unknown key %s is ignored%s", where, hint)


def _int_item(minimum: int) -> Callable[[str, Any], int]:
    def check(where: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(f"{where}: expected an integer >= {minimum}, got {_describe(value)}")
        return value

    return check


def _default_value_item(model: str) -> Callable[[str, Any], float]:
    """Checks one entry of ``model``'s ``default_value_for_each_table``: the value of every row of a
    key no tier holds, so it must be a finite float32."""

    def check(where: str, value: Any) -> float:
        number = _finite(value)
        if number is None or abs(number) > FLOAT32_MAX:
            raise ConfigError(
                f"{where} (model {model!r}): expected a finite number within float32's range "
                f"(|value| <= {FLOAT32_MAX:.8g}), got {_describe(value)}; it fills the rows of keys no tier holds"
            )
        return number

    return check


def _str_item(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: expected a non-empty string, got {_describe(value)}")
    return value


def _name_item(where: str, value: Any) -> str:
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
        raise ConfigError(
            f"{where}: expected a name of 1 to 120 letters, digits, '_' or '-' (it becomes part of the table "
            f"tag hps_et.<model>.<table>), got {_describe(value)}"
        )
    return value


def _regex_item(where: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{where}: expected a regular expression (a string), got {_describe(value)}")
    try:
        re.compile(value)
    except re.error as e:
        raise ConfigError(f"{where}: {value!r} is not a valid regular expression ({e})") from e
    return value


@dataclass(frozen=True)
class ModelConfig:
    """One entry of ``models``: a model's tables and how they are served.

    Example::

        m = load_config("ps.json").model("foo")
        m.num_tables, m.embedding_vecsize_per_table   # (1, (16,))
        m.table_tag(0)                                # 'hps_et.foo.sparse_embedding0'
    """

    model: str
    sparse_files: tuple[str, ...]
    deployed_device_list: tuple[int, ...]
    embedding_vecsize_per_table: tuple[int, ...]
    maxnum_catfeature_query_per_table_per_sample: tuple[int, ...]
    #: One scalar per table, padded with 0.0 to the number of tables.
    default_value_for_each_table: tuple[float, ...]
    #: Default ``sparse_embedding0``, ``sparse_embedding1``, ...
    embedding_table_names: tuple[str, ...]
    dense_file: str = ""
    max_batch_size: int = 64
    gpucache: bool = True
    gpucacheper: float = 0.2
    hit_rate_threshold: float = 0.9
    cache_refresh_percentage_per_iteration: float = 0.0
    num_of_worker_buffer_in_pool: int = 1
    num_of_refresher_buffer_in_pool: int = 1
    thread_pool_size: int = 16
    embedding_cache_type: str = "dynamic"
    use_static_table: bool = False
    use_context_stream: bool = True
    use_hctr_cache_implementation: bool = True
    init_ec: bool = True
    enable_pagelock: bool = False
    fp8_quant: bool = False
    fuse_embedding_table: bool = True
    maxnum_des_feature_per_sample: int = 26
    refresh_delay: float = 0.0
    refresh_interval: int = 0

    @property
    def has_cache(self) -> bool:
        """Whether the model's tables have a cache in front of the databases: ``gpucache`` true and
        ``gpucacheper`` above 0 (NVIDIA HPS's ``gpucacheper`` 0.0 means none, as ``gpucache: false``)."""
        return self.gpucache and self.gpucacheper > 0.0

    @property
    def num_tables(self) -> int:
        """The number of embedding tables (``len(sparse_files)``)."""
        return len(self.sparse_files)

    def table_tag(self, table_id: int) -> str:
        """The table's tag in every tier: ``hps_et.<model>.<table name>``.

        Raises:
            ConfigError: ``table_id`` is not in ``[0, num_tables)``.
        """
        if isinstance(table_id, bool) or not isinstance(table_id, int) or not 0 <= table_id < self.num_tables:
            raise ConfigError(
                f"model {self.model!r}: table_id {table_id!r} is out of range; it has {self.num_tables} "
                f"table(s), ids 0..{self.num_tables - 1}"
            )
        return f"hps_et.{self.model}.{self.embedding_table_names[table_id]}"


@dataclass(frozen=True)
class VolatileDBConfig:
    """``volatile_db``: the in-memory tier below the embedding cache.

    ``overflow_margin`` is the most entries per partition (:data:`NO_OVERFLOW_LIMIT`: none); on
    overflow a partition is evicted down to ``round(overflow_margin * overflow_resolution_target)``
    by ``overflow_policy``. ``update_filters`` are regexes on the model name.
    """

    type: str = "parallel_hash_map"
    address: str = "127.0.0.1:7000"
    user_name: str = "default"
    password: str = ""
    num_partitions: int = field(default_factory=lambda: min(16, os.cpu_count() or 1))
    allocation_rate: int = 268435456
    shared_memory_size: int = 17179869184
    shared_memory_name: str = "hctr_mp_hash_map_database"
    shared_memory_auto_remove: bool = True
    num_node_connections: int = 5
    max_batch_size: int = 65536
    enable_tls: bool = False
    tls_ca_certificate: str = "cacertbundle.crt"
    tls_client_certificate: str = "client_cert.pem"
    tls_client_key: str = "client_key.pem"
    tls_server_name_identification: str = "redis.localhost"
    overflow_margin: int = NO_OVERFLOW_LIMIT
    overflow_policy: str = "evict_random"
    overflow_resolution_target: float = 0.8
    initial_cache_rate: float = 1.0
    cache_missed_embeddings: bool = False
    update_filters: tuple[str, ...] = (".+",)
    initialize_after_startup: bool = True

    @property
    def addresses(self) -> tuple[tuple[str, int], ...]:
        """``address`` as ``(host, port)`` pairs (port 6379 where none is given).

        Example::

            VolatileDBConfig(address="10.0.0.1:7000,10.0.0.2").addresses
            # (('10.0.0.1', 7000), ('10.0.0.2', 6379))
        """
        return tuple(parse_address(a) for a in self.address.split(","))


@dataclass(frozen=True)
class PersistentDBConfig:
    """``persistent_db``: the on-disk tier (RocksDB) below the volatile DB."""

    type: str = "disabled"
    path: str = field(default_factory=lambda: os.path.join(tempfile.gettempdir(), "rocksdb"))
    num_threads: int = 16
    read_only: bool = False
    max_batch_size: int = 65536
    update_filters: tuple[str, ...] = (".+",)
    initialize_after_startup: bool = True


@dataclass(frozen=True)
class UpdateSourceConfig:
    """``update_source``: where online updates come from. ``"directory"`` watches ``path`` for
    files of :mod:`hierarchical_parameter_server.updates`, every ``poll_interval_ms``."""

    type: str = "null"
    path: str = ""
    poll_interval_ms: int = 1000


@dataclass(frozen=True)
class PSConfig:
    """A whole ps_config. ``supportlonglong``: int64 ids (true) or int32 ids (false).

    Example::

        cfg = load_config("ps.json")
        [m.model for m in cfg.models]      # ['foo', 'bar']
        cfg.model("bar").num_tables        # 2
    """

    supportlonglong: bool
    models: tuple[ModelConfig, ...]
    volatile_db: VolatileDBConfig = field(default_factory=VolatileDBConfig)
    persistent_db: PersistentDBConfig = field(default_factory=PersistentDBConfig)
    update_source: UpdateSourceConfig = field(default_factory=UpdateSourceConfig)
    fuse_embedding_table: bool = False

    def model(self, name: str) -> ModelConfig:
        """The model called ``name``.

        Raises:
            ConfigError: no model has that name (the message lists the names).
        """
        for m in self.models:
            if m.model == name:
                return m
        raise ConfigError(
            f"model {name!r} is not in the ps_config; its models are {[m.model for m in self.models]}. "
            "Pass one of them as model_name, or add the model to the ps_config."
        )


def parse_address(entry: str) -> tuple[str, int]:
    """One ``host[:port]`` entry of ``volatile_db.address`` as ``(host, port)`` (port 6379 when absent).

    Example::

        parse_address("10.0.0.1:7000")   # ('10.0.0.1', 7000)
    """
    host, sep, port = entry.strip().rpartition(":")
    if not sep:
        host, port = port, "6379"
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(
            f"volatile_db.address: {entry!r} is not host[:port] (port 1..65535); write e.g. '127.0.0.1:7000'"
        )
    return host, int(port)


# How each key with a default is read: a _Reader method with the key's checks, called as
# read(reader, key, default=...). The defaults are the dataclasses' (one source of truth).
_Read = Callable[..., Any]
_POSITIVE: _Read = functools.partial(_Reader.integer, minimum=1)
_NONEMPTY_STRING: _Read = functools.partial(_Reader.string, nonempty=True)
_PARTITION_COUNT: _Read = functools.partial(_Reader.integer, minimum=1, maximum=MAX_PARTITIONS)
_FRACTION: _Read = functools.partial(_Reader.number, high=1.0)  # [0, 1]
_OPEN_FRACTION: _Read = functools.partial(_Reader.number, high=1.0, low_open=True)  # (0, 1]
_FILTERS: _Read = functools.partial(_Reader.array, item=_regex_item, nonempty=False)

# Read in this order (the first bad key is the one reported).
_MODEL_READS: dict[str, _Read] = {
    "embedding_cache_type": functools.partial(_Reader.choice, choices=CACHE_TYPES),
    "use_static_table": _Reader.boolean,
    "dense_file": _Reader.string,
    "max_batch_size": _POSITIVE,
    "gpucache": _Reader.boolean,
    "gpucacheper": _FRACTION,
    "hit_rate_threshold": _Reader.number,
    "cache_refresh_percentage_per_iteration": _FRACTION,
    "num_of_worker_buffer_in_pool": _POSITIVE,
    "num_of_refresher_buffer_in_pool": _POSITIVE,
    "thread_pool_size": functools.partial(_Reader.integer, minimum=1, maximum=MAX_THREAD_POOL_SIZE),
    "use_context_stream": _Reader.boolean,
    "use_hctr_cache_implementation": _Reader.boolean,
    "init_ec": _Reader.boolean,
    "enable_pagelock": _Reader.boolean,
    "fp8_quant": _Reader.boolean,
    "fuse_embedding_table": _Reader.boolean,
    "maxnum_des_feature_per_sample": _Reader.integer,
    "refresh_delay": _Reader.number,
    "refresh_interval": _Reader.integer,
}
_VOLATILE_READS: dict[str, _Read] = {
    "type": functools.partial(_Reader.choice, choices=VOLATILE_TYPES),
    "address": _NONEMPTY_STRING,
    "user_name": _Reader.string,
    "password": _Reader.string,
    "num_partitions": _PARTITION_COUNT,
    "allocation_rate": _POSITIVE,
    "shared_memory_size": _POSITIVE,
    "shared_memory_name": _Reader.string,
    "shared_memory_auto_remove": _Reader.boolean,
    # At most num_partitions for Redis, which an absent num_partitions is raised to.
    "num_node_connections": _PARTITION_COUNT,
    "max_batch_size": _POSITIVE,
    "enable_tls": _Reader.boolean,
    "tls_ca_certificate": _Reader.string,
    "tls_client_certificate": _Reader.string,
    "tls_client_key": _Reader.string,
    "tls_server_name_identification": _Reader.string,
    "overflow_margin": functools.partial(_Reader.integer, minimum=1, maximum=NO_OVERFLOW_LIMIT),
    "overflow_policy": functools.partial(_Reader.choice, choices=OVERFLOW_POLICIES),
    "overflow_resolution_target": _OPEN_FRACTION,
    "initial_cache_rate": _FRACTION,
    "cache_missed_embeddings": _Reader.boolean,
    "update_filters": _FILTERS,
    "initialize_after_startup": _Reader.boolean,
}
_PERSISTENT_READS: dict[str, _Read] = {
    "type": functools.partial(_Reader.choice, choices=PERSISTENT_TYPES),
    "path": _NONEMPTY_STRING,
    "num_threads": _POSITIVE,
    "read_only": _Reader.boolean,
    "max_batch_size": _POSITIVE,
    "update_filters": _FILTERS,
    "initialize_after_startup": _Reader.boolean,
}
_UPDATE_SOURCE_READS: dict[str, _Read] = {
    "type": functools.partial(_Reader.choice, choices=UPDATE_SOURCE_TYPES),
    "path": _Reader.string,
    "poll_interval_ms": functools.partial(_Reader.integer, minimum=1, maximum=MAX_POLL_INTERVAL_MS),
}


def _read_fields(r: _Reader, cls: type, reads: Mapping[str, _Read]) -> dict[str, Any]:
    """The keys of ``reads`` from ``r``, each with its default in the dataclass ``cls``."""
    defaults = {
        f.name: f.default_factory() if f.default is dataclasses.MISSING else f.default
        for f in dataclasses.fields(cls)
        if f.name in reads
    }
    return {key: read(r, key, default=defaults[key]) for key, read in reads.items()}


def _section(obj: Any, path: str, cls: type, reads: Mapping[str, _Read]) -> Any:
    """The section ``path`` of the ps_config (``obj``: its JSON object, None when absent) as ``cls``."""
    if obj is None:
        return cls()
    r = _Reader(obj, path)
    cfg = cls(**_read_fields(r, cls, reads))
    r.finish()
    return cfg


def _model(obj: Any, path: str) -> ModelConfig:
    r = _Reader(obj, path)
    name = r.raw("model", "")
    _name_item(r.where("model"), name)
    sparse_files = r.array("sparse_files", _str_item)
    n = len(sparse_files)

    def tables(key: str, item: Callable[[str, Any], Any], default: Any = _REQUIRED) -> tuple:
        values = r.array(key, item, default)
        if len(values) != n:
            raise ConfigError(
                f"{r.where(key)}: has {len(values)} entries, expected one per table of sparse_files ({n})"
            )
        return values

    dims = tables("embedding_vecsize_per_table", _int_item(1))
    maxnum = tables("maxnum_catfeature_query_per_table_per_sample", _int_item(1))
    defaults = r.array("default_value_for_each_table", _default_value_item(name), nonempty=False)
    if len(defaults) > n:
        raise ConfigError(
            f"{r.where('default_value_for_each_table')}: has {len(defaults)} entries for {n} table(s); "
            "give at most one per table (missing ones are 0.0)"
        )
    names = tables("embedding_table_names", _name_item, [f"sparse_embedding{i}" for i in range(n)])
    if len(set(names)) != n:
        raise ConfigError(f"{r.where('embedding_table_names')}: names repeat in {list(names)}; make them unique")
    devices = r.array("deployed_device_list", _int_item(0))
    if len(set(devices)) != len(devices):
        raise ConfigError(f"{r.where('deployed_device_list')}: devices repeat in {list(devices)}")
    optional = _read_fields(r, ModelConfig, _MODEL_READS)
    if optional["use_static_table"]:
        # use_static_table forces the static cache, as in the original.
        optional["embedding_cache_type"] = "static"
    cfg = ModelConfig(
        model=name,
        sparse_files=sparse_files,
        deployed_device_list=devices,
        embedding_vecsize_per_table=dims,
        maxnum_catfeature_query_per_table_per_sample=maxnum,
        default_value_for_each_table=defaults + (0.0,) * (n - len(defaults)),
        embedding_table_names=names,
        **optional,
    )
    r.finish()
    return cfg


def _volatile_db(obj: Any) -> VolatileDBConfig:
    cfg = _section(obj, "volatile_db", VolatileDBConfig, _VOLATILE_READS)
    cfg.addresses  # noqa: B018 -- checks every host[:port] entry now, not at connect time
    if cfg.type == "redis_cluster":
        if "num_partitions" not in obj and cfg.num_partitions < cfg.num_node_connections:
            # The default (cores, at most 16) can be below the default 5 connections on small machines.
            cfg = dataclasses.replace(cfg, num_partitions=cfg.num_node_connections)
        if cfg.num_partitions < cfg.num_node_connections:
            raise ConfigError(
                f"volatile_db.num_partitions: {cfg.num_partitions} is below num_node_connections "
                f"({cfg.num_node_connections}); Redis needs num_partitions >= num_node_connections"
            )
        if cfg.max_batch_size > REDIS_MAX_BATCH:
            log.warning(
                "ps_config: volatile_db.max_batch_size %d is above %d, which Redis pipelines handle badly",
                cfg.max_batch_size,
                REDIS_MAX_BATCH,
            )
    return cfg


def _persistent_db(obj: Any) -> PersistentDBConfig:
    return _section(obj, "persistent_db", PersistentDBConfig, _PERSISTENT_READS)


def _update_source(obj: Any) -> UpdateSourceConfig:
    cfg = _section(obj, "update_source", UpdateSourceConfig, _UPDATE_SOURCE_READS)
    if cfg.type == "directory" and not cfg.path:
        raise ConfigError("update_source.path: required when type is 'directory'; give the directory to watch")
    return cfg


def _parse(obj: Any) -> PSConfig:
    r = _Reader(obj, "")
    supportlonglong = r.boolean("supportlonglong")
    models_raw = r.raw("models", _REQUIRED)
    if not isinstance(models_raw, list) or not models_raw:
        raise r.error("models", models_raw, "expected a non-empty JSON array of model objects")
    models = tuple(_model(m, f"models[{i}]") for i, m in enumerate(models_raw))
    seen: dict[str, int] = {}
    for i, m in enumerate(models):
        if m.model in seen:
            raise ConfigError(
                f"models[{i}].model: {m.model!r} is also the name of models[{seen[m.model]}]; model names "
                "must be unique"
            )
        seen[m.model] = i
    cfg = PSConfig(
        supportlonglong=supportlonglong,
        models=models,
        volatile_db=_volatile_db(r.raw("volatile_db", None)),
        persistent_db=_persistent_db(r.raw("persistent_db", None)),
        update_source=_update_source(r.raw("update_source", None)),
        fuse_embedding_table=r.boolean("fuse_embedding_table", False),
    )
    r.finish()
    return cfg


# What json.loads makes of each JSON type, for messages.
_JSON_KINDS = {
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


def _read_bytes(path: str) -> bytes:
    """Up to ``MAX_CONFIG_BYTES + 1`` bytes of the file at ``path``. It is opened non-blocking, so
    that a FIFO without a writer reads as empty instead of blocking, then read blocking."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            os.set_blocking(fd, True)
            return f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"ps_config file {path!r} cannot be read ({e.strerror}); pass the path of a JSON file") from e


def _read_json(path: str) -> Any:
    """The JSON value of the file at ``path``, or ConfigError saying why there is none."""
    data = _read_bytes(path)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"ps_config file {path!r} is larger than {MAX_CONFIG_BYTES} bytes; a ps_config is a small JSON file, "
            "pass its path"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"ps_config file {path!r} is not UTF-8 text (byte {data[e.start]:#04x} at offset {e.start}); is it a "
            "binary file? Pass the path of a JSON ps_config"
        ) from e
    if not text.strip():
        raise ConfigError(f"ps_config file {path!r} is empty; write the ps_config's JSON object into it")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"ps_config file {path!r} is not valid JSON: {e}") from e
    except RecursionError as e:
        raise ConfigError(
            f"ps_config file {path!r} nests arrays or objects too deeply to parse; a ps_config nests 4 levels deep"
        ) from e
    except ValueError as e:  # e.g. an integer of more digits than sys.get_int_max_str_digits()
        raise ConfigError(f"ps_config file {path!r} cannot be parsed: {e}") from e


def load_config(source: str | os.PathLike | Mapping[str, Any]) -> PSConfig:
    """Read and check a ps_config.

    Args:
        source: the path of a JSON file, or the parsed JSON object.

    Returns:
        The config, with every absent key at the original's default.

    Raises:
        ConfigError: the file cannot be read, is not UTF-8 JSON text of at most
            :data:`MAX_CONFIG_BYTES` whose top level is an object; a required key is missing, a
            value has the wrong type or an impossible value (the message names the key's path,
            e.g. ``models[1].gpucacheper``).

    Example::

        cfg = load_config("hps.json")
        cfg.model("foo").hit_rate_threshold    # 1.0
    """
    if isinstance(source, Mapping):
        return _parse(source)
    path = os.fspath(source)
    obj = _read_json(path)
    if not isinstance(obj, dict):
        raise ConfigError(
            f"ps_config file {path!r} holds {_JSON_KINDS[type(obj)]}; a ps_config is a JSON object "
            '{"supportlonglong": ..., "models": [...]}'
        )
    return _parse(obj)
