"""A throw-away Redis cluster of real ``redis-server`` processes on loopback ports, for tests and demos.

Each node runs in its own directory with cluster mode and an fsync-always append-only file, so a
node that is killed and started again (same port, same directory) comes back with its data and
its place in the cluster (``nodes.conf``).

Example::

    with LocalRedisCluster(tmp_dir, nodes=3) as cluster:
        cluster.address          # '127.0.0.1:40001,127.0.0.1:40002,127.0.0.1:40003'
        cluster.kill(1)          # SIGKILL node 1
        cluster.restart(1)       # same port and directory; waits for cluster_state:ok
        cluster.pause(2)         # SIGSTOP: connections stay open, nothing is answered
        cluster.resume(2)        # SIGCONT; waits for cluster_state:ok
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import time

__all__ = ["LocalRedisCluster", "RedisNotInstalled", "free_port"]

log = logging.getLogger(__name__)


class RedisNotInstalled(RuntimeError):
    """``redis-server`` or ``redis-cli`` is not on PATH (Debian/Ubuntu: ``apt-get install redis-server``)."""


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A loopback port that is free now and whose cluster-bus port (``port + 10000``) is free too."""
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 10000 < 65536 and _port_free(port + 10000):
            return port
    raise RuntimeError("found no free loopback port pair (port, port + 10000) in 200 tries")


class LocalRedisCluster:
    """``nodes`` Redis masters (no replicas) on free loopback ports, under ``directory``.

    Args:
        directory: where each node keeps its files (``<directory>/<port>/``).
        nodes: how many masters (Redis clusters need at least 3).
        node_timeout_ms: ``cluster-node-timeout``: how soon the others call a silent node failed.
        ready_timeout_s: how long :meth:`start` and :meth:`restart` wait for ``cluster_state:ok``.
    """

    def __init__(
        self, directory: str | os.PathLike, nodes: int = 3, node_timeout_ms: int = 1000, ready_timeout_s: float = 30.0
    ) -> None:
        for tool in ("redis-server", "redis-cli"):
            if shutil.which(tool) is None:
                raise RedisNotInstalled(f"{tool} is not on PATH; install Redis (Debian: apt-get install redis-server)")
        self.directory = os.fspath(directory)
        self.node_timeout_ms = node_timeout_ms
        self.ready_timeout_s = ready_timeout_s
        self.ports: list[int] = []
        while len(self.ports) < nodes:
            port = free_port()
            if port not in self.ports:
                self.ports.append(port)
        self._procs: dict[int, subprocess.Popen] = {}

    @property
    def address(self) -> str:
        """The nodes as ``volatile_db.address`` takes them."""
        return ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def _launch(self, port: int) -> None:
        node_dir = os.path.join(self.directory, str(port))
        os.makedirs(node_dir, exist_ok=True)
        args = [
            "redis-server",
            "--port", str(port),
            "--bind", "127.0.0.1",
            "--dir", node_dir,
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(self.node_timeout_ms),
            "--appendonly", "yes",
            "--appendfsync", "always",
            "--save", "",
            "--daemonize", "no",
            "--protected-mode", "no",
            "--logfile", os.path.join(node_dir, "redis.log"),
        ]  # fmt: skip
        self._procs[port] = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait(lambda: self._cli(port, "ping") == "PONG", f"redis-server on port {port} to answer PING")

    def _cli(self, port: int, *command: str) -> str:
        result = subprocess.run(
            ["redis-cli", "-h", "127.0.0.1", "-p", str(port), *command], capture_output=True, text=True, timeout=10
        )
        return result.stdout.strip()

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while not ready():
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {self.ready_timeout_s} s for {what}; see the logs under {self.directory}")
            time.sleep(0.05)

    def _cluster_ok(self) -> bool:
        return all("cluster_state:ok" in self._cli(p, "cluster", "info") for p in self.ports if p in self._procs)

    def start(self) -> LocalRedisCluster:
        """Start the nodes, join them into one cluster and wait for ``cluster_state:ok``."""
        try:
            for port in self.ports:
                self._launch(port)
            create = subprocess.run(
                ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports)]
                + ["--cluster-replicas", "0", "--cluster-yes"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            if create.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed: {create.stdout[-2000:]}{create.stderr[-2000:]}")
            self._wait(self._cluster_ok, "cluster_state:ok on every node")
        except BaseException:
            self.stop()
            raise
        log.info("Redis cluster up on %s", self.address)
        return self

    def kill(self, node: int) -> None:
        """SIGKILL node ``node`` (an index into :attr:`ports`) and wait until it is gone."""
        proc = self._procs.pop(self.ports[node])
        proc.kill()
        proc.wait(timeout=10)

    def restart(self, node: int) -> None:
        """Start node ``node`` again on its port and directory and wait for ``cluster_state:ok``."""
        self._launch(self.ports[node])
        self._wait(self._cluster_ok, "cluster_state:ok after the restart")

    def pause(self, node: int) -> None:
        """SIGSTOP node ``node``: it keeps its connections open and answers nothing (a hung node)."""
        self._procs[self.ports[node]].send_signal(signal.SIGSTOP)

    def resume(self, node: int) -> None:
        """SIGCONT node ``node`` (after :meth:`pause`) and wait for ``cluster_state:ok``."""
        self._procs[self.ports[node]].send_signal(signal.SIGCONT)
        self._wait(self._cluster_ok, "cluster_state:ok after the resume")

    def stop(self) -> None:
        """Stop every node that runs (SIGTERM, then SIGKILL after 10 s)."""
        for port, proc in list(self._procs.items()):
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
            del self._procs[port]

    def __enter__(self) -> LocalRedisCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
