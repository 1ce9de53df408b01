"""The shared volatile DB in C++: :class:`CppRedisClusterTier`, the :class:`~.base.SharedTier` over
``sok::hps::RedisClusterTier`` (``csrc/tiers/redis_cluster_tier.hpp``, bound as
:mod:`hierarchical_parameter_server._tiers`), on the Redis C client hiredis.

It does what :class:`~.redis_cluster.RedisClusterTier` does (same settings and defaults, same
layout, so each reads the rows the other wrote, same overflow with ``evict_random``, same errors:
:class:`~.base.TierUnavailable` naming the addresses when a node cannot be reached, and the tier
works again once it is back) without redis-py and without Python in its data path: every call
releases the GIL, so threads work at once, each holding at most one of a node's
``num_node_connections`` connections. The cluster routing is its own (the slot map from
``CLUSTER SLOTS``, a call's commands pipelined per node, ``MOVED`` and ``ASK`` followed). Where
the two differ:

* No TLS: hiredis 0.14 has none, so ``enable_tls=True`` is refused (ValueError saying what to do
  instead: the Python tier, or a TLS-terminating proxy).
* After :meth:`close` every call raises RuntimeError (the Python tier connects again).
* Settings out of range (``num_partitions``, ``max_batch_size``, ...) are refused at construction;
  the Python tier fails on its first call.

Built only where hiredis was found (``_tiers.WITH_REDIS``; Debian: ``apt-get install
libhiredis-dev``, then rebuild sok-hps); importing this module raises ImportError otherwise. The
C++ server (``docs/design/hps-serving.md``) uses the C++ class directly; a Python process's server
uses the Python tier. The tests run the tier suites on both implementations.

Example::

    tier = CppRedisClusterTier("127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002", num_partitions=8)
    tier.insert("hps_et.m.t", np.arange(4), np.ones((4, 8), np.float32))
    # rows in the hashes hps_et{hps_et.m.t/p0}v .. /p7}v, field = the key's 8 little-endian bytes
    rows, found = tier.fetch("hps_et.m.t", np.array([1, 9]), 8)   # found == [True, False]
"""

from __future__ import annotations

from .. import _tiers
from ..config import NO_OVERFLOW_LIMIT, VolatileDBConfig
from . import redis_cluster_defaults as defaults
from .cpp_tier import CppSharedTier

__all__ = ["CppRedisClusterTier"]

if not _tiers.WITH_REDIS:
    raise ImportError(
        "sok-hps was built without hiredis, so it has no C++ redis_cluster tier (_tiers.WITH_REDIS is False); "
        "install the Redis C client (Debian/Ubuntu: apt-get install libhiredis-dev) and rebuild sok-hps "
        "(pip install --no-build-isolation --force-reinstall --no-deps sok-hps), or use "
        "tiers.redis_cluster.RedisClusterTier (redis-py)"
    )


class CppRedisClusterTier(CppSharedTier):
    """Rows in a Redis cluster, through C++ (see the module docstring and
    ``csrc/tiers/redis_cluster_tier.hpp``). ``retain_only`` also erases the rows a deploy with
    another ``num_partitions`` left (as :meth:`~.redis_cluster.RedisClusterTier.retain_only`);
    ``close`` closes the connections (the rows stay in Redis).

    Args:
        address: ``host[:port]`` entries separated by commas (port 6379 where none is given); the
            slot map is asked of them in turn.
        user_name, password: Redis ACL credentials (no ``AUTH`` when ``password`` is empty).
        num_partitions: partitions (hashes) per table, 1 to :data:`~..config.MAX_PARTITIONS`.
        num_node_connections: the most connections to one node (calls beyond that wait).
        max_batch_size: fields per ``HSET`` / ``HMGET`` / ``HDEL``.
        enable_tls: must be False (see the module docstring).
        overflow_margin: the most rows per partition; :data:`~..config.NO_OVERFLOW_LIMIT` (the
            default): no limit, no eviction.
        overflow_policy: ``evict_random`` (the only policy offered when a margin is set).
        overflow_resolution_target: evict down to ``round(overflow_margin * overflow_resolution_target)``.
        socket_timeout_s: how long one call waits to connect to a node or for its reply before the
            tier counts as unavailable.

    Raises:
        ValueError: a setting out of range, an address that is not ``host[:port]``, another
            overflow policy than ``evict_random``, ``enable_tls``.
    """

    def __init__(
        self,
        address: str = defaults.ADDRESS,
        user_name: str = defaults.USER_NAME,
        password: str = defaults.PASSWORD,
        num_partitions: int = defaults.NUM_PARTITIONS,
        num_node_connections: int = defaults.NUM_NODE_CONNECTIONS,
        max_batch_size: int = defaults.MAX_BATCH_SIZE,
        enable_tls: bool = False,
        overflow_margin: int = NO_OVERFLOW_LIMIT,
        overflow_policy: str = defaults.OVERFLOW_POLICY,
        overflow_resolution_target: float = defaults.OVERFLOW_RESOLUTION_TARGET,
        socket_timeout_s: float = defaults.SOCKET_TIMEOUT_S,
    ) -> None:
        self._tier = _tiers.RedisClusterTier(
            address=address,
            user_name=user_name,
            password=password,
            num_partitions=num_partitions,
            num_node_connections=num_node_connections,
            max_batch_size=max_batch_size,
            enable_tls=enable_tls,
            overflow_margin=overflow_margin,
            overflow_policy=overflow_policy,
            overflow_resolution_target=overflow_resolution_target,
            socket_timeout_s=socket_timeout_s,
        )
        self.name: str = self._tier.name

    @classmethod
    def from_config(cls, cfg: VolatileDBConfig) -> CppRedisClusterTier:
        """The tier ``volatile_db`` describes (its ``enable_tls`` must be false)."""
        return cls(
            address=cfg.address,
            user_name=cfg.user_name,
            password=cfg.password,
            num_partitions=cfg.num_partitions,
            num_node_connections=cfg.num_node_connections,
            max_batch_size=cfg.max_batch_size,
            enable_tls=cfg.enable_tls,
            overflow_margin=cfg.overflow_margin,
            overflow_policy=cfg.overflow_policy,
            overflow_resolution_target=cfg.overflow_resolution_target,
        )
