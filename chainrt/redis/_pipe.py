"""Commands pipelined on one connection: written as they come, replies read by one task, in order.

Group commit that waits for a round trip to end before it sends the next batch leaves the process
idle while its batch is on the wire, then has every woken run wait for the one round trip that
carries all their next commits. Here nothing waits for the wire: a command is written when it
comes, and a reader task hands each reply to its caller as it arrives, in the order the commands
were written (Redis answers the commands of one connection in order). Commands that come while
others are in flight are written together at the end of the loop turn, in one write: the commits
of runs woken by the same replies share one write and one read on the server. A command that finds
nothing in flight is written at once: a lone run waits for no loop turn.

A reply that does not come within ``timeout_s`` of its command, a lost connection, or a reply
nobody asked for breaks the pipe: every command still in flight fails with redis-py's
``ConnectionError`` or ``TimeoutError`` (its outcome is unknown; the callers' scripts are safe to
send again), the connection is closed and never read again, and the owner opens a new pipe for
the next command. A caller that stops waiting (cancelled) leaves its reply to be read and dropped:
the connection stays in step.

Replies are handed out from the transport's ``data_received`` callback (the pipe takes the
transport over from the connection's stream protocol): a reply reaches its caller in the loop turn
after it arrives, with no reader task in between (issue 18).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse
from redis.exceptions import TimeoutError as RedisTimeoutError

from ._resp_parse import INCOMPLETE, ReplyParser

__all__ = ["Pipe", "TakenOver"]


class Pipe:
    """One connected redis-py asyncio connection ``conn``, owned by the pipe from now on.

    Used from the event loop it is made on. :attr:`error` is set once the pipe is broken.
    """

    def __init__(self, conn: Any, *, timeout_s: float | None) -> None:
        self._conn = conn
        self._writer = conn._writer
        self._timeout_s = timeout_s
        self._loop = asyncio.get_running_loop()
        # The callers waiting, in the order their commands were written (or will be), with the
        # loop time their reply is due by.
        self._waiting: collections.deque[tuple[asyncio.Future[Any], float]] = collections.deque()
        self._batch: list[bytes] = []  # commands of this loop turn not written yet
        self._timer: asyncio.TimerHandle | None = None
        self.error: BaseException | None = None
        """Why the pipe broke; None while it works."""
        self._closing: asyncio.Task[None] | None = None
        self._parser = ReplyParser(conn)
        transport = self._writer.transport
        stream = transport.get_protocol()
        leftover = bytes(conn._reader._buffer)  # (none: the handshake's replies were read)
        conn._reader._buffer.clear()
        transport.set_protocol(TakenOver(self.received, self.lost, stream))
        if leftover:
            self.received(leftover)

    def send(self, command: bytes) -> asyncio.Future[Any]:
        """Write ``command`` (one packed command) now or at the end of this loop turn; the
        future gets its reply: a value, or a Redis error reply as a ``ResponseError`` instance
        (not raised), or the error that broke the pipe (raised)."""
        if self.error is not None:
            raise type(self.error)(*self.error.args)
        future: asyncio.Future[Any] = self._loop.create_future()
        idle = not self._waiting
        due = 0.0 if self._timeout_s is None else self._loop.time() + self._timeout_s
        self._waiting.append((future, due))
        if idle:  # nothing in flight: out at once
            self._writer.write(command)
            if self._timeout_s is not None and self._timer is None:
                self._timer = self._loop.call_at(due, self._check_due)
            return future
        if not self._batch:
            self._loop.call_soon(self._flush)
        self._batch.append(command)
        return future

    def _flush(self) -> None:
        batch, self._batch = self._batch, []
        if batch and self.error is None:
            self._writer.write(b"".join(batch))

    def received(self, data: bytes) -> None:
        """Bytes from the connection: every whole reply in them goes to its caller now."""
        if self.error is not None:
            return
        parser, waiting = self._parser, self._waiting
        parser.feed(data)
        try:
            while (reply := parser.next()) is not INCOMPLETE:
                if not waiting:
                    raise InvalidResponse(f"a reply nobody asked for: {reply!r}")
                future, _ = waiting.popleft()
                if not future.done():  # (done: its caller stopped waiting)
                    future.set_result(reply)
        except Exception as exc:
            if not isinstance(exc, RedisConnectionError | RedisTimeoutError):
                exc = RedisConnectionError(
                    f"the Redis connection broke: {type(exc).__name__}: {exc}"
                )
            self.fail(exc)

    def lost(self, exc: BaseException | None) -> None:
        """The connection is gone (closed by the server, a socket error, or by this pipe)."""
        if exc is None:
            self.fail(RedisConnectionError("Connection closed by server."))
        else:
            self.fail(RedisConnectionError(f"Error while reading from socket: {exc}"))

    def _check_due(self) -> None:
        """The timer: break the pipe if the oldest reply is overdue, else wait for it."""
        self._timer = None
        if not self._waiting or self.error is not None:
            return
        due = self._waiting[0][1]
        if due <= self._loop.time():
            self.fail(RedisTimeoutError(f"no reply from Redis within {self._timeout_s:g}s"))
        else:
            self._timer = self._loop.call_at(due, self._check_due)

    def fail(self, error: BaseException) -> None:
        """Break the pipe: every command in flight fails with ``error``; the connection closes."""
        if self.error is not None:
            return
        self.error = error
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._batch = []
        waiting, self._waiting = self._waiting, collections.deque()
        for future, _ in waiting:
            if not future.done():
                # One exception each: raised in many tasks, one instance would gather all
                # their tracebacks.
                future.set_exception(type(error)(*error.args))
                future.exception()  # retrieved here: a caller that stopped waiting never reads it
        if not self._loop.is_closed():
            self._closing = self._loop.create_task(self._disconnect())

    async def _disconnect(self) -> None:
        with contextlib.suppress(Exception):
            await self._conn.disconnect(nowait=True)

    async def aclose(self) -> None:
        """Break the pipe (if it is not) and wait until its connection is closed."""
        self.fail(RedisConnectionError("the Redis pipe was closed"))
        if self._closing is not None and self._closing is not asyncio.current_task():
            with contextlib.suppress(BaseException):
                await self._closing


class TakenOver(asyncio.Protocol):
    """A transport's protocol once chainrt reads the connection itself (a pipe, a pub/sub
    subscription): received bytes go to ``received``, the end to ``lost``; the connection's
    stream protocol still hears of flow control and of the end (so that redis-py's close and
    ``drain`` behave as they did)."""

    def __init__(
        self,
        received: Callable[[bytes], None],
        lost: Callable[[BaseException | None], None],
        stream: Any,
    ) -> None:
        self._received = received
        self._lost = lost
        self._stream = stream

    def data_received(self, data: bytes) -> None:
        self._received(data)

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost(exc)
        self._stream.connection_lost(exc)

    def pause_writing(self) -> None:
        self._stream.pause_writing()

    def resume_writing(self) -> None:
        self._stream.resume_writing()
