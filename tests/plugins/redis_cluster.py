"""A local Redis Cluster for tests: masters from the embedded redis-server binary.

The cluster bus listens on port + 10000 (redis 6.2 has no --cluster-port), so each node
needs two free loopback ports. Slots are assigned directly (CLUSTER ADDSLOTS, MEET)
rather than through ``redis-cli --cluster create``, which sleeps a second per check.
"""

from __future__ import annotations

import random
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import redis

from proxy.store.embedded import die_with_parent, find_redis_server

SLOTS = 16384


def _free_port_pair(taken: set[int]) -> int:
    """A port P such that P and P + 10000 are free on 127.0.0.1."""
    for _ in range(1000):
        port = random.randint(20000, 55000)
        if port in taken or port + 10000 in taken:
            continue
        sockets = [socket.socket() for _ in range(2)]
        try:
            for sock, candidate in zip(sockets, (port, port + 10000), strict=True):
                sock.bind(("127.0.0.1", candidate))
            return port
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError("no free port pair for a cluster node")


def _wait(condition: Callable[[], object], what: str, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except redis.RedisError:
            pass
        time.sleep(0.02)
    raise RuntimeError(f"local cluster: {what} did not happen in {limit}s")


class LocalRedisCluster:
    def __init__(self, base_dir: Path, masters: int = 3) -> None:
        self.base_dir = base_dir
        self.masters = masters
        self.ports: list[int] = []
        self.processes: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.ports[0]}/0?cluster=1"

    def _spawn(self, index: int) -> None:
        port = _free_port_pair(set(self.ports) | {p + 10000 for p in self.ports})
        node_dir = self.base_dir / f"node-{index}"
        node_dir.mkdir(parents=True)
        settings = {
            "port": str(port),
            "bind": "127.0.0.1",
            "cluster-enabled": "yes",
            "cluster-config-file": "nodes.conf",
            "cluster-node-timeout": "2000",
            "dir": str(node_dir),
            "save": "",
            "appendonly": "no",
            "logfile": str(node_dir / "redis.log"),
        }
        command = [find_redis_server()]
        for name, value in settings.items():
            command += [f"--{name}", value]
        self.processes.append(
            subprocess.Popen(command, stdout=subprocess.DEVNULL, preexec_fn=die_with_parent)
        )
        self.ports.append(port)

    def _client(self, index: int) -> redis.Redis:
        return redis.Redis(port=self.ports[index], socket_timeout=5)

    def start(self) -> str:
        try:
            for index in range(self.masters):
                self._spawn(index)
            clients = [self._client(i) for i in range(self.masters)]
            for client in clients:
                _wait(client.ping, "node start")
            for index, client in enumerate(clients):
                first = index * SLOTS // self.masters
                last = (index + 1) * SLOTS // self.masters
                client.execute_command("CLUSTER", "ADDSLOTS", *range(first, last))
                client.execute_command("CLUSTER", "SET-CONFIG-EPOCH", index + 1)
            for port in self.ports[1:]:
                clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", port)

            def settled() -> bool:
                for client in clients:
                    info = client.execute_command("CLUSTER", "INFO").decode()
                    if "cluster_state:ok" not in info:
                        return False
                    if f"cluster_known_nodes:{self.masters}" not in info:
                        return False
                return True

            _wait(settled, "cluster agreement")
            for client in clients:
                client.close()
        except BaseException:
            self.stop()
            raise
        return self.url

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes.clear()
        self.ports.clear()
