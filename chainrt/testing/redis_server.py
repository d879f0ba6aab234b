"""Start a private, throw-away ``redis-server`` on a free loopback port (for tests and benches)."""

from __future__ import annotations

import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Literal

__all__ = ["RedisServer", "free_port"]


_LOW_PORT = 20000
"""Where :func:`free_port` starts looking (below the kernel's ephemeral range)."""


def _ephemeral_low() -> int:
    """The first port the kernel hands out as a source port (32768 when it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, below the ephemeral range.

    A port the kernel may also pick as a client's source port can be joined to itself by a
    connect made before the server listens (TCP simultaneous open): a readiness probe then
    reads its own bytes back and the server can no longer bind. Ports below the ephemeral
    range are never picked as source ports, so that cannot happen there. Falls back to a
    port the kernel chooses when none of the tries below the range is free.
    """
    top = _ephemeral_low()
    if top - _LOW_PORT >= 1000:
        for _ in range(64):
            port = random.randrange(_LOW_PORT, top)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        chosen: int = sock.getsockname()[1]
        return chosen


class RedisServer:
    """A ``redis-server`` child process: loopback only, its own temp dir, optionally a password.

    ``with RedisServer() as server: server.url`` — stopped and cleaned up on exit. By default
    nothing is persisted. With ``durable=True`` every write is fsynced to an append-only file
    before Redis replies, so a write Redis acknowledged survives :meth:`kill` (``kill -9``) and
    comes back on the next :meth:`start` or :meth:`restart` (same port, same data dir).
    ``appendfsync="everysec"`` fsyncs once a second instead — Redis's own default with
    ``--appendonly yes``, as docker-compose runs it, and what the benchmarks measure by default.
    ``extra_args`` are more ``redis-server`` options (the cluster helper uses them).
    ``pause()``/``resume()`` are not offered: tests SIGSTOP the process through ``server.process``
    when they need that.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        password: str | None = None,
        durable: bool = False,
        appendfsync: Literal["always", "everysec"] = "always",
        extra_args: Sequence[str] = (),
    ) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError(
                "redis-server is not installed; run `scripts/setup` (it installs it with apt-get)"
            )
        self._binary = binary
        self.port = port or free_port()
        self.password = password
        self.durable = durable
        self.appendfsync = appendfsync
        """When the append-only file is fsynced (only with ``durable``)."""
        self.extra_args = tuple(extra_args)
        """More ``redis-server`` options (``--cluster-enabled yes`` ...), given after ours."""
        self._dir = Path(tempfile.mkdtemp(prefix="chainrt-redis-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://[:password@]127.0.0.1:PORT/0``."""
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        """Start the server and wait until it answers PING (a durable one replays its file first)."""
        args = [
            self._binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "yes" if self.durable else "no",
            "--dir", str(self._dir),
            "--daemonize", "no",
            "--loglevel", "warning",
        ]  # fmt: skip
        if self.durable:
            args += ["--appendfsync", self.appendfsync]
        if self.password:
            args += ["--requirepass", self.password]
        args += self.extra_args
        self.process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self._dir
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with code {self.process.returncode}")
            if self._ping():
                return
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not answer on port {self.port} in {timeout_s}s")

    def _ping(self) -> bool:
        """True once PING gets +PONG; False while refused or -LOADING (replaying its file)."""
        try:
            with (
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock,
                sock.makefile("rb") as replies,
            ):
                if sock.getsockname() == sock.getpeername():
                    # Nothing listens yet and the kernel joined the socket to itself (a port in
                    # the ephemeral range can be picked as its own source): it would echo PING.
                    return False
                if self.password:
                    # AUTH is served even while loading; a wrong password shows up at PING.
                    sock.sendall(f"AUTH {self.password}\r\n".encode())
                    replies.readline()
                sock.sendall(b"PING\r\n")
                reply = replies.readline()
        except OSError:
            return False
        if reply.startswith(b"+PONG"):
            return True
        if reply.startswith(b"-LOADING") or not reply:
            return False
        self.stop()
        raise RuntimeError(f"redis-server on port {self.port} answered PING with {reply!r}")

    def kill(self) -> None:
        """``kill -9``: no shutdown, no final save; returns once the process is gone."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.kill()  # SIGKILL also ends a SIGSTOPped process
            process.wait()

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 5 s)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)  # a test may have left it SIGSTOPped
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def restart(self) -> None:
        """Stop and start again on the same port and data dir.

        Without ``durable`` all data is lost (nothing is persisted); with it, every acknowledged
        write is back once this returns.
        """
        self.stop()
        self.start()

    def close(self) -> None:
        """Stop and remove the temp dir."""
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
