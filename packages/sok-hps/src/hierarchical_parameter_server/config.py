"""The ``ps_config`` JSON of HPS: read, checked and filled with the original's defaults.

The reader is C++ (``csrc/serving/ps_config.cpp``, called through
``hierarchical_parameter_server._serving``): the C++ server reads a ps_config with the same code,
so the Python and the C++ sides cannot read one differently. :func:`load_config` calls it on a file
(or an already parsed ``dict``) and makes frozen dataclasses of what it returns, whose field names
are the JSON keys: :class:`PSConfig` at the top, one :class:`ModelConfig` per entry of ``models``,
and :class:`VolatileDBConfig`, :class:`PersistentDBConfig` and :class:`UpdateSourceConfig` for the
tiers and the update source.

* Every key of HPS's parser is known and gets the original's default when absent; the keys the
  original requires (``supportlonglong``, ``models``, and per model ``sparse_files``,
  ``deployed_device_list``, ``embedding_vecsize_per_table``,
  ``maxnum_catfeature_query_per_table_per_sample``, ``default_value_for_each_table``) are required.
* Aliases of type and policy strings (``"redis"``, ``"rocksdb"``, ``"least_used"``, ...) become the
  canonical names.
* A key the reader does not know is logged as a warning that names the nearest valid key; it is
  otherwise ignored, as the original ignores it.
* A wrong JSON type or an impossible value raises :class:`ConfigError` naming the key's path
  (``models[1].gpucacheper``), the value and what is valid. Every number must be finite (JSON
  ``NaN`` and ``1e999`` are refused), a ``default_value_for_each_table`` must fit a float32,
  ``volatile_db.num_partitions`` is at most :data:`MAX_PARTITIONS`, and an integer key without an
  upper bound takes at most ``2**63 - 1`` (``overflow_margin``: :data:`NO_OVERFLOW_LIMIT`).
* A file that is not a ps_config (missing, a directory, not UTF-8, empty, over
  :data:`MAX_CONFIG_BYTES`, nested more than 512 levels deep, not a JSON object) raises
  :class:`ConfigError` naming the file. A FIFO without a writer reads as empty instead of blocking.
* A mapping is read as the JSON text ``json.dumps`` writes of it, so it holds what JSON can say:
  dicts (or other mappings) with str keys, lists or tuples (both are arrays), str, int, float,
  bool and None. Any other key or value (a numpy scalar, bytes, a set, ...) raises
  :class:`ConfigError` naming its path, since JSON would change it or cannot write it.

Where this reader differs from the original on purpose (the original's behaviour in brackets):

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

import json
import logging
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import _serving

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

#: Model and table names: the characters the original allows in a table tag (the C++ reader checks
#: them so; tests/test_ps_config_cpp.py holds the two equal).
NAME_PATTERN = re.compile(r"[a-zA-Z0-9_\-]{1,120}")
# The reader's limits, from the C++ reader (ps_config.hpp, limits.hpp):
#: ``overflow_margin``'s default: no limit (the original's ``SIZE_MAX``, ``2**64 - 1``).
NO_OVERFLOW_LIMIT: int = _serving.NO_OVERFLOW_LIMIT
#: The most partitions per table (``volatile_db.num_partitions``): Redis cluster's 16384 hash slots.
#: A partition is one Redis hash, which lives in one slot, so more partitions spread no further.
MAX_PARTITIONS: int = _serving.MAX_PARTITIONS
#: The most bytes of a ps_config file read (a ps_config is a few KiB; this stops e.g. ``/dev/zero``).
MAX_CONFIG_BYTES: int = _serving.MAX_CONFIG_BYTES
#: The longest ``update_source.poll_interval_ms``: a day (longer waits overflow the poller's timer).
MAX_POLL_INTERVAL_MS: int = _serving.MAX_POLL_INTERVAL_MS
#: The most threads of a model's background pool (``thread_pool_size``).
MAX_THREAD_POOL_SIZE: int = _serving.MAX_THREAD_POOL_SIZE
#: ``volatile_db.overflow_policy``'s values, each with its aliases.
OVERFLOW_POLICIES: dict[str, tuple[str, ...]] = _serving.OVERFLOW_POLICIES


class ConfigError(ValueError):
    """A ps_config that cannot be served: the message names the key's path, the value and what is
    valid.

    Example::

        try:
            load_config({"supportlonglong": "yes", "models": []})
        except ConfigError as e:
            print(e)  # supportlonglong: expected true or false, got 'yes' (str) ...
    """


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
    if not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise ConfigError(
            f"volatile_db.address: {entry!r} is not host[:port] (port 1..65535); write e.g. '127.0.0.1:7000'"
        )
    return host, int(port)


def _warn(message: str) -> None:
    log.warning("%s", message)


def _json_value(value: Any, where: str) -> Any:
    """``value`` (at the key path ``where``) as what ``json.dumps`` writes exactly: dicts with str
    keys, lists, str, int, float, bool, None; ConfigError for anything else, which JSON would change
    (a key 1 becomes "1") or cannot write."""
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ConfigError(
                    f"{where or 'ps_config'}: key {key!r} ({type(key).__name__}) is not a string; a JSON object's "
                    "keys are strings"
                )
            out[key] = _json_value(item, f"{where}.{key}" if where else key)
        return out
    if isinstance(value, (list, tuple)):
        return [_json_value(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if value is None or isinstance(value, (str, int, float)):  # bool is an int
        return value
    raise ConfigError(
        f"{where}: {value!r} ({type(value).__name__}) is not a JSON value; give a dict, list, str, int, float, "
        "bool or None (e.g. int(x) or float(x) of a numpy scalar)"
    )


def _config(raw: dict[str, Any]) -> PSConfig:
    """The dataclasses of the reader's dict (``dataclasses.asdict``'s shape)."""
    return PSConfig(
        supportlonglong=raw["supportlonglong"],
        models=tuple(ModelConfig(**m) for m in raw["models"]),
        volatile_db=VolatileDBConfig(**raw["volatile_db"]),
        persistent_db=PersistentDBConfig(**raw["persistent_db"]),
        update_source=UpdateSourceConfig(**raw["update_source"]),
        fuse_embedding_table=raw["fuse_embedding_table"],
    )


def load_config(source: str | os.PathLike | Mapping[str, Any]) -> PSConfig:
    """Read and check a ps_config with the C++ reader (``csrc/serving/ps_config.cpp``).

    Args:
        source: the path of a JSON file, or the parsed JSON object (a mapping of what JSON can
            say: see the module's docstring).

    Returns:
        The config, with every absent key at the original's default. Each warning of the reader
        (an unknown or ignored key) is logged on this module's logger.

    Raises:
        ConfigError: the file cannot be read, is not UTF-8 JSON text of at most
            :data:`MAX_CONFIG_BYTES` whose top level is an object; a required key is missing, a
            value has the wrong type or an impossible value (the message names the key's path,
            e.g. ``models[1].gpucacheper``); a mapping holds what JSON cannot say.

    Example::

        cfg = load_config("hps.json")
        cfg.model("foo").hit_rate_threshold    # 1.0
    """
    try:
        if isinstance(source, Mapping):
            raw = _serving.parse_ps_config(json.dumps(_json_value(source, "")), warn=_warn)
        else:
            raw = _serving.read_ps_config(os.fsencode(source), warn=_warn, max_bytes=MAX_CONFIG_BYTES)
    except _serving.ConfigError as e:
        raise ConfigError(str(e)) from None
    except (RecursionError, _serving.JsonParseError):  # a mapping nested beyond Python's or the reader's limit
        raise ConfigError(
            "ps_config nests arrays or objects too deeply to read; a ps_config nests 4 levels deep"
        ) from None
    return _config(raw)
