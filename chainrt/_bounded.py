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

__all__ = ["CANCEL_GRACE_S", "Finished", "TaskHost", "start_eagerly", "within"]

T = TypeVar("T")

CANCEL_GRACE_S = 0.005
"""How long cancelled work may take to wind down before it is abandoned."""


async def within(
    work: Awaitable[T],
    timeout_s: float,
    *,
    grace_s: float = CANCEL_GRACE_S,
    host: TaskHost | None = None,
) -> T:
    """``await work``, or raise ``TimeoutError`` at most ``timeout_s + grace_s`` from now.

    At the timeout the work is cancelled; if it has not stopped ``grace_s`` later it is left to
    finish on its own. Cancelling the caller cancels the work too. A coroutine runs in
    ``host``'s task when the host is free (:class:`TaskHost`), else in a task of its own.
    """
    hosted = None
    if isinstance(work, types.CoroutineType):
        if host is not None:
            hosted = host.free(asyncio.get_running_loop())
        if hosted is not None:
            waiter, value = hosted.start(work)
            if waiter is None:
                return cast(T, value)
            task: asyncio.Future[Any] = waiter
        else:
            task, finished = start_eagerly(work)
            if finished is not None:
                return cast(T, finished.value)
    else:
        task = asyncio.ensure_future(work)
    cancel = hosted.cancel if hosted is not None else task.cancel
    try:
        done, _ = await asyncio.wait((task,), timeout=max(timeout_s, 0.0))
    except asyncio.CancelledError:
        cancel()
        if hosted is not None:
            hosted.abandon()
        raise
    if done:
        return cast(T, task.result())
    cancel()
    try:
        await asyncio.wait((task,), timeout=grace_s)
    except asyncio.CancelledError:
        task.add_done_callback(_collect)
        if hosted is not None:
            hosted.abandon()
        raise
    if not task.done():
        task.add_done_callback(_collect)
        if hosted is not None:
            hosted.abandon()
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


class TaskHost:
    """One task that hosts, one after another, the pieces of work :func:`within` starts.

    A task per call of :func:`within` cost about 5 us of a no-op tool step's 50 us at 64 runs at
    once (issue 18): made, registered, scheduled, run once to find the work already finished,
    and freed, for work that almost always finishes in its first stretch. A host keeps one task
    for a run's tool calls: work runs its first stretch as the host's task (as it would as a task
    of its own), and work that waits is continued by that task; when it ends, the host waits for
    the next piece. Its work sees the same ``asyncio.current_task()`` as the run's other tool
    calls, each in a copy of the caller's context, and each cancellation of the host's task (a
    limit, an ``asyncio.timeout`` inside the work) is consumed with the work it was aimed at.

    While work runs in it the host is busy, and :func:`within` makes a task of its own as before
    (one caller's calls follow one another; work that calls :func:`within` itself gets its own
    task). Work abandoned at its limit keeps its task to itself: the host makes a new one for the
    next piece. :meth:`close` ends the task once its work is done.
    """

    def __init__(self) -> None:
        self._hosted: _Hosted | None = None

    def free(self, loop: asyncio.AbstractEventLoop) -> _Hosted | None:
        """The task ready for new work on ``loop`` (made if needed), or None while busy."""
        hosted = self._hosted
        if hosted is None or hosted.ended or hosted.loop is not loop:
            hosted = self._hosted = _Hosted(self, loop)
        return None if hosted.work is not None else hosted

    def close(self) -> None:
        """End the host's task once its work (if any) is done; new work gets a new task."""
        hosted, self._hosted = self._hosted, None
        if hosted is not None:
            hosted.shut()


class _Hosted(Coroutine[Any, Any, None]):
    """The coroutine of a :class:`TaskHost`'s task: it waits for work, hands the task what the
    work waits on, forwards everything to the work until it ends, and settles ``done``."""

    def __init__(self, owner: TaskHost, loop: asyncio.AbstractEventLoop) -> None:
        self.owner = owner
        self.loop = loop
        self.work: Coroutine[Any, Any, Any] | None = None
        self.context: contextvars.Context | None = None
        self.first: Any = _NOTHING
        self.done: asyncio.Future[Any] | None = None
        self.idle: asyncio.Future[None] | None = None
        self.closing = False
        self.ended = False
        self.task: asyncio.Task[None] | None = loop.create_task(self, name="chainrt-tool-host")

    def start(self, coro: Coroutine[Any, Any, T]) -> tuple[asyncio.Future[Any] | None, Any]:
        """Run the first stretch of ``coro`` as this task: ``(None, value)`` when it finished,
        ``(done, None)`` when it waits (``done`` settles as the work ends); its error is raised."""
        loop, task = self.loop, self.task
        assert task is not None  # (a host's task is dropped only once it has ended)
        outer = asyncio.current_task(loop)
        context = contextvars.copy_context()
        if outer is not None:
            asyncio.tasks._leave_task(loop, outer)
        asyncio.tasks._enter_task(loop, task)
        try:
            first = context.run(coro.send, None)
        except StopIteration as stop:
            return None, stop.value
        finally:
            asyncio.tasks._leave_task(loop, task)
            if outer is not None:
                asyncio.tasks._enter_task(loop, outer)
        self.work, self.context, self.first = coro, context, first
        done = self.done = loop.create_future()
        if self.idle is not None and not self.idle.done():
            self.idle.set_result(None)  # the task's next step hands it what the work waits on
        return done, None

    def cancel(self) -> None:
        """Cancel the work running in this task (its cancellation ends with it)."""
        if self.task is not None:
            self.task.cancel()

    def abandon(self) -> None:
        """Leave the work to finish on its own in this task (which then ends); the host's next
        work goes to a new task."""
        self.closing = True
        if self.owner._hosted is self:
            self.owner._hosted = None

    def shut(self) -> None:
        """End the task once its work (if any) is done."""
        self.closing = True
        if self.work is None and self.idle is not None and not self.idle.done():
            self.idle.set_result(None)

    # ------------------------------------------------------------------ driven by the task

    def send(self, value: Any) -> Any:
        work = self.work
        if work is None:
            return self._wait()
        if self.first is not _NOTHING:
            first, self.first = self.first, _NOTHING
            return first
        assert self.context is not None
        try:
            return self.context.run(work.send, value)
        except StopIteration as stop:
            self._end(stop.value, None)
        except BaseException as exc:  # the work's own outcome, handed to whoever waits on it
            self._end(None, exc)
        return self._wait()

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        exc = typ if val is None else val
        work = self.work
        if work is None:  # cancelled while waiting for work (the loop is ending): stop here
            self._drop()
            raise exc
        self.first = _NOTHING  # thrown in before the hand-over: it lands where the work waits
        assert self.context is not None
        try:
            return self.context.run(work.throw, exc)
        except StopIteration as stop:
            self._end(stop.value, None)
        except BaseException as error:
            self._end(None, error)
        return self._wait()

    def close(self) -> None:
        if self.work is not None:
            self.work.close()

    def _end(self, value: Any, exc: BaseException | None) -> None:
        done = self.done
        self.work = self.context = self.done = None
        task = self.task
        while task is not None and task.cancelling():
            task.uncancel()  # the cancellations were the work's; the next work starts clean
        assert done is not None
        if done.done():
            return
        if exc is None:
            done.set_result(value)
        elif isinstance(exc, asyncio.CancelledError):
            done.cancel()
        else:
            done.set_exception(exc)

    def _wait(self) -> Any:
        if self.closing:
            self._drop()
            raise StopIteration
        idle = self.idle = self.loop.create_future()
        idle._asyncio_future_blocking = True  # what ``await idle`` would set before yielding it
        return idle

    def _drop(self) -> None:
        """The task ends: let go of it (it holds this coroutine; no cycle is left to collect)."""
        self.ended = True
        self.task = None

    def __await__(self) -> Generator[Any, None, Any]:
        raise TypeError("_Hosted is driven by its task, never awaited")
