"""The parameter server: every table of a ps_config behind its tiers, and the lookup the layers run.

A :class:`ParameterServer` does at start what reference §3.1 describes: it opens the volatile and
the persistent database of the config, loads every table of every model (the ``sparse_files``:
HPS sparse-model folders or ``sok.dump`` checkpoints) into both, makes one embedding cache per
table (:mod:`hierarchical_parameter_server.cache`), pre-fills it when
``cache_refresh_percentage_per_iteration`` > 0 and ``init_ec``, and starts the config's update
source.

The start checks before it writes: the update source's directory is made first (not yet
watched), every model file is opened and verified (a checkpoint's weights against their checksum,
int32 keys in range), then the width each shared database (Redis, RocksDB:
:class:`.tiers.SharedTier`) records for each table; an unusable ``update_source.path``, a corrupt
file or a width other than the config's fails the start with the databases as they were. A
failure after the first write (a database going down mid-load) leaves the shared databases partly
re-deployed, with an error line saying so. A table is then
loaded into the writable databases (a ``persistent_db`` with ``read_only: true`` is served as it
is and never written) and the rows they hold of keys the model files lack are erased, so a
re-deploy over the same databases serves exactly the new model.

:meth:`ParameterServer.hand_over` replaces a server by another under traffic (what
:func:`hierarchical_parameter_server.init.reload` does): graphs traced on the old one read the
new one's tables from then on (their table references are pointed at the new storages), the
Python calls in flight on the old one finish before it closes, and later ones go to the new one.

A lookup of one table (:meth:`ServedTable.lookup`) is built in the graph. Where the cache holds
every row and no database can hold more (:attr:`ServedTable.cache_answers_all`), it is one
``SokFindOrDefault`` (the default value for keys the cache lacks). Otherwise the keys are found in
the cache (``SokFind``), and only when some are missing are those de-duplicated
(``SokUniqueIndex``) and fetched by a ``SokPyCall`` from the lower tiers: volatile DB, then
persistent DB, then the table's ``default_value``; what they return is written into the cache and,
in place, into the lookup's result (``InplaceUpdate``: no copy of the batch). ``hit_rate_threshold``
(reference §3.6): when the batch's cache hit rate is below it, the misses are fetched before the
lookup returns (1.0, or more: always, so lookups are exact); at or above it, the misses get the
default value in this batch and are fetched and cached in the background.

The graph holds nothing of this process: the tables are ``SokResolveTable`` ops and the fetches
``SokPyCall`` ops that name functions of :mod:`.graph_calls` and the table's :attr:`ServedTable.context`
(no ``tf.py_function``, whose token only this process knows), so a SavedModel keeps them.

With ``gpucache: false`` and a ``hash_map`` volatile DB that never evicts (no
``overflow_margin``), the keys are found with ``SokFind`` in that tier's CPU storage of the table
(:meth:`.tiers.hash_map.HashMapTier.graph_table`, the tier's only copy of the rows) and only the
distinct keys it lacks go through the ``SokPyCall`` (the databases in order: the hash map
again, for a row an update wrote since, then the persistent DB, then the default). With any other
volatile DB (Redis, a hash map that evicts by policy) the distinct keys of every lookup are
fetched through it.

Where this differs from NVIDIA HPS (deliberately):

* Online updates reach the cache: the rows of an update that the cache holds are overwritten
  (the original never updated its GPU cache). A per-table lock orders an update against the
  filling of a miss, so a stale row fetched before the update never lands in the cache after it.
* With no database, with ``embedding_cache_type`` ``static`` or ``uvm``, or with ``gpucacheper``
  1.0, the cache holds every row (a det table, never evicting, loaded at start; on the GPU when
  there is one: no host-memory part as ``uvm`` has). The original's ``gpucacheper`` 1.0 cache was
  set-associative, started cold and could still evict; ours starts warm and misses only keys the
  model files lack. A model with ``gpucache: false`` and no database is refused (the original
  served every key the default value).
* ``fuse_embedding_table`` is accepted and changes nothing: each table is looked up on its own,
  with no barrier between the lookups of a fused group (the results are the same).
* A database that cannot be reached (e.g. a Redis node down) is skipped with a warning, and the
  lookup goes on to the next tier; it is used again as soon as it answers.
* A deploy writes the databases only after every model file is verified, records each table's
  width there and refuses another width; a re-deploy erases the rows the new model lacks (the
  original kept serving them).
* ``cache_missed_embeddings`` copies back to the volatile DB only the rows the persistent DB had,
  not the default values of keys no tier has, and none of a table an online update was applied to
  between the fetch and the copy-back (it may be older than the update's).
* Keys: every int64 (or int32) value is valid, none is reserved. With ``supportlonglong: false``
  the keys of the model files must fit int32.

Example::

    server = ParameterServer(load_config("ps.json"))
    table = server.table("foo", 0)
    rows = table.lookup(tf.constant([3, 1, 3], tf.int32))      # [3, dim]
    server.close()
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import re
import threading
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import tensorflow as tf
from sparse_operation_kit import python_ops, tf_ops
from sparse_operation_kit.table_ref import TableRef

from hierarchical_parameter_server import graph_context, model_files, tiers
from hierarchical_parameter_server.cache import EmbeddingCache
from hierarchical_parameter_server.config import ConfigError, ModelConfig, PersistentDBConfig, PSConfig
from hierarchical_parameter_server.tiers.hash_map import HashMapTier

logger = logging.getLogger(__name__)

__all__ = ["ParameterServer", "ServedTable"]

#: Rows per chunk when the model files are loaded into the tiers.
_LOAD_CHUNK_ROWS = 1 << 16
_INT32 = np.iinfo(np.int32)
#: The persistent_db settings that are not the open database's: which database it is (type, path)
#: and what the server reads from its own config (read_only, update_filters).
_SERVER_SETTINGS = ("type", "path", "read_only", "update_filters")


class ServedTable:
    """One table of one model as the server serves it: its cache, its tiers, its default.

    Attributes:
        model: the model's name; ``table_id``: the table's index in the model.
        tag: ``hps_et.<model>.<table name>``, the table's name in the databases.
        dim: the embedding width; ``default_value``: the scalar of every column of a missing key.
        key_dtype: ``tf.int64`` (``supportlonglong``) or ``tf.int32``.
        max_keys: ``max_batch_size`` x ``maxnum_catfeature_query_per_table_per_sample`` of the
            table, the most keys one lookup may pass.
        hit_rate_threshold: the model's, reference §3.6.
        rows: the rows of the table's model file.
        cache: the table's :class:`EmbeddingCache`, None with ``gpucache: false`` or ``gpucacheper`` 0.0.
    """

    def __init__(self, server: ParameterServer, model: ModelConfig, table_id: int, rows: int, key_dtype: Any) -> None:
        self._server = server
        self.model = model.model
        self.table_id = table_id
        self.tag = model.table_tag(table_id)
        self.dim = int(model.embedding_vecsize_per_table[table_id])
        self.default_value = float(model.default_value_for_each_table[table_id])
        self.key_dtype = tf.as_dtype(key_dtype)
        self.max_keys = int(model.max_batch_size) * int(model.maxnum_catfeature_query_per_table_per_sample[table_id])
        self.hit_rate_threshold = float(model.hit_rate_threshold)
        self.rows = rows
        #: What the lookup graph names the table by (:mod:`.graph_context`).
        self.context = graph_context.context_of(server, self.model, table_id, self.dim, self.key_dtype.name)
        self.lock = threading.RLock()
        #: How many online updates were applied to the table (incremented under :attr:`lock`): a
        #: copy-back of rows fetched before an update is skipped (:meth:`ParameterServer.fetch_from_databases`).
        self.generation = 0
        #: Table references of graphs traced on earlier servers, pointed at this table's storages
        #: (:meth:`take_over`), by tier; released with this table's own.
        self._aliases: dict[str, list[TableRef]] = {}
        self._handed_over = False
        self.cache: EmbeddingCache | None = None
        if model.has_cache:
            # static and uvm (as the original's, which never evict) and gpucacheper 1.0: every row
            # in the cache, which then needs no eviction
            evicting = (
                server.has_database
                and model.embedding_cache_type not in ("static", "uvm")
                and float(model.gpucacheper) < 1.0
            )
            self.cache = EmbeddingCache(self.tag, self.dim, rows, float(model.gpucacheper), self.key_dtype, evicting)
        #: Whether the cache alone answers every lookup: it holds every row (never evicting) and no
        #: database can hold a row it lacks (there is none, or only this process's hash map, which
        #: takes the same loads and updates), so a key it lacks gets the default value, written by
        #: the lookup kernel, with no database asked and no test for misses in the graph.
        self.cache_answers_all = (
            self.cache is not None
            and not self.cache.evicting
            and server.persistent_db is None
            and (server.volatile_db is None or isinstance(server.volatile_db, HashMapTier))
        )
        #: Without a cache: the volatile DB's CPU storage of this table where the lookup reads it in
        #: the graph (a hash map that never evicts), else None.
        self._volatile_rows = None
        volatile = server.volatile_db
        if self.cache is None and isinstance(volatile, HashMapTier):
            self._volatile_rows = volatile.graph_table(self.tag, self.dim)

    # -- in the graph --------------------------------------------------------------------------
    def lookup(self, keys: tf.Tensor) -> tf.Tensor:
        """The rows of ``keys`` (any shape): ``float32 keys.shape + [dim]``. TensorFlow ops (eager
        or in a ``tf.function``) on the cache's device.

        Where the cache answers every lookup (:attr:`cache_answers_all`), that is one
        ``SokFindOrDefault`` on the keys as they are (its rows take their shape: a served graph
        runs no reshapes around it). Otherwise the keys, flattened, are found as they come (no
        de-duplication on the path where every key is found) with ``SokFind`` in the table's cache
        or, with ``gpucache: false``, in the CPU storage of a ``hash_map`` volatile DB that never
        evicts (:meth:`.tiers.hash_map.HashMapTier.graph_table`); only when some are missing are
        those de-duplicated and fetched (:meth:`_complete`).
        Otherwise (no cache, and a volatile DB that evicts, Redis, or none) the distinct keys are
        fetched.

        Raises:
            tf.errors.InvalidArgumentError: more than :attr:`max_keys` keys.
            sparse_operation_kit.python_ops.UnregisteredFunctionError: the functions the graph names
                are not registered: :mod:`.graph_calls` is not imported (:mod:`.init` imports it, and
                so does ``import hierarchical_parameter_server`` after TensorFlow).
        """
        device = self.cache.variable.table_device if self.cache is not None else "/CPU:0"
        with tf.name_scope("HpsLookup"), tf.device(device):
            keys = self._checked_count(keys)
            if self.cache is not None and self.cache_answers_all:
                inputs = python_ops.resolved_table_inputs(graph_context.CACHE_TABLE, self.context)
                return self.cache.find_or_default(keys, self.default_value, inputs)
            if keys.shape.rank == 1:
                return self._lookup_flat(keys)
            rows = self._lookup_flat(tf.reshape(keys, [-1]))
            out = tf.reshape(rows, tf.concat([tf.shape(keys), [self.dim]], axis=0))
            out.set_shape(keys.shape.concatenate([self.dim]))
            return out

    def _lookup_flat(self, keys: tf.Tensor) -> tf.Tensor:
        """:meth:`lookup` of 1-D ``keys`` where the cache does not answer every key."""
        if self.cache is not None:
            inputs = python_ops.resolved_table_inputs(graph_context.CACHE_TABLE, self.context)
            values, found = self.cache.find(keys, inputs)
            return self._complete(keys, values, found, cache=True)
        if self._volatile_rows is not None:
            int64_keys = tf.cast(keys, tf.int64)  # the tier's keys
            inputs = python_ops.resolved_table_inputs(graph_context.VOLATILE_TABLE, self.context)
            values, found = tf_ops.library().sok_find(*inputs, int64_keys, col_begin=0, col_end=self.dim)
            return self._complete(keys, values, found, cache=False)
        distinct, positions = tf_ops.library().sok_unique_index(keys)
        return tf.gather(self._fetch_op(distinct, cache=False), positions)

    def _checked_count(self, keys: tf.Tensor) -> tf.Tensor:
        """``keys``, after a check in the graph that they are at most :attr:`max_keys` (none when
        their static shape proves it). The bound is also the most rows :func:`_patched` indexes.

        The check runs on the host from the keys' shape alone (their size is host memory on every
        device): a plain ``Assert``, where ``tf.debugging.assert_less_equal`` would put a ``tf.cond``
        in the lookup, whose predicate a GPU lookup would have to copy to the host."""
        limit = min(self.max_keys, _INT32.max)
        count = keys.shape.num_elements()
        if count is not None and count <= limit:
            return keys
        what = (
            f"max_batch_size x maxnum_catfeature_query_per_table_per_sample = {self.max_keys}"
            if limit == self.max_keys
            else f"{limit}, the most one lookup takes"
        )
        size = tf.size(keys, out_type=tf.int64)
        with tf.device("/CPU:0"):
            check = tf.raw_ops.Assert(
                condition=tf.less_equal(size, tf.constant(limit, tf.int64)),
                data=[
                    tf.constant(
                        f"HPS lookup of {self.tag}: more keys than {what}; raise them in the ps_config or pass a "
                        "smaller batch; keys:"
                    ),
                    size,
                ],
            )
        with tf.control_dependencies([check]):
            return tf.identity(keys)

    def _fetch_op(self, keys: tf.Tensor, cache: bool) -> tf.Tensor:
        """A ``SokPyCall`` of :meth:`fill` (cache) or :meth:`fetch` on ``keys``: ``[n, dim]``."""
        function = graph_context.FILL if cache else graph_context.FETCH
        (rows,) = python_ops.py_call(function, self.context, [keys], [tf.float32], name="HpsFetchFromTiers")
        rows.set_shape([None, self.dim])
        return rows

    def _complete(self, keys: tf.Tensor, values: tf.Tensor, found: tf.Tensor, cache: bool) -> tf.Tensor:
        """``values`` (a ``SokFind`` output of ``keys``) with the rows of the keys not found.

        From the cache (``cache``): the misses are fetched and cached per :attr:`hit_rate_threshold`,
        over distinct keys as the original's. From the volatile DB: the misses are fetched from the
        databases (the default value where none has them)."""
        lib = tf_ops.library()

        def with_misses() -> tf.Tensor:
            where = tf.where(tf.logical_not(found))[:, 0]
            missing, positions = lib.sok_unique_index(tf.gather(keys, where))

            def fetched() -> tf.Tensor:
                rows = self._fetch_op(missing, cache=cache)
                return _patched(values, where, tf.gather(rows, positions))

            if not cache or self.hit_rate_threshold >= 1.0:
                return fetched()

            def defaults_now() -> tf.Tensor:
                (scheduled,) = python_ops.py_call(graph_context.SCHEDULE_FILL, self.context, [missing], [tf.bool])
                with tf.control_dependencies([scheduled]):
                    fill = tf.fill([tf.size(where), self.dim], tf.constant(self.default_value, tf.float32))
                    return _patched(values, where, fill)

            distinct, _ = lib.sok_unique_index(keys)
            misses = tf.cast(tf.size(missing), tf.float64) / tf.cast(tf.size(distinct), tf.float64)
            return tf.cond(1.0 - misses < self.hit_rate_threshold, fetched, defaults_now)

        return tf.cond(tf.reduce_all(found), lambda: values, with_misses)

    # -- in Python -------------------------------------------------------------------------------
    def check_call(self, emb_vec_size: int, ids_dtype: tf.DType, caller: str) -> None:
        """The checks of a lookup by ``caller`` (a layer's name, or an op's): its ``emb_vec_size``
        must be the table's width and its ids of the key dtype ``supportlonglong`` says.

        Raises:
            ValueError: either does not hold (the message says how to fix it).
        """
        if emb_vec_size != self.dim:
            raise ValueError(
                f"emb_vec_size {emb_vec_size} of {caller} is not the width of table {self.table_id} of "
                f"model {self.model!r}: the ps_config says {self.dim} (embedding_vecsize_per_table); "
                f"pass emb_vec_size={self.dim}"
            )
        if ids_dtype != self.key_dtype:
            flag = "true" if ids_dtype == tf.int64 else "false"
            raise ValueError(
                f"ids of {caller} are {ids_dtype.name} but the ps_config's supportlonglong is "
                f"{str(self.key_dtype == tf.int64).lower()}, so keys are {self.key_dtype.name}; cast the ids "
                f'(tf.cast(ids, tf.{self.key_dtype.name})) or set "supportlonglong": {flag}'
            )

    def table_ref(self, tier: str) -> TableRef:
        """The reference that lookup graphs resolve (:mod:`.graph_calls`): of the table's cache
        (``"cache"``), or of its rows in a hash map volatile DB that the graph reads (``"volatile"``).

        Raises:
            ValueError: the table has no such table (e.g. ``"cache"`` with ``gpucache: false``).
        """
        variables = self._graph_variables()
        if tier not in variables:
            raise ValueError(
                f"table {self.tag} has no {tier!r} table that a lookup graph reads; it has: {sorted(variables)}"
            )
        return variables[tier].table_ref

    def release(self) -> None:
        """Mark the tables that graphs resolve dead (the server closes): a graph then resolves the
        table again, in the process's server. Nothing to do once :meth:`take_over` moved them."""
        if self._handed_over:
            return
        for tier, variable in self._graph_variables().items():
            for ref in [variable.table_ref, *self._aliases.get(tier, [])]:
                ref.release()

    def take_over(self, old: ServedTable, retired: list[Any]) -> None:
        """Point the table references of ``old`` (the same table of the server this one replaces)
        and those it took over at this table's storages, so that graphs that hold them read this
        table with no failed lookup; the storages they pointed at are appended to ``retired``
        (ops in flight may still read them: keep them a while). A reference this table has no
        matching storage for (another width, key dtype, cache kind or device) is released: its
        graphs resolve the table again, in the process's server."""
        mine = self._graph_variables()
        for tier, variable in old._graph_variables().items():
            refs = [variable.table_ref, *old._aliases.get(tier, [])]
            target = mine.get(tier)
            if target is None or _storage_kind(target.storage) != _storage_kind(variable.storage):
                for ref in refs:
                    ref.release()
                continue
            for ref in refs:
                retired.append(ref.storage)
                ref.swap(target.table_ref.storage, target.table_ref.initializers)
            self._aliases.setdefault(tier, []).extend(refs)
        old._handed_over = True

    def _graph_variables(self) -> dict[str, Any]:
        """The tables lookup graphs read, by tier (``"cache"``, ``"volatile"``), those the table has."""
        variables = {"cache": self.cache.variable if self.cache is not None else None, "volatile": self._volatile_rows}
        return {tier: v for tier, v in variables.items() if v is not None}

    def schedule_fill(self, keys: np.ndarray) -> None:
        """:meth:`fill` in the server's background pool (the successor's, once this server has
        handed over)."""
        with self._server.serving(self) as table:
            table._server.submit(table.fill, np.asarray(keys))

    def fetch(self, keys: np.ndarray) -> np.ndarray:
        """The rows of ``keys`` from the databases, the default value where no tier has a key:
        ``float32 [n, dim]`` (from the successor's table once this server has handed over)."""
        with self._server.serving(self) as table:
            return table._server.fetch_from_databases(table, np.asarray(keys).astype(np.int64, copy=False))[0]

    def fill(self, keys: np.ndarray) -> np.ndarray:
        """Fetch the rows of ``keys`` from the databases and write them into an evicting cache
        (default rows included, as the original's cache takes them, but not the defaults of keys a
        database that could not be reached may hold); returns them. A cache that holds every row
        takes nothing: it was loaded with every row of the model files, so its misses are keys
        those lack (defaults, or rows another writer put into a shared database), and it must not
        grow with them. Once this server has handed over, the successor's table fills."""
        with self._server.serving(self) as table:
            return table._fill(np.asarray(keys))

    def _fill(self, keys: np.ndarray) -> np.ndarray:
        with self.lock:
            rows, known = self._server.fetch_from_databases(self, keys.astype(np.int64, copy=False))
            if self.cache is not None and self.cache.evicting and known.any():
                self.cache.insert(keys[known], rows[known])
            return rows

    def apply_update(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Write an online update's rows (``keys`` of the table's key dtype, checked by
        :meth:`ParameterServer.table_keys`; ``values [n, dim]``) to the cache: the rows it holds
        are overwritten (every row, where the cache is the only store)."""
        if self.cache is None:
            return
        if self.cache.evicting:
            cached = self.cache.update_present(keys, values)
            logger.debug("update of %s: %d of %d rows were cached and are updated", self.tag, cached, len(keys))
        else:
            self.cache.insert(keys, values)


class ParameterServer:
    """Every table of ``config`` loaded into its tiers, the update source started.

    Thread-safe: lookups of any tables from any threads, with updates applied meanwhile.

    Args:
        config: a loaded ps_config (:func:`hierarchical_parameter_server.config.load_config`).
        origin: the ps_config file (absolute path) and ``global_batch_size`` that ``hps.Init``
            started it from. A lookup graph records them, so that a SavedModel loaded in another
            process starts HPS from them (:mod:`.graph_calls`).
        predecessor: the server this one is to replace (:meth:`hand_over`), which serves while
            this one loads: its persistent DB is shared when both configs give the same
            ``persistent_db`` type and path (a RocksDB path opens once per process), unless it is
            open read-only and this config writes it; its other settings then stay as opened until
            the process restarts (a warning names those that differ).

    Raises:
        ValueError: a model with no cache (``gpucache: false`` or ``gpucacheper`` 0.0) and no database
            (its rows would be nowhere).
        hierarchical_parameter_server.config.ConfigError: a model file does not match its config,
            a database holds a table with another width than the config's, or
            ``update_source.path`` cannot be made a directory (no database was written).
        hierarchical_parameter_server.model_files.ModelFileError: a model file is corrupt (no
            database was written).
        hierarchical_parameter_server.tiers.TierUnavailable: a database failed during the load:
            the shared databases are partly re-deployed (an error line says so).

    Example::

        server = ParameterServer(load_config({"supportlonglong": True, "models": [...]}))
        rows = server.table("foo", 0).fetch(np.array([1, 2], np.int64))
    """

    def __init__(
        self, config: PSConfig, origin: tuple[str, int] | None = None, predecessor: ParameterServer | None = None
    ) -> None:
        self.config = config
        self.id = uuid.uuid4().hex
        self.origin = origin
        self.key_dtype = tf.int64 if config.supportlonglong else tf.int32
        self._calls = 0
        self._calls_done = threading.Condition()
        self._successor: ParameterServer | None = None
        self._volatile = tiers.make_volatile_db(config.volatile_db)
        shared = self._sharable_persistent(predecessor)
        #: Whether close() closes the persistent DB (not one shared with the predecessor before
        #: the hand-over, nor one handed to the successor).
        self._owns_persistent = shared is None
        #: The persistent_db config the persistent DB was opened with (the predecessor's when shared).
        self._persistent_config = config.persistent_db if shared is None else predecessor._persistent_config
        try:
            self._persistent = shared if shared is not None else tiers.make_persistent_db(config.persistent_db)
        except BaseException:
            if self._volatile is not None:
                self._volatile.close()  # e.g. a Redis client, which nothing else would close
            raise
        self._volatile_filters = _filters(config.volatile_db.update_filters)
        self._persistent_filters = _filters(config.persistent_db.update_filters)
        self._unavailable: set[str] = set()
        self._unavailable_lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=max(1, max((int(m.thread_pool_size) for m in config.models), default=1)),
            thread_name_prefix="hps-async",
        )
        self._pending: set[concurrent.futures.Future] = set()
        self._pending_lock = threading.Lock()
        self._tables: dict[tuple[str, int], ServedTable] = {}
        self._by_tag: dict[str, ServedTable] = {}
        self._source: Any = None
        #: Whether the start has written a database that outlives the server (:meth:`_load`).
        self._wrote_shared = False
        try:
            for model in config.models:
                if not model.has_cache and not self.has_database:
                    why = "gpucache: false" if not model.gpucache else f"gpucacheper: {model.gpucacheper} (no cache)"
                    raise ValueError(
                        f"model {model.model!r} has {why} and the ps_config has no database "
                        f"(volatile_db and persistent_db disabled): its rows would be nowhere. Set gpucache: true "
                        f"with gpucacheper above 0 (1.0: the cache holds every row) or configure a volatile_db or "
                        f"persistent_db"
                    )
            self._source = self._make_update_source()
            self._load_models()
            self._start_updates()
            graph_context.register(self)
        except BaseException as error:
            if self._wrote_shared:
                logger.error(
                    "HPS start failed after it began writing %s (%s): the databases are partly re-deployed "
                    "(the tables' rows of both models, rows the new model lacks possibly erased) and lookups "
                    "that read them get either; deploy again (Init or reload) once the cause is fixed",
                    " and ".join(f"{db.name} at {db.location}" for db in self._shared_dbs(writable=True)),
                    error,
                )
            self.close()
            raise

    def _sharable_persistent(self, predecessor: ParameterServer | None) -> Any:
        """The predecessor's persistent DB where this server shares it (None where it opens its own):
        one of the same type and path (a RocksDB path opens once per process), unless that is open
        read-only and this config writes it (a read-only open takes no lock: the path then opens
        again, for writing). Its other settings (``num_threads``, ``max_batch_size``, ...) stay those
        it was opened with, with a warning where this config's differ; ``read_only`` and
        ``update_filters`` are read from this server's config."""
        if predecessor is None or predecessor.persistent_db is None:
            return None
        mine, opened = self.config.persistent_db, predecessor._persistent_config
        if mine.type != opened.type or os.path.realpath(mine.path) != os.path.realpath(opened.path):
            return None
        if opened.read_only and not mine.read_only:
            return None
        differ = [
            f.name
            for f in dataclasses.fields(PersistentDBConfig)
            if f.name not in _SERVER_SETTINGS and getattr(mine, f.name) != getattr(opened, f.name)
        ]
        if differ:
            logger.warning(
                "HPS: persistent_db %s at %s stays open with the settings it was opened with (%s); the ps_config's "
                "(%s) take effect at the next restart of the process",
                mine.type,
                mine.path,
                ", ".join(f"{name}: {getattr(opened, name)!r}" for name in differ),
                ", ".join(f"{name}: {getattr(mine, name)!r}" for name in differ),
            )
        return predecessor.persistent_db

    @property
    def volatile_db(self) -> Any:
        """The volatile database tier (``tiers.Tier``), None when disabled."""
        return self._volatile

    @property
    def persistent_db(self) -> Any:
        """The persistent database tier (``tiers.Tier``), None when disabled."""
        return self._persistent

    @property
    def has_database(self) -> bool:
        """Whether a volatile or a persistent database stands behind the caches."""
        return self._volatile is not None or self._persistent is not None

    def table(self, model: str, table_id: int) -> ServedTable:
        """The served table ``table_id`` of ``model``.

        Raises:
            ValueError: no such model, or ``table_id`` out of range (the message lists the valid ones).
        """
        served = self._tables.get((model, table_id))
        if served is not None:
            return served
        names = sorted({m for m, _ in self._tables})
        if model not in names:
            raise ValueError(
                f"model_name {model!r} is not in the ps_config; valid: {names}; fix model_name or the ps_config"
            )
        count = sum(1 for m, _ in self._tables if m == model)
        raise ValueError(
            f"table_id {table_id!r} of model {model!r} is out of range; valid: 0 .. {count - 1} "
            f"({count} tables in its sparse_files)"
        )

    def tables(self) -> list[ServedTable]:
        """Every served table."""
        return list(self._tables.values())

    # -- start -----------------------------------------------------------------------------------
    def _load_models(self) -> None:
        """Every table of every model: all model files verified and every database's recorded
        width checked before the first row is written anywhere."""
        sources = []
        for model in self.config.models:
            for table_id in range(model.num_tables):
                dim = int(model.embedding_vecsize_per_table[table_id])
                source = model_files.open_table(model.sparse_files[table_id], dim)
                source.verify()
                self._check_key_range(model.table_tag(table_id), source.keys, f"the model file {source.path}")
                sources.append((model, table_id, source))
        for model, table_id, _ in sources:
            self._check_stored_dim(model, table_id)
        for model, table_id, source in sources:
            self._load(model, table_id, source)

    def _shared_dbs(self, writable: bool) -> list[Any]:
        """The databases whose rows outlive this server (:class:`.tiers.SharedTier`); with
        ``writable``, only those a deploy writes (not a read-only persistent DB)."""
        dbs = self._writable_dbs() if writable else [self._volatile, self._persistent]
        return [db for db in dbs if isinstance(db, tiers.SharedTier)]

    def _writable_dbs(self) -> list[Any]:
        """The databases a deploy loads the model files into."""
        read_only = self.config.persistent_db.read_only
        return [db for db in (self._volatile, None if read_only else self._persistent) if db is not None]

    def _check_stored_dim(self, model: ModelConfig, table_id: int) -> None:
        """ConfigError when a shared database holds the table with another width than the config's."""
        tag, dim = model.table_tag(table_id), int(model.embedding_vecsize_per_table[table_id])
        for db in self._shared_dbs(writable=False):
            stored = db.stored_dim(tag)
            if stored is not None and stored != dim:
                raise ConfigError(
                    f"{db.name} at {db.location} holds table {tag} (table {table_id} of model {model.model!r}) "
                    f"with rows of {stored} floats, but embedding_vecsize_per_table gives {dim}; nothing was "
                    f"written. Set embedding_vecsize_per_table to {stored}, or serve the new width from "
                    f"another database (persistent_db.path, volatile_db.address) or under another model name, "
                    f"or remove the table's rows from {db.location}"
                )

    def _load(self, model: ModelConfig, table_id: int, source: model_files.TableSource) -> None:
        tag = model.table_tag(table_id)
        dim = int(model.embedding_vecsize_per_table[table_id])
        served = ServedTable(self, model, table_id, source.rows, self.key_dtype)
        for db in self._shared_dbs(writable=True):
            self._wrote_shared = True
            db.set_stored_dim(tag, dim)
        self._tables[(model.model, table_id)] = served
        self._by_tag[tag] = served
        prefill = (
            served.cache is not None
            and served.cache.evicting
            and float(model.cache_refresh_percentage_per_iteration) > 0
            and bool(model.init_ec)
        )
        room = served.cache.capacity if prefill and served.cache is not None else 0
        loaded = 0
        writable = self._writable_dbs()
        for keys, values in source.chunks(_LOAD_CHUNK_ROWS):
            table_keys = keys.astype(served.key_dtype.as_numpy_dtype, copy=False)  # range: _load_models
            for db in writable:
                db.insert(tag, keys, values)
            if served.cache is not None and not served.cache.evicting:
                served.cache.insert(table_keys, values)
            elif loaded < room and served.cache is not None:
                take = min(len(keys), room - loaded)
                served.cache.insert(table_keys[:take], values[:take])
            loaded += len(keys)
        stale = sum(db.retain_only(tag, source.keys) for db in self._shared_dbs(writable=True))
        logger.info(
            "HPS table %s: %d rows loaded (%s)%s%s",
            tag,
            loaded,
            ", ".join(db.name for db in writable) or "cache only",
            f"; cache pre-filled with {min(loaded, room)} rows" if room else "",
            f"; {stale} rows of keys the model files lack erased" if stale else "",
        )

    def table_keys(self, served: ServedTable, keys: np.ndarray, where: str = "an update") -> np.ndarray:
        """int64 ``keys`` as the table's key dtype (int32 needs them in its range)."""
        keys = np.asarray(keys, dtype=np.int64)
        if served.key_dtype == tf.int64:
            return keys
        self._check_key_range(served.tag, keys, where)
        return keys.astype(np.int32)

    def _check_key_range(self, tag: str, keys: np.ndarray, where: str) -> None:
        """ValueError when int32 keys (``supportlonglong: false``) do not hold ``keys``."""
        if self.key_dtype == tf.int64 or not len(keys):
            return
        if keys.min() < _INT32.min or keys.max() > _INT32.max:
            bad = keys[(keys < _INT32.min) | (keys > _INT32.max)][0]
            raise ValueError(
                f"{where} of {tag} has key {int(bad)}, outside int32, but supportlonglong is false "
                f'(int32 keys); set "supportlonglong": true in the ps_config and look up int64 ids'
            )

    def _make_update_source(self) -> Any:
        """The config's update source, made (its directory too) but not started; None without one.

        Raises:
            ConfigError: ``update_source.path`` cannot be made a directory (nothing was written).
        """
        cfg = self.config.update_source
        if cfg.type != "directory":
            return None
        from hierarchical_parameter_server import updates  # only a config with an update source needs it

        try:
            return updates.DirectoryUpdateSource.from_config(cfg)
        except OSError as error:
            raise ConfigError(
                f"update_source.path {cfg.path!r} cannot be the directory of online updates: "
                f"{error.strerror or error}; nothing was written. Give the path of a directory this process "
                f"can create or write (not a file), or remove what is in the way"
            ) from error

    def _start_updates(self) -> None:
        if self._source is None:
            return
        self._source.start(self.apply_update)
        logger.info("HPS applies the online updates written to %s", self.config.update_source.path)

    # -- the databases -----------------------------------------------------------------------------
    def _guarded(self, db: Any, what: str, fn: Any, *args: Any) -> Any:
        """``fn(*args)``, or None when ``db`` cannot be reached (a warning on the first failure, an
        info line when it answers again)."""
        try:
            result = fn(*args)
        except tiers.TierUnavailable as error:
            with self._unavailable_lock:
                first = db.name not in self._unavailable
                self._unavailable.add(db.name)
            if first:
                logger.warning(
                    "HPS %s: %s is unavailable (%s); going on without it until it answers", what, db.name, error
                )
            return None
        if db.name in self._unavailable:
            with self._unavailable_lock:
                self._unavailable.discard(db.name)
            logger.warning("HPS: %s answers again", db.name)
        return result

    def fetch_from_databases(self, served: ServedTable, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows of int64 ``keys`` of ``served``: volatile DB, then persistent DB for the keys it
        lacks, then the default value (reference §3.7). Returns ``(rows float32 [n, dim], known
        bool [n])``: ``known`` is False for keys that got the default while a database could not
        be reached (they may exist there: such a default must not be cached)."""
        n = len(keys)
        generation = served.generation  # before the rows are read: an update after it voids a copy-back
        rows = np.full((n, served.dim), served.default_value, dtype=np.float32)
        missing = np.ones(n, dtype=bool)
        answered = True
        if n == 0:
            return rows, missing
        if self._volatile is not None:
            got = self._guarded(self._volatile, "lookup", self._volatile.fetch, served.tag, keys, served.dim)
            answered = got is not None
            if got is not None:
                values, found = got
                rows[found] = values[found]
                missing &= ~found
        if self._persistent is not None and missing.any():
            idx = np.flatnonzero(missing)
            got = self._guarded(self._persistent, "lookup", self._persistent.fetch, served.tag, keys[idx], served.dim)
            answered = answered and got is not None
            if got is not None:
                values, found = got
                rows[idx[found]] = values[found]
                missing[idx[found]] = False
                if self._volatile is not None and self.config.volatile_db.cache_missed_embeddings and found.any():
                    self.submit(self._copy_back, served, keys[idx[found]], values[found], generation)
        return rows, ~missing | answered

    def _copy_back(self, served: ServedTable, keys: np.ndarray, values: np.ndarray, generation: int) -> None:
        """Write rows the persistent DB had into the volatile DB (``cache_missed_embeddings``),
        unless an update of the table was applied since they were read (``generation``): they may
        be older than the update's."""
        with served.lock:
            if served.generation != generation:
                logger.debug("HPS copy-back of %d rows of %s skipped: an update came after", len(keys), served.tag)
                return
            self._guarded(
                self._volatile, "copy back of persistent rows", self._volatile.insert, served.tag, keys, values
            )

    # -- background work ---------------------------------------------------------------------------
    def submit(self, fn: Any, *args: Any) -> None:
        """Run ``fn(*args)`` on the server's thread pool (async cache fills, copy-backs); errors are
        logged."""
        future = self._pool.submit(fn, *args)
        with self._pending_lock:
            self._pending.add(future)
        future.add_done_callback(self._done)

    def _done(self, future: concurrent.futures.Future) -> None:
        with self._pending_lock:
            self._pending.discard(future)
        if future.exception() is not None:
            logger.error("HPS background work failed: %s", future.exception())

    def wait_for_background_work(self, timeout: float | None = None) -> None:
        """Wait until the asynchronous cache fills and copy-backs submitted so far are done."""
        with self._pending_lock:
            pending = list(self._pending)
        concurrent.futures.wait(pending, timeout=timeout)

    # -- online updates ----------------------------------------------------------------------------
    def apply_update(self, update: Any) -> None:
        """Apply one online update (``update.tag``, int64 ``update.keys``, ``update.values``) to
        the databases whose ``update_filters`` match its model, then to the table's cache.

        Updates of a table this server does not serve are skipped with a warning. The rows'
        width and the keys' range are checked before anything is written.

        Raises:
            hierarchical_parameter_server.updates.UpdateRejected: rows of another width than the
                table's, or (``supportlonglong: false``) a key outside int32: nothing of the update
                is written, and the update source leaves its file in place (for servers that can
                apply it), records it and does not try it again.
            tiers.TierUnavailable: a database could not be reached; the others and the cache have
                the update, and the update source applies it again later (writes are idempotent).
        """
        from hierarchical_parameter_server.updates import UpdateRejected  # only a server with updates needs it

        served = self._by_tag.get(update.tag)
        if served is None:
            logger.warning("HPS update of %s skipped: no model of the ps_config has that table", update.tag)
            return
        keys = np.asarray(update.keys, dtype=np.int64)
        values = np.asarray(update.values, dtype=np.float32)
        if values.shape != (len(keys), served.dim):
            raise UpdateRejected(
                f"update of {update.tag} has values of shape {values.shape} for {len(keys)} keys, but the table's "
                f"rows have width {served.dim}; write the update with [{len(keys)}, {served.dim}] rows"
            )
        try:
            table_keys = self.table_keys(served, keys)
        except ValueError as error:
            raise UpdateRejected(str(error)) from error
        targets = [
            db
            for db, filters in ((self._volatile, self._volatile_filters), (self._persistent, self._persistent_filters))
            if db is not None
            and any(f.fullmatch(served.model) for f in filters)
            and not (db is self._persistent and self.config.persistent_db.read_only)
        ]
        if self.has_database and not targets:
            logger.info(
                "HPS update of %s skipped: no database's update_filters take model %s", update.tag, served.model
            )
            return
        unreachable = []
        with served.lock:
            served.generation += 1
            for db in targets:
                try:
                    db.insert(update.tag, keys, values)
                except tiers.TierUnavailable as error:
                    unreachable.append(error)
            served.apply_update(table_keys, values)
        if unreachable:
            raise tiers.TierUnavailable(f"update of {update.tag} not written everywhere: {unreachable[0]}")
        logger.info("HPS applied an update of %d rows to %s", len(keys), update.tag)

    # -- replacing the server ----------------------------------------------------------------------
    @contextlib.contextmanager
    def serving(self, served: ServedTable) -> Iterator[ServedTable]:
        """``served`` (a table of this server) for one Python call of a lookup (a fetch, a fill),
        counted so that :meth:`hand_over` closes this server only after it; once this server has
        handed over, the successor's table of the same model and ``table_id``.

        Raises:
            ValueError: the successor serves no such table.
            graph_context.TracedTableChangedError: the successor serves it at another width or key
                dtype (the graph calling was traced for ``served``'s).
        """
        with self._calls_done:
            successor = self._successor
            if successor is None:
                self._calls += 1
        if successor is not None:
            table = successor.table(served.model, served.table_id)
            graph_context.check_traced({"dim": served.dim, "key_dtype": served.key_dtype.name}, table, successor)
            with successor.serving(table) as table:
                yield table
            return
        try:
            yield served
        finally:
            with self._calls_done:
                self._calls -= 1
                self._calls_done.notify_all()

    def hand_over(self, successor: ParameterServer, grace_s: float = 5.0) -> None:
        """Replace this server by ``successor`` (started with ``predecessor=self``, registered)
        under traffic, then close this one; no lookup fails.

        In order: this server's update source stops; Python calls of lookups (fetches, fills)
        that have begun here finish here, later ones go to the successor (:meth:`serving`); then
        the table references of graphs traced on this server are pointed at the successor's tables
        of the same model and ``table_id`` (:meth:`ServedTable.take_over`), the storages they
        pointed at kept alive ``grace_s`` seconds for the ops that read them at that moment; then
        this server closes (a persistent DB it shares with the successor stays open).

        Example::

            new = ParameterServer(load_config("ps_v2.json"), predecessor=old)
            old.hand_over(new)          # graphs traced on old now read new's tables
        """
        self._stop_updates()
        graph_context.unregister(self)
        with self._calls_done:
            self._successor = successor
            self._calls_done.wait_for(lambda: self._calls == 0)
        # No Python call writes through this server's tables from here on: point them at the
        # successor's (a fill still running here would write this model's rows there).
        retired: list[Any] = []
        for key, served in self._tables.items():
            target = successor._tables.get(key)
            if target is not None:
                target.take_over(served, retired)
        if successor.persistent_db is self._persistent:
            self._owns_persistent, successor._owns_persistent = False, True
        self.close()
        keeper = threading.Timer(grace_s, retired.clear)
        keeper.daemon = True
        keeper.start()
        logger.info("HPS server %s handed over to %s", self.id, successor.id)

    def _stop_updates(self) -> None:
        if self._source is not None:
            self._source.stop()
            self._source = None

    def close(self) -> None:
        """Stop the update source and the background work, close the databases; lookup graphs it
        traced resolve their tables in the process's server from now on."""
        graph_context.unregister(self)
        self._stop_updates()
        self._pool.shutdown(wait=True)
        for served in self._tables.values():
            served.release()
        for db in (self._volatile, self._persistent if self._owns_persistent else None):
            if db is not None:
                db.close()
        self._volatile = self._persistent = None


def _storage_kind(storage: Any) -> tuple[Any, ...]:
    """What a table reference may be swapped between: the same backend, width, key dtype, device."""
    return (storage.var_type, storage.row_width, storage.key_dtype, storage.device)


def _patched(values: tf.Tensor, where: tf.Tensor, rows: tf.Tensor) -> tf.Tensor:
    """``values [n, dim]`` with ``rows [m, dim]`` written at the positions ``where [m]`` (distinct).

    ``InplaceUpdate`` writes into the buffer of ``values`` where ``tensor_scatter_nd_update`` would
    copy all ``n`` rows first: ``values`` is the lookup's own ``SokFind`` output, which nothing
    else reads once some keys missed. It indexes rows with int32, hence :meth:`ServedTable.lookup`'s
    bound on the key count.
    """
    return tf.raw_ops.InplaceUpdate(x=values, i=tf.cast(where, tf.int32), v=rows)


def _filters(patterns: Iterable[str]) -> list[re.Pattern]:
    return [re.compile(p) for p in patterns]
