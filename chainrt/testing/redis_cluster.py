"""Start a private, throw-away Redis Cluster on loopback ports (for tests, drills and benches).

``with LocalCluster() as cluster: cluster.url`` — 3 masters and 3 replicas by default, each a
``redis-server --cluster-enabled yes`` child (see :class:`.redis_server.RedisServer`), joined by
``redis-cli --cluster create ... --cluster-replicas 1 --cluster-yes``. The URL names one node; a
cluster client finds the others from it. :meth:`kill` ends a node with ``kill -9`` and
:meth:`wait_failover` waits until its replica has taken over its slots.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import time
from types import TracebackType
from typing import Any

from .redis_server import RedisServer

__all__ = ["LocalCluster", "cluster_ports"]

_BUS_OFFSET = 10_000
"""Redis Cluster talks to its peers on ``port + 10000`` (the cluster bus)."""


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def cluster_ports(count: int) -> list[int]:
    """``count`` ports below 55536 that were free a moment ago, each with its bus port free too."""
    found: list[int] = []
    rng = random.SystemRandom()
    for _ in range(10_000):
        port = rng.randrange(20_000, 65_536 - _BUS_OFFSET)
        if port in found or port + _BUS_OFFSET in found or port - _BUS_OFFSET in found:
            continue
        if _bindable(port) and _bindable(port + _BUS_OFFSET):
            found.append(port)
            if len(found) == count:
                return found
    raise RuntimeError(f"could not find {count} free port pairs (port, port+10000) on 127.0.0.1")


class LocalCluster:
    """A Redis Cluster of ``masters`` masters, each with ``replicas`` replicas, on 127.0.0.1.

    ``node_timeout_ms`` is ``cluster-node-timeout``: how long a master may be unreachable before
    its replica is promoted (a failover takes about that plus a second). Nothing is persisted
    unless ``durable``: then each node keeps an append-only file fsynced once a second (Redis's
    own default with ``--appendonly yes``, what the benches compare with a single node).
    """

    def __init__(
        self,
        *,
        masters: int = 3,
        replicas: int = 1,
        node_timeout_ms: int = 2000,
        durable: bool = False,
    ) -> None:
        if masters < 3:
            raise ValueError("a Redis Cluster needs at least 3 masters")
        binary = shutil.which("redis-cli")
        if binary is None:
            raise RuntimeError("redis-cli is not installed; run `scripts/setup`")
        self._cli = binary
        self.replicas = replicas
        ports = cluster_ports(masters * (1 + replicas))
        extra = [
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(node_timeout_ms),
        ]  # fmt: skip
        self.nodes = [
            RedisServer(port=port, extra_args=extra, durable=durable, appendfsync="everysec")
            for port in ports
        ]

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT`` of the first node still running (any node will do)."""
        return f"redis://127.0.0.1:{self.live_ports()[0]}"

    def live_ports(self) -> list[int]:
        """Ports of the nodes whose process runs."""
        return [n.port for n in self.nodes if n.process is not None and n.process.poll() is None]

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, timeout_s: float = 60.0) -> None:
        """Start every node, create the cluster, wait until every node says ``cluster_state:ok``
        and every replica's link to its master is up."""
        for node in self.nodes:
            node.start()
        addresses = [f"127.0.0.1:{n.port}" for n in self.nodes]
        created = subprocess.run(
            [self._cli, "--cluster", "create", *addresses,
             "--cluster-replicas", str(self.replicas), "--cluster-yes"],
            capture_output=True, text=True, timeout=timeout_s, check=False,
        )  # fmt: skip
        if created.returncode != 0:
            self.close()
            tail = (created.stdout + created.stderr).strip().splitlines()[-3:]
            raise RuntimeError(f"redis-cli --cluster create failed: {' | '.join(tail)}")
        self.wait_ok(timeout_s)

    def wait_ok(self, timeout_s: float = 30.0) -> None:
        """Wait until every live node knows every live node, says ``cluster_state:ok``, and
        every live replica has its master link up."""
        deadline = time.monotonic() + timeout_s
        last = ""
        while time.monotonic() < deadline:
            last = self._not_ok_reason()
            if not last:
                return
            time.sleep(0.1)
        raise RuntimeError(f"the local Redis Cluster is not ready after {timeout_s:g}s: {last}")

    def _not_ok_reason(self) -> str:
        live = self.live_ports()
        for port in live:
            try:
                info = self._info(port, "CLUSTER", "INFO")
                replication = self._info(port, "INFO", "replication")
            except OSError as exc:
                return f"node {port}: {exc}"
            if info.get("cluster_state") != "ok":
                return f"node {port}: cluster_state {info.get('cluster_state')}"
            if replication.get("role") == "slave" and replication.get("master_link_status") != "up":
                return f"replica {port}: master link {replication.get('master_link_status')}"
        return ""

    def kill(self, port: int) -> None:
        """``kill -9`` the node on ``port`` (it stays down until :meth:`restart`)."""
        self._node(port).kill()

    def restart(self, port: int) -> None:
        """Start a killed node again; it rejoins (as a replica if it lost its slots meanwhile)."""
        self._node(port).start()

    def close(self) -> None:
        """Stop every node and remove their temp dirs."""
        for node in self.nodes:
            node.close()

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- topology ----------------------------------------------------------------------------

    def masters(self) -> dict[int, list[tuple[int, int]]]:
        """Live masters as seen by a live node: port -> slot ranges ``(first, last)``."""
        result: dict[int, list[tuple[int, int]]] = {}
        for line in self._command(self.live_ports()[0], "CLUSTER", "NODES").splitlines():
            fields = line.split()
            if len(fields) < 8 or "master" not in fields[2].split(",") or "fail" in fields[2]:
                continue
            port = int(fields[1].split("@")[0].rsplit(":", 1)[1])
            ranges = []
            for part in fields[8:]:
                if part.startswith("["):
                    continue  # a slot being migrated
                first, _, last = part.partition("-")
                ranges.append((int(first), int(last or first)))
            if ranges:
                result[port] = ranges
        return result

    def master_of(self, key: str, masters: dict[int, list[tuple[int, int]]] | None = None) -> int:
        """Port of the master that serves ``key`` now (from ``masters`` if given, else asked)."""
        from redis.crc import key_slot  # the test kit's cluster helpers need redis-py

        slot = key_slot(key.encode())
        for port, ranges in (masters or self.masters()).items():
            if any(first <= slot <= last for first, last in ranges):
                return port
        raise RuntimeError(f"no live master serves slot {slot} of key {key!r}")

    def wait_failover(self, dead_port: int, slots: list[tuple[int, int]], timeout_s: float) -> int:
        """Wait until another live master serves ``slots`` (those of ``dead_port``) and the cluster
        is ok again; returns the new master's port."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                for port, ranges in self.masters().items():
                    took_over = port != dead_port and all(r in ranges for r in slots)
                    if took_over and not self._not_ok_reason():
                        return port
            except OSError:
                pass  # the node we asked is the dead one, or busy: ask again
            time.sleep(0.1)
        raise RuntimeError(f"no replica took over the slots of node {dead_port} in {timeout_s:g}s")

    def flushall(self) -> None:
        """Empty every master (its replicas follow)."""
        for port in self.masters():
            self._command(port, "FLUSHALL")

    # -- plumbing ----------------------------------------------------------------------------

    def _node(self, port: int) -> RedisServer:
        for node in self.nodes:
            if node.port == port:
                return node
        raise KeyError(f"no node on port {port}")

    def _command(self, port: int, *args: str) -> str:
        done = subprocess.run(
            [self._cli, "-h", "127.0.0.1", "-p", str(port), *args],
            capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
        if done.returncode != 0 or "Could not connect" in done.stdout + done.stderr:
            raise OSError(f"redis-cli on port {port}: {(done.stdout + done.stderr).strip()}")
        return done.stdout

    def _info(self, port: int, *args: str) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        for line in self._command(port, *args).splitlines():
            key, sep, value = line.strip().partition(":")
            if sep:
                fields[key] = value
        return fields
