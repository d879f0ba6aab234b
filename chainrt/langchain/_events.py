"""What a streamed chain run yields, and what a run that did not complete raises."""

from __future__ import annotations

import asyncio
from typing import Any

from .._errors import StepError
from .._events import EventProgress
from .._result import RunResult

__all__ = ["ChainEvent", "QueueProgress", "RunIncomplete"]


class ChainEvent(dict[str, Any]):
    """One event of a streamed run, in the same shape as ``Runtime.stream`` and the SSE of
    ``chainrt serve``: a JSON-ready dict with ``type`` (run_started, step_started, attempt,
    token, step_finished or run_finished), ``run_id``, ``ts`` (unix seconds) and, for step
    events, ``step_id``; the other keys are the type's own (see :meth:`RunEvent.to_dict`).

    ``token`` carries ``text``, an LLM step's generated text as it streams. After a failed
    attempt of a step (an ``attempt`` event whose ``status`` is not ``ok``), that step's earlier
    tokens are void: the next attempt starts over. ``isinstance(chunk, ChainEvent)`` tells
    events from the final output of a stream."""


class RunIncomplete(StepError):
    """A chain run behind a Runnable ended ``partial``, ``rejected`` or ``failed``, or is
    ``waiting`` at a ``wait`` step for a signal.

    ``result`` is the full :class:`~chainrt.RunResult`; invoking again with
    ``configurable={"run_id": result.run_id}`` (and perhaps a new ``budget``) resumes the run
    (a waiting one continues once its signal was sent: ``Runtime.signal(..., resume=False)`` or
    ``chainrt signal --no-resume``).
    """

    def __init__(self, result: RunResult) -> None:
        self.result = result
        where = f" at step {result.stopped_at}" if result.stopped_at else ""
        why = f": {result.error}" if result.error else ""
        ended = "is waiting" if result.status == "waiting" else f"ended {result.status}"
        first = "send the signal, then " if result.status == "waiting" else ""
        super().__init__(
            f"chain {result.chain!r} run {result.run_id} {ended}{where}{why}; {first}"
            f"resume it with config={{'configurable': {{'run_id': {result.run_id!r}}}}}",
            step_id=result.stopped_at,
            retryable=result.status in ("partial", "rejected"),
        )


class QueueProgress(EventProgress):
    """Puts one run's events on a queue as :class:`ChainEvent` items, built exactly as the
    runtime builds them for ``Runtime.stream`` and SSE (one shape everywhere)."""

    def __init__(self, events: asyncio.Queue[ChainEvent | None], run_id: str) -> None:
        super().__init__(lambda event: events.put_nowait(ChainEvent(event.to_dict())), run_id)
