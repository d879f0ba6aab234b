"""A wake-up flag for one waiting acquisition, settable from any thread.

Every limiter's waiters sleep on one (local, SQLite and Redis alike); what sets them differs: a
release in the same process, or, for the Redis limiter, a message on its pub/sub channel routed
to the waiter's flag by :mod:`._redis_wakeups`.
"""

from __future__ import annotations

import asyncio
import math
import threading

__all__ = ["Wake"]


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class Wake:
    """Like :class:`asyncio.Event` with a timed wait, but ``set()`` may come from another thread.

    The in-process limiter is shared by every event loop of the process (sync entry points run
    their own loops in threads), so a release on one loop must be able to wake a waiter on another.
    A set that arrives between a waiter's check and its wait is kept, never lost.
    """

    __slots__ = ("_flag", "_fut", "_lock", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._flag = False
        self._fut: asyncio.Future[None] | None = None

    def set(self) -> None:
        """Wake the waiter (now, or as soon as it next waits)."""
        with self._lock:
            self._flag = True
            fut = self._fut
        if fut is None or fut.done():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            fut.set_result(None)
        else:
            self._loop.call_soon_threadsafe(_resolve, fut)

    def clear(self) -> None:
        """Forget earlier wake-ups (called right before the waiter looks at the state again)."""
        with self._lock:
            self._flag = False

    async def wait(self, timeout_s: float) -> None:
        """Return when set, or after ``timeout_s`` seconds (``inf``: no timer)."""
        with self._lock:
            if self._flag:
                return
            fut = self._loop.create_future()
            self._fut = fut
        timer = None if math.isinf(timeout_s) else self._loop.call_later(timeout_s, _resolve, fut)
        try:
            await fut
        finally:
            if timer is not None:
                timer.cancel()
            with self._lock:
                self._fut = None
