"""One timer for many deadlines of the same length: the bound of every hot-path Redis call.

``asyncio.timeout`` schedules and cancels a timer per use (about 8 us on a 2-CPU machine: as
much as a tenth of a durable step). Calls that all get the same bound (the store's socket
timeout) start in deadline order, so one timer, set for the oldest call still running and moved
on when it fires, bounds them all: a call costs a dict entry, and the timer fires about once per
bound while calls keep coming. A call still running at its deadline is cancelled and raises
``TimeoutError``, as under ``asyncio.timeout`` (a cancellation from elsewhere stays a
cancellation).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["Watchdog"]

T = TypeVar("T")


class Watchdog:
    """Bounds awaited work to ``bound_s`` each, with one timer per event loop use."""

    def __init__(self, bound_s: float) -> None:
        self.bound_s = bound_s
        self._running: dict[asyncio.Task[object], float] = {}  # task -> deadline (loop time)
        self._expired: set[asyncio.Task[object]] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def run(self, work: Awaitable[T]) -> T:
        """``await work`` in the current task; ``TimeoutError`` once ``bound_s`` has passed.

        One call at a time per task (the task is the key).
        """
        task = asyncio.current_task()
        if task is None or task in self._running:
            async with asyncio.timeout(self.bound_s):
                return await work
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.bound_s
        self._running[task] = deadline
        if self._timer is None or self._loop is not loop:  # (a new loop: the old one is gone)
            self._timer, self._loop = loop.call_at(deadline, self._check, loop), loop
        cancelling = task.cancelling()
        try:
            return await work
        except asyncio.CancelledError:
            if task in self._expired and task.uncancel() <= cancelling:
                raise TimeoutError(f"not done within {self.bound_s:g}s") from None
            raise
        finally:
            del self._running[task]
            self._expired.discard(task)

    def _check(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        now = loop.time()
        following: float | None = None
        for task, deadline in self._running.items():
            if deadline <= now:
                if task not in self._expired:
                    self._expired.add(task)
                    task.cancel()
            elif following is None or deadline < following:
                following = deadline
        if following is not None:
            self._timer = loop.call_at(following, self._check, loop)

    def stop(self) -> None:
        """Cancel the timer (the work still running is left unbounded)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
