"""Wake-ups for Redis waiters: one pub/sub channel per limiter instance, no busy polling.

Why one channel per *instance* rather than per key: the subscription is made once and stays, so
a waiter never has to subscribe and unsubscribe per wait (two extra round trips each, and a race
between its ticket and its subscription). The scripts know which instance owns a ticket from the
ticket's member id and publish that member on the instance's channel; the reader task below
routes it to the waiter's :class:`Wake`.

Pub/sub is at-most-once. A message lost while the connection was down is covered twice over:
every waiter is woken when the subscription comes back, and every waiter looks again at least
once per ticket refresh interval anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from ._wake import Wake

__all__ = ["PubSubWaker"]

_log = logging.getLogger("chainrt.concurrency")

_BACKOFF_S = (0.05, 1.0)
"""First and longest pause between two reconnection attempts of the reader."""


class PubSubWaker:
    """Routes wake-up messages of one limiter instance to the waiting acquisitions."""

    def __init__(self, client: Any, channel: str) -> None:
        self._client = client
        self._channel = channel
        self._wakes: dict[str, Wake] = {}
        self._ready: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._pubsub: Any = None

    def use(self, client: Any) -> None:
        """Subscribe through ``client`` (anything with ``pubsub()``) from now on."""
        self._client = client

    def register(self, member: str, wake: Wake) -> None:
        """Deliver wake-ups addressed to ``member`` to ``wake``."""
        self._wakes[member] = wake

    def unregister(self, member: str) -> None:
        """Stop delivering wake-ups to ``member``."""
        self._wakes.pop(member, None)

    async def ensure_ready(self, timeout_s: float) -> bool:
        """Make sure the channel is subscribed; True if this call had to wait for it.

        A waiter that had to wait must look at the key again before sleeping: a release that
        happened before the subscription was confirmed published into the void.
        """
        if self._task is None:
            self._ready = asyncio.Event()
            self._pubsub = self._client.pubsub()
            self._task = asyncio.create_task(self._read(), name=f"chainrt-wake:{self._channel}")
        assert self._ready is not None
        if self._ready.is_set():
            return False
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation that
        # arrives as the inner wait finishes, and a waiter would then hold a slot nobody releases.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._ready.wait()
        return True

    async def _read(self) -> None:
        assert self._ready is not None
        pause = _BACKOFF_S[0]
        subscribed = False
        while True:
            try:
                if not subscribed:
                    # The first time, or after a lost connection (with a fresh pubsub object).
                    await self._pubsub.subscribe(self._channel)
                    subscribed = True
                message = await self._pubsub.get_message(timeout=None)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a dropped connection; anything else would loop here too
                if self._ready.is_set():
                    _log.warning("limiter wake-up channel lost (%s); reconnecting", exc)
                self._ready.clear()
                self._wake_all()  # they look again (and meet the error, or a recovered Redis)
                await asyncio.sleep(pause)
                # A fresh subscription: on a cluster the node it was on may be gone for good
                # (failed over), and a cluster client picks a live node for a new one.
                old, self._pubsub = self._pubsub, self._client.pubsub()
                subscribed = False
                with contextlib.suppress(Exception):
                    await old.aclose()
                pause = min(pause * 2, _BACKOFF_S[1])
                continue
            pause = _BACKOFF_S[0]
            if message is None:
                continue
            kind = message.get("type")
            if kind == "message":
                data = message.get("data")
                member = data.decode() if isinstance(data, bytes) else str(data)
                wake = self._wakes.get(member)
                if wake is not None:
                    wake.set()
            elif kind == "subscribe":
                self._ready.set()
                self._wake_all()  # after a reconnect: whatever was published meanwhile is lost

    def _wake_all(self) -> None:
        for wake in list(self._wakes.values()):
            wake.set()

    async def close(self) -> None:
        """Stop the reader and drop the subscription."""
        task, self._task = self._task, None
        while task is not None and not task.done():
            task.cancel()  # again if need be: redis-py can swallow one (see RedisLimiter._eval)
            await asyncio.wait([task], timeout=0.5)
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            with contextlib.suppress(Exception):
                await pubsub.aclose()
