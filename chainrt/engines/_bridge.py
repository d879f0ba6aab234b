"""Stream one engine job from its model thread to the caller's event loop.

The in-process engines (llama.cpp, torch) run every request on one thread that owns the model.
That thread reports through the job's ``sink``; :func:`stream_job` points the sink at the
caller's loop with ``loop.call_soon_threadsafe`` (so any event loop can use the engine, including
the fresh one the runner's sync API starts per call) and turns what arrives into an async stream.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from ._base import GenerationRequest, StreamDelta

__all__ = ["BridgedJob", "EngineJob", "Sink", "stream_job"]


class Sink(Protocol):
    """Where the model thread reports a job: text pieces, the final delta, or the job's error."""

    # A callback protocol rather than a Callable alias: mypy takes a Callable-typed dataclass
    # field for a read-only attribute, so the engines' jobs would not match BridgedJob.
    def __call__(self, item: StreamDelta | BaseException, /) -> None:
        """Deliver one item; called on the model thread."""


class BridgedJob(Protocol):
    """What :func:`stream_job` needs of an engine's job."""

    sink: Sink
    """Called by the model thread; :func:`stream_job` replaces it before queueing the job."""
    cancelled: threading.Event
    """Set when nobody awaits the job any more; the model thread checks it between tokens."""


JobT = TypeVar("JobT", bound=BridgedJob)


def _ignore(_: StreamDelta | BaseException) -> None:
    """Sink of jobs whose outcome nobody awaits (the stop job)."""


@dataclass(order=True)
class EngineJob:
    """One unit of work for a model thread; a priority queue orders jobs by (priority, arrival)."""

    priority: int
    seq: int
    kind: str = field(compare=False)
    """What to do: ``generate``, or an engine's own housekeeping (``stop``, ``reset``, ...)."""
    request: GenerationRequest | None = field(compare=False, default=None)
    sink: Sink = field(compare=False, default=_ignore)
    cancelled: threading.Event = field(compare=False, default_factory=threading.Event)


async def stream_job(job: JobT, jobs: queue.Queue[JobT]) -> AsyncGenerator[StreamDelta, None]:
    """Queue ``job`` for the model thread and yield its deltas until the one with a ``result``.

    An exception the thread reports is raised here. Closing or cancelling the consumer sets
    ``job.cancelled``, so the thread skips the job or stops it at its next token.
    """
    loop = asyncio.get_running_loop()
    items: asyncio.Queue[StreamDelta | BaseException] = asyncio.Queue()

    def sink(item: StreamDelta | BaseException) -> None:
        try:
            loop.call_soon_threadsafe(items.put_nowait, item)
        except RuntimeError:  # the caller's loop is closed: nobody is listening
            job.cancelled.set()

    job.sink = sink
    jobs.put(job)
    try:
        while True:
            item = await items.get()
            if isinstance(item, BaseException):
                raise item
            yield item
            if item.result is not None:
                return
    finally:
        job.cancelled.set()  # no-op when finished; otherwise the thread drops the job at once
