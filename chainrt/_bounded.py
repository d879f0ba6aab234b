"""Awaiting work with a hard time limit: the caller gets control back at the limit, come what may.

``asyncio.wait_for`` cancels the work at its timeout and then waits for the work to *finish being
cancelled*: a tool that cleans up for a second after its cancellation, or a client whose
cancellation blocks on a socket, holds the step that long past its deadline. :func:`within`
cancels the work at the limit, gives it ``grace_s`` to wind down, and otherwise abandons it
(the abandoned task still runs to its end; its outcome is collected so that nothing is
reported as never retrieved). Steps therefore end within their allotment plus a bounded grace
(issue 14: overshoot), whatever the code they run does once cancelled.

A coroutine is started *eagerly* (as Python 3.12's eager tasks do): its first stretch runs at
once, in the caller's turn of the loop, under the task that will own the rest of it. Work that
finishes without waiting (a tool that returns at once) then costs neither a turn of the loop
nor an ``asyncio.wait``; work that does wait continues in that task, bounded as above
(issue 18: ~38 µs per tool call before).
"""

from __future__ import annotations

import asyncio
import contextvars
import types
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any, TypeVar, cast

__all__ = ["CANCEL_GRACE_S", "Finished", "start_eagerly", "within"]

T = TypeVar("T")

CANCEL_GRACE_S = 0.005
"""How long cancelled work may take to wind down before it is abandoned."""


async def within(work: Awaitable[T], timeout_s: float, *, grace_s: float = CANCEL_GRACE_S) -> T:
    """``await work``, or raise ``TimeoutError`` at most ``timeout_s + grace_s`` from now.

    At the timeout the work is cancelled; if it has not stopped ``grace_s`` later it is left to
    finish on its own. Cancelling the caller cancels the work too.
    """
    if isinstance(work, types.CoroutineType):
        task, finished = start_eagerly(work)
        if finished is not None:
            return cast(T, finished.value)
    else:
        task = asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait((task,), timeout=max(timeout_s, 0.0))
    except asyncio.CancelledError:
        task.cancel()
        raise
    if done:
        return cast(T, task.result())
    task.cancel()
    try:
        await asyncio.wait((task,), timeout=grace_s)
    except asyncio.CancelledError:
        task.add_done_callback(_collect)
        raise
    if not task.done():
        task.add_done_callback(_collect)
    elif not task.cancelled() and task.exception() is None:
        # It finished in the grace (it ignored the cancellation): the answer is late, but here.
        return cast(T, task.result())
    raise TimeoutError(f"not done within {timeout_s * 1000:.0f}ms")


def _collect(task: asyncio.Future[Any]) -> None:
    """Retrieve an abandoned task's outcome (an exception nobody awaits is not an error)."""
    if not task.cancelled():
        task.exception()


_NOTHING: Any = object()


class Finished:
    """The value of work that finished in its first stretch (see :func:`start_eagerly`)."""

    def __init__(self, value: Any) -> None:
        self.value = value


class _Rest(Coroutine[Any, Any, Any]):
    """What a task runs of a coroutine whose first stretch already ran (see :func:`within`).

    Its first ``send`` hands the task what that stretch yielded (the future it waits on); after
    that it forwards everything. Work that finished in its first stretch leaves nothing to run.
    """

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self._coro = coro
        self.first: Any = _NOTHING
        self.finished = False

    def send(self, value: Any) -> Any:
        if self.finished:
            raise StopIteration
        if self.first is not _NOTHING:
            first, self.first = self.first, _NOTHING
            return first
        return self._coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        exc = typ if val is None else val
        if self.finished:
            raise exc
        self.first = _NOTHING  # thrown in before the first send: it lands where the work waits
        return self._coro.throw(exc)

    def close(self) -> None:
        if not self.finished:
            self._coro.close()

    def __await__(self) -> Generator[Any, None, Any]:
        raise TypeError("_Rest is driven by its task, never awaited")


def start_eagerly(
    coro: Coroutine[Any, Any, T],
    on_task: Callable[[asyncio.Task[Any]], None] | None = None,
) -> tuple[asyncio.Task[Any], Finished | None]:
    """Create the task that owns ``coro`` and run its first stretch now, as that task.

    Returns the task and, when ``coro`` finished in that stretch, its value (the task then
    ends with None: await it only when no value came back). An exception of the first stretch
    is raised here. ``on_task`` hears of the task before the stretch runs (to register it).
    """
    loop = asyncio.get_running_loop()
    outer = asyncio.current_task(loop)
    context = contextvars.copy_context()
    rest = _Rest(coro)
    task = loop.create_task(rest, context=context)
    if on_task is not None:
        on_task(task)
    if outer is not None:
        asyncio.tasks._leave_task(loop, outer)
    asyncio.tasks._enter_task(loop, task)
    try:
        rest.first = context.run(coro.send, None)
    except StopIteration as stop:
        rest.finished = True
        return task, Finished(stop.value)
    except BaseException:
        rest.finished = True  # raised in the caller, as awaiting the task would have
        raise
    finally:
        asyncio.tasks._leave_task(loop, task)
        if outer is not None:
            asyncio.tasks._enter_task(loop, outer)
    return task, None
