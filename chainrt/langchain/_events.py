"""What a streamed chain run yields, and what a run that did not complete raises."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from .._errors import StepError
from .._progress import Progress
from .._result import RunResult

if TYPE_CHECKING:
    from ..spec import StepSpec
    from ..store._records import AttemptRecord, RunRecord, StepRecord

__all__ = ["ChainEvent", "QueueProgress", "RunIncomplete"]


class ChainEvent(dict[str, Any]):
    """One progress event of a streamed run; ``event`` is run_started, step_started, attempt,
    token (``text``: an LLM step's generated text as it streams), step_finished or run_finished,
    ``run_id`` the chainrt run. After a failed attempt of a step (an ``attempt`` event whose
    ``status`` is not ``ok``), that step's earlier tokens are void: the next attempt starts over. A plain JSON-ready dict otherwise:
    ``isinstance(chunk, ChainEvent)`` tells events from the final output."""


class RunIncomplete(StepError):
    """A chain run behind a Runnable ended ``partial``, ``rejected`` or ``failed``.

    ``result`` is the full :class:`~chainrt.RunResult`; invoking again with
    ``configurable={"run_id": result.run_id}`` (and perhaps a new ``budget``) resumes the run.
    """

    def __init__(self, result: RunResult) -> None:
        self.result = result
        where = f" at step {result.stopped_at}" if result.stopped_at else ""
        why = f": {result.error}" if result.error else ""
        super().__init__(
            f"chain {result.chain!r} run {result.run_id} ended {result.status}{where}{why}; "
            f"resume it with config={{'configurable': {{'run_id': {result.run_id!r}}}}}",
            step_id=result.stopped_at,
            retryable=result.status in ("partial", "rejected"),
        )


class QueueProgress(Progress):
    """Turns the runner's progress callbacks into :class:`ChainEvent` items of a queue."""

    wants_tokens = True

    def __init__(self, events: asyncio.Queue[ChainEvent | None], run_id: str) -> None:
        self._events = events
        self._run_id = run_id

    def _put(self, event: str, **fields: Any) -> None:
        self._events.put_nowait(ChainEvent(event=event, run_id=self._run_id, **fields))

    def run_started(self, record: RunRecord, *, resumed: bool) -> None:
        self._put("run_started", chain=record.chain, resumed=resumed)

    def step_started(self, step: StepSpec, allotted_ms: float, model: str | None) -> None:
        self._put(
            "step_started",
            step=step.id,
            kind=step.kind,
            allotted_ms=round(allotted_ms, 3),
            model=model,
        )

    def attempt(self, step_id: str, record: AttemptRecord) -> None:
        self._put("attempt", step=step_id, **record.model_dump(mode="json"))

    def token(self, step_id: str, text: str) -> None:
        self._put("token", step=step_id, text=text)

    def step_finished(self, record: StepRecord) -> None:
        self._put(
            "step_finished",
            step=record.step_id,
            status=record.status,
            output=record.output,
            attempts=record.attempts,
            allotted_ms=record.allotted_ms,
            elapsed_ms=record.elapsed_ms,
            model=record.model,
            fallback=record.fallback,
            error=record.error,
        )

    def run_finished(self, result: RunResult) -> None:
        summary = result.model_dump(mode="json", exclude={"run_id"})
        self._put("run_finished", **summary)
