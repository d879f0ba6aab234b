"""Hot-path Redis calls on bare connections: no redis-py command layer around them.

A durable step costs one ``EVALSHA`` (the store's commit script), a concurrency-key pair two. Sent
through ``redis.asyncio.Redis`` each call also pays the pool's lock and health probe, the retry
wrapper, the observability hooks, argument encoding and, with a socket timeout, an
``asyncio.wait_for`` (a task) around every write: on a 2-CPU machine about as much Python as the
round trip itself. :class:`LeanRedis` sends a command packed once (:func:`pack`) on a connection
of its own, built by the same connection class as the client's (so URL options: password, db, TLS,
protocol, are the client's), and reads its replies straight off the connection's stream
(:mod:`._resp`: the same values and error types as redis-py's parser, with less Python).

Connections are used by one call at a time: a call takes an idle one (or opens a new one) and
gives it back after its replies are read. A call that fails in any way other than a Redis error
reply (a lost connection, a timeout, a cancellation) closes its connection: no later call reads
a reply meant for another. Nothing here retries: the callers do (their scripts are idempotent).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable, Sequence
from typing import Any

from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from .._watchdog import Watchdog
from ._pipe import Pipe
from ._resp import read_replies, write

__all__ = ["NOT_SENT", "LeanRedis", "pack", "pack_args"]

NOT_SENT: Any = object()
"""What :meth:`LeanRedis.multi_unconfirmed` returns when no pipe is open (nothing was sent)."""


def pack(*args: bytes | str | int | float) -> bytes:
    """``args`` as one RESP command, ready to write.

    Strings are UTF-8; numbers as ``repr`` (as redis-py encodes them); bytes as they are.
    """
    return b"*%d\r\n%s" % (len(args), pack_args(args))


def pack_args(args: Iterable[bytes | str | int | float]) -> bytes:
    """The RESP encoding of ``args`` without the array header: for parts of a command packed
    once and reused (``b"*%d\r\n" % count`` + its parts, in order, is the command)."""
    parts = []
    for arg in args:
        if isinstance(arg, str):
            data = arg.encode()
        elif isinstance(arg, bytes):
            data = arg
        else:
            data = _other(arg)
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def _other(arg: object) -> bytes:
    """Anything but ``str`` and ``bytes`` (:func:`pack_args` encodes those itself)."""
    if isinstance(arg, bytearray | memoryview):
        return bytes(arg)
    if isinstance(arg, int | float) and not isinstance(arg, bool):
        return repr(arg).encode()
    raise TypeError(f"cannot send {type(arg).__name__} to Redis")


_MULTI = b"*1\r\n$5\r\nMULTI\r\n"
_EXEC = b"*1\r\n$4\r\nEXEC\r\n"


class LeanRedis:
    """Commands on bare connections built like ``client``'s (a ``redis.asyncio.Redis``).

    ``timeout_s`` bounds one call (connect, write and every reply; one timer for all calls, see
    :mod:`._watchdog`); None: no bound (the caller's own deadline ends a stuck call). Bound to the event loop it is
    first used on, like the client.
    """

    def __init__(self, client: Any, *, timeout_s: float | None) -> None:
        pool = client.connection_pool
        self._setup(pool.connection_class, pool.connection_kwargs, timeout_s)

    @classmethod
    def of_node(cls, node: Any, *, timeout_s: float | None) -> LeanRedis:
        """Bare connections to one node of a Redis Cluster (a redis-py ``ClusterNode``), built
        like the cluster client's own connections to it: no retry of their own."""
        lean = cls.__new__(cls)
        kwargs = {**node.connection_kwargs, "retry": Retry(NoBackoff(), 0)}
        lean._setup(node.connection_class, kwargs, timeout_s)
        return lean

    def _setup(self, cls: Any, kwargs: dict[str, Any], timeout_s: float | None) -> None:
        self._class = cls
        # The call's timeout replaces the connection's socket timeout (which redis-py enforces
        # with a wait_for per write and a timeout context per read).
        self._kwargs = {**kwargs, "socket_timeout": None}
        self._watchdog = None if timeout_s is None else Watchdog(timeout_s)
        self._idle: list[Any] = []
        self._closed = False
        self._timeout_s = timeout_s
        self._pipe: Pipe | None = None
        self._opening: asyncio.Future[Pipe] | None = None

    async def call(self, command: list[bytes], replies: int = 1) -> list[Any]:
        """Write ``command`` (commands packed by :func:`pack`, in order) and read ``replies``
        replies. A Redis error reply comes back in its place as a ``ResponseError``; any other
        failure raises (redis-py's ConnectionError, or TimeoutError past ``timeout_s``)."""
        if self._closed:
            raise RuntimeError("LeanRedis is closed")
        conn = self._idle.pop() if self._idle else self._class(**self._kwargs)
        done = False
        try:
            if self._watchdog is None:
                out = await _exchange(conn, command, replies)
            else:
                out = await self._watchdog.run(_exchange(conn, command, replies))
            done = True
        finally:
            if done and not self._closed:
                self._idle.append(conn)
            else:  # its state is unknown (a reply may still be on the way): never reuse it
                await conn.disconnect(nowait=True)
        return out

    def pipelined(self, command: bytes) -> Awaitable[Any]:
        """Send one packed ``command`` on this client's pipe (one connection shared by every
        pipelined call, see :mod:`._pipe`); await its reply. Fails as :meth:`call` does (a
        broken pipe is replaced by a new one at the next call). With the pipe open, what is
        awaited is the reply's future itself (no coroutine around it, issue 18)."""
        future = self.send_unconfirmed(command)
        return self._open_and_send(command) if future is None else future

    def send_unconfirmed(self, command: bytes) -> asyncio.Future[Any] | None:
        """Send one packed ``command`` on the open pipe and return its reply's future at once:
        the command goes out before anything pipelined after it. None (nothing sent) when no
        pipe is open or the last one broke: the caller awaits :meth:`pipelined` instead."""
        pipe = self._pipe
        if pipe is None or pipe.error is not None or self._closed:
            return None
        return pipe.send(command)

    async def multi_unconfirmed(self, commands: Sequence[bytes]) -> Any:
        """``commands`` (each packed by :func:`pack`) in one ``MULTI``/``EXEC`` on the open
        pipe, written together with nothing between them: ``EXEC``'s reply (a list of their
        replies, a Redis error reply in its place as a ``ResponseError`` instance), or the
        error reply that refused the transaction (``EXECABORT``), returned. :data:`NOT_SENT`
        (nothing sent) when no pipe is open or the last one broke. Fails as :meth:`call` does."""
        pipe = self._pipe
        if pipe is None or pipe.error is not None or self._closed:
            return NOT_SENT
        sent = [pipe.send(_MULTI), *(pipe.send(command) for command in commands)]
        sent.append(pipe.send(_EXEC))
        replies = await asyncio.gather(*sent)  # (every failure retrieved, none left unread)
        return replies[-1]

    async def _open_and_send(self, command: bytes) -> Any:
        pipe = await self._open_pipe()
        return await pipe.send(command)

    async def _open_pipe(self) -> Pipe:
        """The pipe, opened by the first caller to need it; the others wait for that one."""
        if self._closed:
            raise RuntimeError("LeanRedis is closed")
        opening = self._opening
        if opening is not None:
            return await asyncio.shield(opening)
        opening = self._opening = asyncio.get_running_loop().create_future()
        conn = self._class(**self._kwargs)
        try:
            if self._watchdog is None:
                await conn.connect()
            else:
                await self._watchdog.run(conn.connect())
            if self._closed:  # meanwhile: a call to go again
                raise RedisConnectionError("the connection was closed while it opened")
            pipe = self._pipe = Pipe(conn, timeout_s=self._timeout_s)
        except BaseException as exc:
            # The others get the same error; this caller's own cancellation is not theirs:
            # they get an error they can retry on.
            shared = exc
            if not isinstance(exc, Exception):
                shared = RedisConnectionError("the connection's opener was cancelled")
            opening.set_exception(shared)
            opening.exception()  # (nobody else may be waiting)
            await conn.disconnect(nowait=True)
            raise
        finally:
            self._opening = None
        opening.set_result(pipe)
        return pipe

    async def aclose(self) -> None:
        """Close every idle connection and the pipe; calls after this raise."""
        self._closed = True
        pipe, self._pipe = self._pipe, None
        if pipe is not None:
            await pipe.aclose()
        if self._watchdog is not None:
            self._watchdog.stop()
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.disconnect(nowait=True)


async def _exchange(conn: Any, command: list[bytes], replies: int) -> list[Any]:
    if not conn.is_connected:
        await conn.connect()
    await write(conn, command)
    return await read_replies(conn, replies)
