"""Fixtures of sok-hps's tests: a real Redis cluster on loopback ports.

``redis_cluster`` (one per test session) and ``fresh_redis_cluster`` (one per test, for tests that
kill nodes) start 3 ``redis-server`` masters in a temporary directory and stop them afterwards.
Without ``redis-server`` on PATH (CI installs it: ci/setup.sh) the tests that use them are skipped
with the reason.
"""

from __future__ import annotations

import pytest
from hierarchical_parameter_server.testing_redis import LocalRedisCluster, RedisNotInstalled


def _start(directory) -> LocalRedisCluster:
    pytest.importorskip("redis", reason="redis-py is not installed: pip install 'sok-hps[redis]'")
    try:
        return LocalRedisCluster(directory, nodes=3).start()
    except RedisNotInstalled as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory):
    cluster = _start(tmp_path_factory.mktemp("redis"))
    yield cluster
    cluster.stop()


@pytest.fixture
def fresh_redis_cluster(tmp_path):
    cluster = _start(tmp_path / "redis")
    yield cluster
    cluster.stop()
