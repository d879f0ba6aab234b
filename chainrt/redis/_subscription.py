"""Pub/sub messages read straight off a bare connection: no redis-py pub/sub layer around them.

A ``chainrt serve`` hears every run's notices (``chainrt:run-changes``: queued, running, ended)
on one shared subscription. Read through redis-py's ``PubSub.get_message`` each message went
through its connection's four-layer reply reader and the pub/sub bookkeeping: in a burst, more
of the server's CPU than the HTTP parsing of both requests of a run. Here the connection is
opened as redis-py opens it (so URL options: password, db, TLS, are the client's; RESP2, whose
pub/sub messages are plain arrays), then its transport hands the received bytes to
:class:`._resp_parse.ReplyParser` and each message to the owner's callback, from the
transport's ``data_received``: no reader task.

A connection that stays silent is probed: after ``probe_s`` with nothing received a ``PING`` is
sent; after another ``probe_s`` still silent, the connection is closed as lost (a Redis that
went away without a word: a host down, a partition). :meth:`BareSubscription.lost` then
completes with why; the owner opens a new one and subscribes again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError

from ._lean import pack
from ._pipe import TakenOver
from ._resp_parse import INCOMPLETE, ReplyParser

__all__ = ["BareSubscription", "Message"]

Message = Callable[[bytes, bytes, Any], None]
"""``(kind, channel, data)``: ``kind`` is ``b"message"``, ``b"subscribe"`` or
``b"unsubscribe"`` (``data`` the count of channels then), ``channel`` the channel's name."""

_PING = pack("PING")


class BareSubscription:
    """One subscribed connection, built like ``client``'s (a ``redis.asyncio.Redis``); every
    message goes to ``on_message``. Used from the event loop it is opened on."""

    def __init__(self, conn: Any, on_message: Message, probe_s: float) -> None:
        self._conn = conn
        self._writer = conn._writer
        self._on_message = on_message
        self._parser = ReplyParser(conn)
        self._loop = asyncio.get_running_loop()
        self._lost: asyncio.Future[BaseException] = self._loop.create_future()
        self._heard = True
        self._probed = False
        self._probe_s = probe_s
        self._timer = self._loop.call_later(probe_s, self._probe)
        transport = self._writer.transport
        stream = transport.get_protocol()
        leftover = bytes(conn._reader._buffer)
        conn._reader._buffer.clear()
        transport.set_protocol(TakenOver(self.received, self.connection_lost, stream))
        if leftover:
            self.received(leftover)

    @classmethod
    async def open(
        cls, client: Any, on_message: Message, *, probe_s: float = 10.0, timeout_s: float = 5.0
    ) -> BareSubscription:
        """Connect (within ``timeout_s``) like ``client``'s connections, speaking RESP2."""
        pool = client.connection_pool
        # RESP2 (pub/sub messages are arrays); redis-py's maintenance notifications are
        # RESP3-only (pushes on a connection this reads itself): off.
        kwargs = {
            k: v for k, v in pool.connection_kwargs.items() if not k.startswith("maint_notif")
        }
        kwargs.update(protocol=2, socket_timeout=None)
        conn = pool.connection_class(**kwargs)
        try:
            async with asyncio.timeout(timeout_s):
                await conn.connect()
        except BaseException:
            await conn.disconnect(nowait=True)
            raise
        return cls(conn, on_message, probe_s)

    def subscribe(self, *channels: str) -> None:
        """Subscribe ``channels`` (each confirmed by a ``subscribe`` message)."""
        if channels and not self._lost.done():
            self._writer.write(pack("SUBSCRIBE", *channels))

    def unsubscribe(self, *channels: str) -> None:
        """Unsubscribe ``channels``."""
        if channels and not self._lost.done():
            self._writer.write(pack("UNSUBSCRIBE", *channels))

    async def lost(self) -> BaseException:
        """Wait until the connection is lost or closed; why."""
        return await asyncio.shield(self._lost)

    def received(self, data: bytes) -> None:
        """Bytes from the connection: every whole message in them goes to the owner now."""
        if self._lost.done():
            return
        self._heard = True
        parser = self._parser
        parser.feed(data)
        try:
            while (reply := parser.next()) is not INCOMPLETE:
                if isinstance(reply, list) and len(reply) == 3:
                    kind, channel, payload = reply
                    if isinstance(kind, bytes) and isinstance(channel, bytes):
                        self._on_message(kind, channel, payload)
                # Else a PING's answer (["pong", ""]): the connection lives; nothing to tell.
        except Exception as exc:
            self._fail(RedisConnectionError(f"the pub/sub connection broke: {exc}"))

    def connection_lost(self, exc: BaseException | None) -> None:
        """The transport is gone."""
        why = exc if exc is not None else RedisConnectionError("Connection closed by server.")
        self._fail(why)

    def _probe(self) -> None:
        if self._lost.done():
            return
        if self._heard:
            self._heard, self._probed = False, False
        elif not self._probed:
            self._probed = True
            self._writer.write(_PING)
        else:
            self._fail(RedisConnectionError(f"no answer on pub/sub for {2 * self._probe_s:g}s"))
            return
        self._timer = self._loop.call_later(self._probe_s, self._probe)

    def _fail(self, why: BaseException) -> None:
        if self._lost.done():
            return
        self._timer.cancel()
        self._lost.set_result(why)
        self._writer.transport.close()

    async def aclose(self) -> None:
        """Close the connection."""
        self._fail(RedisConnectionError("the subscription was closed"))
        with contextlib.suppress(Exception):
            await self._conn.disconnect(nowait=True)
