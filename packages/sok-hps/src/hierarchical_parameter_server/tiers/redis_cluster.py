"""The shared volatile DB: a Redis cluster through redis-py (``volatile_db.type: redis_cluster``).

Layout (the original's, reference §3.3): the rows of partition ``p`` of table ``tag`` are the hash
``hps_et{<tag>/p<p>}v``; a field is the key's 8 little-endian bytes and its value the row's raw
float32 bytes. The ``{...}`` hash tag keeps a partition on one node. Writes are pipelined ``HSET``
and reads ``HMGET``, ``max_batch_size`` fields per command.

When a node cannot be reached (down, restarting, the cluster not ``ok``), every call raises
:class:`~.base.TierUnavailable` naming the address: any error of redis-py during a command is
mapped to it. The failed client is swapped for a new one on the next call, so the tier works
again once the node is back; it is never closed while other threads may still use it (it is
collected when the last of them is done), only by :meth:`RedisClusterTier.close`.

The width of each table is recorded in the string key ``hps_et{<tag>}dim`` (decimal text), so
that a server refuses a deploy of another width (:class:`~.base.SharedTier`).

Overflow (``overflow_margin`` rows per partition): after an insert, a partition above the margin
loses random rows (``HRANDFIELD``) down to ``round(overflow_margin * overflow_resolution_target)``.
Only ``evict_random`` is offered here: the other policies need per-row access metadata that every
fetch would have to write back to Redis; they are refused at construction.

Example::

    tier = RedisClusterTier("127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002", num_partitions=8)
    tier.insert("hps_et.m.t", np.arange(4), np.ones((4, 8), np.float32))
    rows, found = tier.fetch("hps_et.m.t", np.array([1, 9]), 8)   # found == [True, False]
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import redis
from redis.backoff import ExponentialBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry

from ..config import NO_OVERFLOW_LIMIT, VolatileDBConfig, parse_address
from . import redis_cluster_defaults as defaults
from .base import TierUnavailable, check_keys, check_rows, fill_rows, start_fetch
from .partition import partition_of

__all__ = ["RedisClusterTier"]

log = logging.getLogger(__name__)

#: What redis-py raises when the cluster cannot serve: its errors (RedisClusterException is not a
#: RedisError), and the TypeError / AttributeError of a client whose connections were reset under a
#: command.
_REDIS_ERRORS = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException)
_UNAVAILABLE = (*_REDIS_ERRORS, TypeError, AttributeError)

T = TypeVar("T")


def value_hash(tag: str, partition: int | str) -> str:
    """The Redis hash holding partition ``partition`` of table ``tag``: ``hps_et{<tag>/p<p>}v``."""
    return f"hps_et{{{tag}/p{partition}}}v"


def dim_key(tag: str) -> str:
    """The Redis string holding the row width of table ``tag``: ``hps_et{<tag>}dim``."""
    return f"hps_et{{{tag}}}dim"


def glob_escaped(text: str) -> str:
    """``text`` with the characters of Redis's glob patterns (``*?[]\\``) escaped, so that a
    ``SCAN ... MATCH`` pattern matches them as they are."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


class RedisClusterTier:
    """Rows in a Redis cluster (see the module docstring).

    Args:
        address: ``host[:port]`` entries separated by commas; all are tried as startup nodes.
        user_name, password: Redis ACL credentials (no AUTH when ``password`` is empty).
        num_partitions: partitions (hashes) per table.
        num_node_connections: the most connections to one node (calls beyond that wait).
        max_batch_size: fields per HSET / HMGET.
        enable_tls, tls_*: TLS to the nodes (a CA file or a CA directory).
        overflow_margin, overflow_policy, overflow_resolution_target: see the module docstring.
        socket_timeout_s: how long one call waits on a node before the tier counts as unavailable.
    """

    name = "redis_cluster"

    def __init__(
        self,
        address: str = defaults.ADDRESS,
        user_name: str = defaults.USER_NAME,
        password: str = defaults.PASSWORD,
        num_partitions: int = defaults.NUM_PARTITIONS,
        num_node_connections: int = defaults.NUM_NODE_CONNECTIONS,
        max_batch_size: int = defaults.MAX_BATCH_SIZE,
        enable_tls: bool = False,
        tls_ca_certificate: str = "cacertbundle.crt",
        tls_client_certificate: str = "client_cert.pem",
        tls_client_key: str = "client_key.pem",
        tls_server_name_identification: str = "redis.localhost",
        overflow_margin: int = NO_OVERFLOW_LIMIT,
        overflow_policy: str = defaults.OVERFLOW_POLICY,
        overflow_resolution_target: float = defaults.OVERFLOW_RESOLUTION_TARGET,
        socket_timeout_s: float = defaults.SOCKET_TIMEOUT_S,
    ) -> None:
        if overflow_margin != NO_OVERFLOW_LIMIT and overflow_policy != "evict_random":
            raise ValueError(
                f"redis_cluster supports overflow_policy 'evict_random' only, got {overflow_policy!r}; set "
                "volatile_db.overflow_policy to 'evict_random' or leave overflow_margin unset"
            )
        self.address = address
        self.nodes = [ClusterNode(host, port) for host, port in (parse_address(a) for a in address.split(","))]
        self.num_partitions = num_partitions
        self.max_batch_size = max_batch_size
        self.overflow_margin = overflow_margin
        self.keep_rows = max(0, round(overflow_margin * overflow_resolution_target))
        self._options: dict = dict(
            username=user_name if password else None,
            password=password or None,
            socket_timeout=socket_timeout_s,
            socket_connect_timeout=socket_timeout_s,
            retry=Retry(ExponentialBackoff(cap=0.2, base=0.02), 1),
            decode_responses=False,
        )
        if enable_tls:
            ca = {"ssl_ca_path": tls_ca_certificate} if os.path.isdir(tls_ca_certificate) else {}
            self._options.update(
                ssl=True,
                ssl_ca_certs=None if ca else tls_ca_certificate,
                ssl_certfile=tls_client_certificate,
                ssl_keyfile=tls_client_key,
                ssl_check_hostname=bool(tls_server_name_identification),
                **ca,
            )
        self._client: RedisCluster | None = None
        self._lock = threading.Lock()
        # A call holds one connection per node it touches: this bounds each node's connections.
        self._calls = threading.BoundedSemaphore(num_node_connections)

    @classmethod
    def from_config(cls, cfg: VolatileDBConfig) -> RedisClusterTier:
        """The tier ``volatile_db`` describes."""
        return cls(
            address=cfg.address,
            user_name=cfg.user_name,
            password=cfg.password,
            num_partitions=cfg.num_partitions,
            num_node_connections=cfg.num_node_connections,
            max_batch_size=cfg.max_batch_size,
            enable_tls=cfg.enable_tls,
            tls_ca_certificate=cfg.tls_ca_certificate,
            tls_client_certificate=cfg.tls_client_certificate,
            tls_client_key=cfg.tls_client_key,
            tls_server_name_identification=cfg.tls_server_name_identification,
            overflow_margin=cfg.overflow_margin,
            overflow_policy=cfg.overflow_policy,
            overflow_resolution_target=cfg.overflow_resolution_target,
        )

    def _connect(self) -> RedisCluster:
        with self._lock:
            if self._client is None:
                try:
                    self._client = RedisCluster(startup_nodes=self.nodes, **self._options)
                except _REDIS_ERRORS as e:
                    raise TierUnavailable(f"redis_cluster at {self.address} cannot be reached: {e}") from e
            return self._client

    def _failed(self, client: RedisCluster, error: Exception) -> TierUnavailable:
        """Drop ``client`` (the next call makes a new one) without closing it: other threads may be
        in a command on it; it is collected once they are done."""
        with self._lock:
            if self._client is client:
                self._client = None
        return TierUnavailable(f"redis_cluster at {self.address} cannot serve: {type(error).__name__}: {error}")

    def _run(self, command: Callable[[RedisCluster], T]) -> T:
        """``command(client)`` with a connection slot held; any error of redis-py is TierUnavailable."""
        client = self._connect()
        try:
            with self._calls:
                return command(client)
        except _UNAVAILABLE as e:
            raise self._failed(client, e) from e

    @property
    def location(self) -> str:
        """The cluster's addresses."""
        return self.address

    def _commands(self, keys: np.ndarray):
        """``(hash name, positions in keys, field bytes)`` per partition and chunk."""
        parts = partition_of(keys, self.num_partitions).astype(np.int64)
        order = np.argsort(parts, kind="stable")
        bounds = np.cumsum(np.bincount(parts, minlength=self.num_partitions))
        raw = keys.astype("<i8").tobytes()
        start = 0
        for p, end in enumerate(bounds.tolist()):
            for first in range(start, end, self.max_batch_size):
                positions = order[first : min(end, first + self.max_batch_size)]
                yield p, positions, [raw[8 * i : 8 * i + 8] for i in positions.tolist()]
            start = end

    def fetch(self, tag: str, keys: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
        keys, out, found = start_fetch(tag, keys, dim)
        if not len(keys):
            return out, found
        commands = list(self._commands(keys))

        def read(client: RedisCluster) -> list:
            pipe = client.pipeline(transaction=False)
            for p, _, fields in commands:
                pipe.hmget(value_hash(tag, p), fields)
            return pipe.execute()

        replies = self._run(read)
        for (_, positions, _), values in zip(commands, replies):
            fill_rows(self.name, tag, values, positions, out, found)
        return out, found

    def insert(self, tag: str, keys: np.ndarray, values: np.ndarray) -> None:
        keys, values = check_rows(tag, keys, values)
        if not len(keys):
            return
        raw = values.tobytes()
        row_bytes = values.shape[1] * 4
        # Positions ascend within a partition, so a repeated key's last row is set last.
        mappings = [
            (p, {f: raw[row_bytes * i : row_bytes * (i + 1)] for f, i in zip(fields, positions.tolist())})
            for p, positions, fields in self._commands(keys)
        ]

        def write(client: RedisCluster) -> None:
            pipe = client.pipeline(transaction=False)
            for p, mapping in mappings:
                pipe.hset(value_hash(tag, p), mapping=mapping)
            pipe.execute()
            if self.overflow_margin != NO_OVERFLOW_LIMIT:
                self._resolve_overflow(client, tag, sorted({p for p, _ in mappings}))

        self._run(write)

    def _resolve_overflow(self, client: RedisCluster, tag: str, partitions: list[int]) -> None:
        pipe = client.pipeline(transaction=False)
        for p in partitions:
            pipe.hlen(value_hash(tag, p))
        for p, length in zip(partitions, pipe.execute()):
            if length > self.overflow_margin:
                name = value_hash(tag, p)
                victims = client.hrandfield(name, length - self.keep_rows)
                for first in range(0, len(victims), self.max_batch_size):
                    client.hdel(name, *victims[first : first + self.max_batch_size])
                log.debug("redis_cluster: %s overflowed; evicted %d rows", name, len(victims))

    def size(self, tag: str) -> int:
        def count(client: RedisCluster) -> int:
            pipe = client.pipeline(transaction=False)
            for p in range(self.num_partitions):
                pipe.hlen(value_hash(tag, p))
            return int(sum(pipe.execute()))

        return self._run(count)

    def stored_dim(self, tag: str) -> int | None:
        """The recorded width of ``tag``, else the size of one of its rows, else None."""

        def read(client: RedisCluster) -> int | None:
            recorded = client.get(dim_key(tag))
            if recorded is not None:
                return int(recorded.decode())
            pipe = client.pipeline(transaction=False)
            for p in range(self.num_partitions):
                pipe.hrandfield(value_hash(tag, p), 1, withvalues=True)
            rows = [reply[1] for reply in pipe.execute() if reply]
            return len(rows[0]) // 4 if rows else None

        return self._run(read)

    def set_stored_dim(self, tag: str, dim: int) -> None:
        self._run(lambda client: client.set(dim_key(tag), str(int(dim)).encode()))

    def retain_only(self, tag: str, keys: np.ndarray) -> int:
        """Erase the rows of ``tag`` whose key is not in ``keys`` (``HKEYS`` and ``HDEL`` per
        partition), and those a deploy with another ``num_partitions`` left: rows in a partition
        other than their key's now, and the hashes of partitions past this tier's count (found by
        ``SCAN`` over every node). Returns how many rows were erased."""
        keep = np.unique(check_keys(tag, keys, 1))

        def erase(client: RedisCluster) -> int:
            erased = 0
            for p in range(self.num_partitions):
                name = value_hash(tag, p)
                fields = client.hkeys(name)
                if not fields:
                    continue
                stored = np.frombuffer(b"".join(fields), "<i8")
                stale = ~np.isin(stored, keep) | (partition_of(stored, self.num_partitions) != p)
                absent = [fields[i] for i in np.flatnonzero(stale).tolist()]
                for first in range(0, len(absent), self.max_batch_size):
                    erased += client.hdel(name, *absent[first : first + self.max_batch_size])
            ours = {value_hash(tag, p).encode() for p in range(self.num_partitions)}
            for name in client.scan_iter(match=value_hash(glob_escaped(tag), "*")):
                if name not in ours:
                    erased += client.hlen(name)
                    client.delete(name)
            return erased

        return self._run(erase)

    def close(self) -> None:
        """Close the connections (the rows stay in Redis)."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()
