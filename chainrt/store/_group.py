"""Group commit: checkpoint writes of concurrent runs in one process, sent to the store together.

A process running many runs at once would send one round trip (or one SQLite transaction) per
step per run. Here a commit that finds the store idle goes out at once, alone: a lone run waits
for nothing. Commits that arrive while the store is busy with an earlier one wait in a queue,
and the whole queue goes out as one batch (one Redis pipeline, one SQLite transaction) as soon
as the store is free; the runs a batch's replies wake get one loop turn to commit again before
the store counts as free, so their next commits go out together too. A batch is many commits,
each still checked and applied on its own (fencing token, all-or-nothing): one commit that is
refused does not touch the others, and each waiter gets its own result. A run has at most one
commit in flight (the next step starts after its commit returns), so batching never reorders one
run's writes.

Two ways to be "busy": :class:`InFlightGroup` (Redis Cluster, per master; Redis through the
client) is busy while a round trip is on the wire; :class:`IterationGroup` (SQLite, whose writes
never leave the event loop) is busy for the rest of the loop iteration in which a commit was
written, so that runs ready in the same iteration share the next transaction. (On one Redis
node the commits do not queue behind a round trip at all: they go on a pipe, :meth:`chainrt.redis.LeanRedis.pipelined`.)
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

__all__ = ["InFlightGroup", "IterationGroup", "Outcomes"]

T = TypeVar("T")

Outcomes = list[BaseException | None]
"""One entry per commit of a batch, in order: None (written) or the error that commit raises."""


class _State(Generic[T]):
    """One event loop's side of a group: the commits waiting, each with the future its caller
    awaits, and whether the store is busy. (A store may be used from several loops, e.g. by the
    sync API's own loops: each has its own state, and no loop waits on another.)"""

    __slots__ = ("busy", "drainer", "waiting")

    def __init__(self) -> None:
        self.waiting: list[tuple[T, asyncio.Future[None]]] = []
        self.busy = False
        self.drainer: asyncio.Task[None] | None = None

    def take(self) -> list[tuple[T, asyncio.Future[None]]]:
        batch, self.waiting = self.waiting, []
        return batch


class _PerLoop(Generic[T]):
    def __init__(self) -> None:
        self._states: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _State[T]] = (
            weakref.WeakKeyDictionary()
        )

    def state(self, loop: asyncio.AbstractEventLoop) -> _State[T]:
        found = self._states.get(loop)
        if found is None:
            found = self._states[loop] = _State()
        return found


def _settle(batch: list[tuple[T, asyncio.Future[None]]], outcomes: Outcomes) -> None:
    for (_, future), error in zip(batch, outcomes, strict=True):
        if future.done():  # its caller was cancelled (a timeout): nobody reads the result
            continue
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)


def _all_failed(batch: list[tuple[T, asyncio.Future[None]]], exc: BaseException) -> Outcomes:
    return [exc for _ in batch]


class InFlightGroup(Generic[T]):
    """Group commit for a store reached over the network (``send`` awaits one round trip).

    ``send(items)`` writes a batch in one round trip and returns one outcome per item; if it
    raises, every commit of the batch fails with that error (nothing of the batch is known to
    be written, and each commit is safe to send again).
    """

    def __init__(self, send: Callable[[list[T]], Awaitable[Outcomes]]) -> None:
        self._send = send
        self._loops: _PerLoop[T] = _PerLoop()

    async def submit(self, item: T) -> None:
        """Write ``item``; return once it is written (or raise its error)."""
        loop = asyncio.get_running_loop()
        state = self._loops.state(loop)
        if state.busy:
            future: asyncio.Future[None] = loop.create_future()
            state.waiting.append((item, future))
            await future
            return
        state.busy = True
        try:
            (error,) = await self._send([item])
        finally:
            self._next(loop, state)
        if error is not None:
            raise error

    def _next(self, loop: asyncio.AbstractEventLoop, state: _State[T]) -> None:
        """The store is free: send what queued up meanwhile, or go idle."""
        if state.waiting and not loop.is_closed():
            state.drainer = loop.create_task(self._drain(state), name="chainrt-group-commit")
        else:
            state.busy = False

    async def _send_batch(self, batch: list[tuple[T, asyncio.Future[None]]]) -> None:
        """Send ``batch`` in one round trip and settle each of its commits."""
        try:
            outcomes = await self._send([item for item, _ in batch])
        except asyncio.CancelledError:
            for _, future in batch:
                future.cancel()
            raise
        except Exception as exc:  # the whole batch failed: each caller gets the error
            outcomes = _all_failed(batch, exc)
        _settle(batch, outcomes)

    async def _drain(self, state: _State[T]) -> None:
        try:
            while state.waiting:
                await self._send_batch(state.take())
                # The runs just woken run in the next loop turn, each up to its next commit:
                # yield to them (still busy) so that those commits queue and go as one batch.
                # Going idle here sent the first of them alone and the rest in a second round
                # trip (two round trips per round of N runs at once instead of one).
                await asyncio.sleep(0)
        finally:
            for _, future in state.take():
                future.cancel()  # only when this task itself was cancelled (the loop ending)
            state.busy = False
            state.drainer = None


class IterationGroup(Generic[T]):
    """Group commit for a store written on the event loop itself (``write`` blocks briefly).

    The first commit of a loop iteration is written at once; commits that arrive later in the
    same iteration are written together, in one ``write`` call, at the start of the next one.
    ``write(items)`` returns one outcome per item; if it raises, every commit of the batch fails.
    """

    def __init__(self, write: Callable[[list[T]], Outcomes]) -> None:
        self._write = write
        self._loops: _PerLoop[T] = _PerLoop()

    async def submit(self, item: T) -> None:
        """Write ``item``; return once it is written (or raise its error)."""
        loop = asyncio.get_running_loop()
        state = self._loops.state(loop)
        if state.busy:  # a commit was written earlier in this loop iteration
            future: asyncio.Future[None] = loop.create_future()
            if not state.waiting:
                loop.call_soon(self._flush, state)
            state.waiting.append((item, future))
            await future
            return
        state.busy = True
        loop.call_soon(_new_iteration, state)
        (error,) = self._write([item])
        if error is not None:
            raise error

    def _flush(self, state: _State[T]) -> None:
        batch = state.take()
        if not batch:
            return
        try:
            outcomes = self._write([item for item, _ in batch])
        except Exception as exc:  # the whole transaction failed: nothing of it was written
            outcomes = _all_failed(batch, exc)
        _settle(batch, outcomes)


def _new_iteration(state: _State[Any]) -> None:
    state.busy = False
