"""One timer for many deadlines: the bound of every hot-path Redis call and of every commit.

``asyncio.timeout`` schedules and cancels a timer per use (about 8 us on a 2-CPU machine: as
much as a tenth of a durable step). Here one timer, set for the earliest deadline of the calls
still running, bounds them all: a call costs a dict entry, and the timer is moved only when a
call comes with a deadline earlier than the one it is set for (calls that all get the same bound,
like the store's socket timeout, start in deadline order and never move it; a run's commits share
its budget's end). When it fires it cancels the calls past their deadline and is set again for
the earliest of the rest, if any. A call still running at its deadline is cancelled and raises
``TimeoutError``, as under ``asyncio.timeout`` (a cancellation from elsewhere stays a
cancellation).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

__all__ = ["Watchdog"]

T = TypeVar("T")


class Watchdog:
    """Bounds awaited work (``bound_s`` each unless a call says otherwise), with one timer.

    Used from one event loop at a time (a new loop re-arms it; the old loop's calls are gone).
    """

    def __init__(self, bound_s: float) -> None:
        self.bound_s = bound_s
        # task -> (deadline (loop time), the task's cancellation count when it entered)
        self._running: dict[asyncio.Task[Any], tuple[float, int]] = {}
        self._expired: set[asyncio.Task[Any]] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def run(self, work: Awaitable[T], bound_s: float | None = None) -> T:
        """``await work`` in the current task; ``TimeoutError`` once ``bound_s`` (default: the
        watchdog's) has passed.

        One call at a time per task (the task is the key; a nested call of the same task on the
        same watchdog gets an ``asyncio.timeout`` of its own).
        """
        bound = self.bound_s if bound_s is None else bound_s
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        if task is None or not self.enter(loop, task, bound):
            async with asyncio.timeout(bound):
                return await work
        try:
            return await work
        except asyncio.CancelledError:
            if self.timed_out(task):
                raise TimeoutError(f"not done within {bound:g}s") from None
            raise
        finally:
            self.leave(task)

    def enter(
        self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any], bound_s: float
    ) -> bool:
        """Bound what ``task`` (running on ``loop``) awaits from now on by ``bound_s``; False
        when this watchdog bounds it already (nothing changed). What :meth:`run` does around
        its work, for a caller that awaits inline (no coroutine of its own): ``enter``, await,
        on ``CancelledError`` ask :meth:`timed_out`, and ``leave`` in every case."""
        if task in self._running:
            return False
        deadline = loop.time() + bound_s
        self._running[task] = (deadline, task.cancelling())
        timer = self._timer
        if timer is None or self._loop is not loop:  # (a new loop: the old one is gone)
            self._timer, self._loop = loop.call_at(deadline, self._check, loop), loop
        elif deadline < timer.when():
            timer.cancel()
            self._timer = loop.call_at(deadline, self._check, loop)
        return True

    def timed_out(self, task: asyncio.Task[Any]) -> bool:
        """Whether the ``CancelledError`` ``task`` got since :meth:`enter` is this watchdog's
        (its bound passed: raise ``TimeoutError``) and not a cancellation from elsewhere."""
        if task not in self._expired:
            return False
        return task.uncancel() <= self._running[task][1]

    def leave(self, task: asyncio.Task[Any]) -> None:
        """Stop bounding ``task`` (after :meth:`enter`, whatever the work ended with)."""
        del self._running[task]
        self._expired.discard(task)

    def _check(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        now = loop.time()
        following: float | None = None
        for task, (deadline, _) in self._running.items():
            if deadline <= now:
                if task not in self._expired:
                    self._expired.add(task)
                    task.cancel()
            elif following is None or deadline < following:
                following = deadline
        if following is not None:
            self._timer = loop.call_at(following, self._check, loop)

    def stop(self) -> None:
        """Cancel the timer (the work still running is left unbounded; a later call sets it
        again)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
