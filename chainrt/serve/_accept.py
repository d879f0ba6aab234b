"""The cap on open connections (``--max-connections``): accepting with backpressure.

Every connection holds a file descriptor. asyncio accepts whatever the kernel hands it; in a
burst of connections past ``ulimit -n`` its accept fails with "Too many open files" (one
traceback per try: 11,850 of them in a 1,500-stream burst), and so does everything else that
needs a descriptor meanwhile: an event stream's store read could not open its Redis connection
and was answered 503 although its stream had a slot.

Here the server accepts its connections itself (:class:`ConnectionGate`), at most ``limit``
open at once. At the limit it stops accepting: later clients wait in the kernel's listen
backlog (their connect succeeds; their request is read as soon as a connection closes) rather
than being refused or starving the process. An accept that fails for lack of descriptors anyway
(``limit`` set above what the process can hold) pauses accepting with a backoff, logged once
per episode.

The default leaves a reserve of descriptors for the rest of the process (the Redis pool and
pub/sub, store files, logs): the open-files limit less :data:`RESERVE` (a quarter of it at
most). Under ``ulimit -n 1024``: 832 connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import resource
import socket
import time
from collections.abc import Callable, Collection

from ..errors import InputError

__all__ = ["DEFAULT_MAX", "RESERVE", "ConnectionGate", "bound_socket", "default_max_connections"]

log = logging.getLogger("chainrt.serve")

DEFAULT_MAX = 100_000
"""The default cap when the open-files limit is unlimited."""

RESERVE = 192
"""Descriptors the default cap leaves to the rest of the process."""

_NO_RESOURCE = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_BACKOFF_S = (0.05, 0.1, 0.2, 0.5, 1.0)
_BATCH = 64  # connections accepted per wake-up of the listening socket
_LOG_EVERY_S = 60.0  # "the cap is reached" at most this often


def default_max_connections(nofile: int | None = None) -> int:
    """The open-files limit (``nofile``: this process's soft limit when None) less
    :data:`RESERVE` (at most a quarter of it), at least 1; :data:`DEFAULT_MAX` when the
    limit is unlimited."""
    if nofile is None:
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if nofile < 0 or nofile == resource.RLIM_INFINITY:
        return DEFAULT_MAX
    return max(1, min(DEFAULT_MAX, nofile - min(RESERVE, nofile // 4)))


def bound_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host``:``port`` (not listening yet); InputError, one line, when
    the address cannot be had (in use, not this machine's)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise InputError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


ProtocolFactory = Callable[[], asyncio.Protocol]


class ConnectionGate:
    """Accepts the connections of listening sockets, at most ``limit`` open at once.

    The open connections are a live collection (uvicorn's ``server_state.connections``: each
    protocol adds itself when made and discards itself when lost); the protocol calls
    :meth:`wake` when a connection is lost, so that accepting resumes below the limit.
    """

    def __init__(self, limit: int | None) -> None:
        self.limit = default_max_connections() if limit is None else limit
        if self.limit < 1:
            raise ValueError(f"the connection cap must be at least 1, got {self.limit}")
        self.paused_at_limit = 0
        """Times accepting stopped because ``limit`` connections were open."""
        self.starved = 0
        """Accepts that failed for lack of file descriptors (each pauses accepting a while)."""
        self.body_timeouts = 0
        """Requests answered 408 by the protocol: their body was not in by --body-timeout."""
        self._connections: Collection[object] = ()
        self._setting_up = 0  # accepted, protocol not yet made
        self._listeners: list[tuple[socket.socket, ProtocolFactory]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._reading = False
        self._retry: asyncio.TimerHandle | None = None
        self._attempt = 0
        self._logged_limit_at = float("-inf")
        self._logged_starved_at = float("-inf")
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def open(self) -> int:
        """Connections open now (those being set up included)."""
        return len(self._connections) + self._setting_up

    def take_over(
        self,
        sockets: Collection[socket.socket],
        factory: ProtocolFactory,
        connections: Collection[object],
    ) -> None:
        """Accept on ``sockets`` (already listening, served by the running loop) from now on,
        with connections made by ``factory``; the loop's own accepting on them stops.
        ``connections``: the open ones (see the class docstring)."""
        self._connections = connections
        self._loop = loop = asyncio.get_running_loop()
        for sock in sockets:
            loop.remove_reader(sock.fileno())  # the loop's own accept handler
            sock.setblocking(False)
            self._listeners.append((sock, factory))
        self._resume()

    def wake(self) -> None:
        """A connection closed: accept again if accepting stopped at the limit."""
        if not self._reading and self._retry is None and self.open < self.limit:
            self._resume()

    def close(self) -> None:
        """Stop accepting (the sockets themselves are closed by their server)."""
        self._closed = True
        self._pause()
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None

    def _resume(self) -> None:
        if self._closed or self._reading or self._loop is None:
            return
        for sock, factory in self._listeners:
            if sock.fileno() != -1:
                self._loop.add_reader(sock.fileno(), self._accept, sock, factory)
        self._reading = True

    def _pause(self) -> None:
        if self._reading and self._loop is not None:
            for sock, _ in self._listeners:
                if sock.fileno() != -1:
                    self._loop.remove_reader(sock.fileno())
        self._reading = False

    def _accept(self, sock: socket.socket, factory: ProtocolFactory) -> None:
        for _ in range(_BATCH):
            if self.open >= self.limit:
                self._at_limit()
                return
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _NO_RESOURCE:
                    self._starving(exc)
                    return
                if exc.errno == errno.ECONNABORTED:
                    continue  # the client left before we took it
                log.warning("accepting a connection failed (%s)", exc)
                return
            self._attempt = 0
            conn.setblocking(False)
            self._setting_up += 1
            task = asyncio.ensure_future(self._connect(conn, factory))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _connect(self, conn: socket.socket, factory: ProtocolFactory) -> None:
        assert self._loop is not None
        try:
            await self._loop.connect_accepted_socket(factory, conn)
        except Exception as exc:  # the client left meanwhile, or no memory: drop it
            log.debug("a connection could not be set up (%s)", exc)
            with contextlib.suppress(OSError):
                conn.close()
        finally:
            self._setting_up -= 1
        self.wake()

    def _at_limit(self) -> None:
        self._pause()
        self.paused_at_limit += 1
        now = time.monotonic()
        if now - self._logged_limit_at >= _LOG_EVERY_S:
            self._logged_limit_at = now
            log.warning(
                "%d connections open (--max-connections): new ones wait until some close",
                self.limit,
            )

    def _starving(self, exc: OSError) -> None:
        self._pause()
        self.starved += 1
        delay = _BACKOFF_S[min(self._attempt, len(_BACKOFF_S) - 1)]
        now = time.monotonic()
        if self._attempt == 0 and now - self._logged_starved_at >= _LOG_EVERY_S:
            self._logged_starved_at = now
            log.warning(
                "accepting connections failed with %d open (%s): paused, tried again with "
                "backoff (lower --max-connections below ulimit -n)",
                self.open,
                exc.strerror or exc,
            )
        self._attempt += 1
        assert self._loop is not None
        self._retry = self._loop.call_later(delay, self._retried)

    def _retried(self) -> None:
        self._retry = None
        if self.open < self.limit:
            self._resume()
