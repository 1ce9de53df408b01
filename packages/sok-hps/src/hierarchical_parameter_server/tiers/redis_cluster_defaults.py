"""The default settings of both redis_cluster tiers (:class:`~.redis_cluster.RedisClusterTier` and
:class:`~.redis_cluster_cpp.CppRedisClusterTier`): one home. The C++ tier's ``RedisClusterOptions``
(``csrc/tiers/redis_cluster_tier.hpp``) holds the same values, which
``_tiers.REDIS_CLUSTER_DEFAULT_OPTIONS`` exposes and ``tests/test_tiers_redis.py`` compares with
these (``enable_tls`` defaults to False and ``overflow_margin`` to :data:`~..config.NO_OVERFLOW_LIMIT`
in both).

A ps_config's ``volatile_db`` gives its own values (``config.VolatileDBConfig``, whose
``num_partitions`` follows the machine's cores); these are the tiers' when made directly.
"""

from __future__ import annotations

#: The cluster's nodes: ``host[:port]`` entries separated by commas.
ADDRESS: str = "127.0.0.1:7000"
#: The Redis ACL user of ``AUTH`` (sent only with a password).
USER_NAME: str = "default"
#: Empty: no ``AUTH``.
PASSWORD: str = ""
#: Partitions (Redis hashes) per table.
NUM_PARTITIONS: int = 8
#: The most connections to one node.
NUM_NODE_CONNECTIONS: int = 5
#: Fields per ``HSET`` / ``HMGET`` / ``HDEL``.
MAX_BATCH_SIZE: int = 65536
#: The rows an overflowing partition loses (the only policy the Redis tiers offer).
OVERFLOW_POLICY: str = "evict_random"
#: An overflowing partition is evicted down to this fraction of its ``overflow_margin``.
OVERFLOW_RESOLUTION_TARGET: float = 0.8
#: How long one call waits to connect to a node or for its reply before the tier counts as unavailable.
SOCKET_TIMEOUT_S: float = 5.0
