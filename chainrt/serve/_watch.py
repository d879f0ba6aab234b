"""A run's events for ``GET /v1/runs/{id}/events`` (DESIGN §13): its recorded history, then the
live events of whichever runner executes it (in process on SQLite; Redis pub/sub in a fleet),
ending after ``run_finished``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from .._events import RunEvent, history
from .._runtime import Runtime

__all__ = ["run_events"]

_QUIET_S = 2.0
"""After this long without a live event, the store is asked whether the run ended."""


async def run_events(runtime: Runtime, run_id: str, *, redis: bool) -> AsyncIterator[RunEvent]:
    """The run's recorded history, then its live events, ending after ``run_finished``."""
    live: asyncio.Queue[RunEvent] = asyncio.Queue()
    source = await _live_source(runtime, run_id, live, redis=redis)
    try:
        store = runtime.store
        record = await store.get_run(run_id)
        past = history(record, await store.get_steps(run_id))
        # Live events heard while the history was read may repeat it: a step whose record the
        # history holds has been told in full (its ts, taken from the record, can differ from
        # the live event's, so the step's identity decides, not the clock).
        told = {e.step_id for e in past if e.type == "step_finished"}
        for event in past:
            yield event
        if past and past[-1].final:
            return
        while True:
            try:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for can return an event
                # that arrived in the same turn as a cancel and drop the cancel.
                async with asyncio.timeout(_QUIET_S):
                    event = await live.get()
            except TimeoutError:
                # No event for a while: the run may have ended where nobody published
                # (its owner died and a cancel ended it): the store says.
                record = await store.get_run(run_id)
                if record.finished:
                    steps = await store.get_steps(run_id)
                    yield history(record, steps)[-1]
                    return
                continue
            if event.type == "run_started":
                if not event.data.get("resumed") and past:
                    continue  # the history began with it
                told.clear()  # a resumed execution may run a step again
            elif event.step_id in told:
                continue  # already in the history
            yield event
            if event.final:
                return
    finally:
        await source()


async def _live_source(
    runtime: Runtime, run_id: str, live: asyncio.Queue[RunEvent], *, redis: bool
) -> Callable[[], Awaitable[None]]:
    """Start hearing ``run_id``'s live events (before the history is read); returns the
    function that stops it."""
    if not redis:
        runtime.listen(run_id, live.put_nowait)

        async def stop_local() -> None:
            runtime.unlisten(run_id, live.put_nowait)

        return stop_local
    from .._bus import events_channel, parse_event, subscribe

    stream = subscribe(runtime.store.raw_url, events_channel(run_id))  # a generator
    subscribed = asyncio.Event()

    async def pump() -> None:
        first = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0)
        subscribed.set()
        data = await first
        while True:
            event = parse_event(data)
            if event is not None:
                live.put_nowait(event)
            data = await stream.__anext__()

    task = asyncio.ensure_future(pump())
    await subscribed.wait()
    await asyncio.sleep(0.05)  # let SUBSCRIBE reach Redis before the history is read

    async def stop_remote() -> None:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        with contextlib.suppress(BaseException):
            await stream.aclose()

    return stop_remote
