"""Fixtures of sok-hps's tests: a real Redis cluster on loopback ports, and threads started together.

``redis_cluster`` (one per test session) and ``fresh_redis_cluster`` (one per test, for tests that
kill nodes) start 3 ``redis-server`` masters in a temporary directory and stop them afterwards.
Without ``redis-server`` on PATH (CI installs it: ci/setup.sh) the tests that use them are skipped
with the reason.

``run_in_threads(count, work)`` runs ``work(0)`` .. ``work(count - 1)`` in ``count`` threads that
start together and fails the test with the first error any of them raised.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

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


def _run_in_threads(count: int, work: Callable[[int], None]) -> None:
    errors: list[BaseException] = []
    barrier = threading.Barrier(count)

    def run(index: int) -> None:
        barrier.wait()
        try:
            work(index)
        except BaseException as error:  # noqa: BLE001 -- reported by the test's thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[0]


@pytest.fixture
def run_in_threads() -> Callable[[int, Callable[[int], None]], None]:
    return _run_in_threads
