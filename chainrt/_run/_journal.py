"""The run journal: one execution's clock, its in-memory run state, and every write of it.

The budget loop asks the journal how much time is left and tells it what happened; the journal
turns that into atomic checkpoint commits (step record + run progress in one round trip) under the
execution's fencing token, and keeps its in-memory copy of the run record in step with what was
written. Nothing here decides anything about the budget.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any

from .._errors import ChainRTError, RecordTooLarge, StoreUnavailable
from .._records import FINAL_STEP_STATUSES, RunProgress, RunRecord, StepRecord
from .._result import RunResult
from .._watchdog import Watchdog
from ..spec import StepSpec
from ..store._built import run_progress
from ..store._protocol import CheckpointStore

__all__ = ["COMMIT_GRACE_S", "Clock", "RunJournal"]

COMMIT_GRACE_S = 0.5
"""Time a checkpoint write may take even when the budget has run out (the result must land)."""


class _Unrecordable(ChainRTError):
    """The store cannot take what this commit carries (a value nested too deep for JSON, a lone
    surrogate, a record over the size limit): nothing was written, and writing it again fails
    the same way. The runner writes a storable record instead (:mod:`._recording`); private: it never
    leaves the runner."""


class Clock:
    """Budget bookkeeping of one execution: ms used so far (earlier executions included), ms left."""

    __slots__ = ("_t0", "total_ms", "used_before_ms")

    def __init__(self, total_ms: float, used_before_ms: float = 0.0) -> None:
        self.total_ms = total_ms
        self.used_before_ms = used_before_ms
        self._t0 = time.perf_counter()

    def used_ms(self) -> float:
        """Budget used: what earlier executions used plus the time since this one started."""
        return self.used_before_ms + (time.perf_counter() - self._t0) * 1000

    def remaining_ms(self) -> float:
        """Budget left (negative once overrun)."""
        return self.total_ms - self.used_ms()


class RunJournal:
    """The state of one execution of a run, and the only writer of its checkpoints.

    ``record`` mirrors the stored run record after each commit; ``done`` holds the step records
    written so far (those of earlier executions included); ``scope`` is what templates see
    (``input``, ``steps.<id>.output``, ``run_id``).
    """

    def __init__(
        self,
        store: CheckpointStore,
        record: RunRecord,
        done: dict[str, StepRecord],
        clock: Clock,
    ) -> None:
        self.store = store
        self._record = record
        self._update: dict[str, Any] = {}
        self._written: tuple[RunProgress, float] | None = None
        self.token = record.fencing_token
        self.clock = clock
        # Bounds each commit: one timer per execution, set for the budget's end, instead of an
        # asyncio.timeout (a timer scheduled and cancelled) per commit.
        self._guard = Watchdog(COMMIT_GRACE_S)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.done = dict(done)
        self.waits_ms: dict[str, float] = dict(record.waits_ms)
        self.scope: dict[str, Any] = {
            "input": record.input,
            "steps": {
                step_id: {"output": rec.output}
                for step_id, rec in done.items()
                if rec.status in FINAL_STEP_STATUSES
            },
            "run_id": record.run_id,
        }

    @property
    def record(self) -> RunRecord:
        """The run record as written by the last commit (copied once per read after commits,
        not once per commit: the loop reads it only at the end)."""
        written = self._written
        if written is not None:
            progress, at = written
            self._written = None
            update = self._update
            update["status"] = progress.status
            update["budget_used_ms"] = progress.budget_used_ms
            update["waits_ms"] = progress.waits_ms  # a copy of self.waits_ms, not changed since
            update["output"] = progress.output
            update["error"] = progress.error  # as written: redacted
            update["stopped_at"] = progress.stopped_at
            update["updated_at"] = at
        if self._update:
            self._record = self._record.model_copy(update=self._update)
            self._update = {}
        return self._record

    @property
    def run_id(self) -> str:
        """The run's id."""
        return self._record.run_id

    def pending(self, steps: list[StepSpec]) -> list[StepSpec]:
        """The steps still to run: those without a final record (a resume skips the rest)."""
        return [
            s
            for s in steps
            if s.id not in self.done or self.done[s.id].status not in FINAL_STEP_STATUSES
        ]

    def _unavailable(self) -> StoreUnavailable:
        return StoreUnavailable(
            f"checkpoint of run {self.run_id} did not complete within the budget; "
            f"the store ({self.store.url}) is too slow or down — resume the run when it is back"
        )

    def close(self) -> None:
        """Cancel the commits' timer (the execution is over; a later commit sets it again)."""
        self._guard.stop()

    def result(self) -> RunResult:
        """The run as the caller sees it now."""
        return RunResult.from_records(self.record, self.done)

    def record_step(self, step: StepRecord) -> Coroutine[Any, Any, None]:
        """Write a step's record with the run's progress; once written, a completed or skipped
        step's output is visible to templates (the commit itself, not a coroutine around it)."""
        return self.commit(step=step)

    async def finish(
        self,
        status: str,
        *,
        output: Any = None,
        error: str | None = None,
        stopped_at: str | None = None,
        step: StepRecord | None = None,
    ) -> None:
        """Write the run's final status (with the last step's record, if any) and let go of it."""
        await self.commit(
            step=step,
            status=status,
            release=True,
            output=output,
            error=error,
            stopped_at=stopped_at,
        )

    async def release(self) -> None:
        """Give the owner lease back with the run still ``running``: a resume may start at once."""
        await self.commit(status="running", release=True)

    async def commit(
        self,
        *,
        step: StepRecord | None = None,
        status: str = "running",
        release: bool = False,
        trace: dict[str, Any] | None = None,
        budget_total: float | None = None,
        output: Any = None,
        error: str | None = None,
        stopped_at: str | None = None,
    ) -> None:
        """One atomic checkpoint: ``step`` (if any) and the run's progress, fenced by the token.

        The write may take the budget that is left, and at least :data:`COMMIT_GRACE_S`;
        past that the store counts as unavailable (StoreUnavailable).
        """
        clock = self.clock
        used_ms = clock.used_ms()
        progress = run_progress(  # by position, in RunProgress's field order
            status,
            round(used_ms, 3),
            output,
            error,
            stopped_at,
            release,
            self.waits_ms,
            budget_total,
            trace,
        )
        timeout = max((clock.total_ms - used_ms) / 1000, COMMIT_GRACE_S)
        work = self.store.commit(self.run_id, self.token, progress, step)
        # Bounded with the execution's one timer, inline in this task (no coroutine around the
        # write): on the loop of the first commit, which takes the watchdog's general path.
        guard, loop = self._guard, self._loop
        task = None if loop is None else asyncio.current_task(loop)
        inline = loop is not None and task is not None and guard.enter(loop, task, timeout)
        try:
            if inline:
                await work
            else:
                if loop is None:
                    self._loop = asyncio.get_running_loop()
                # Not wait_for: on Python 3.11 a cancellation racing the write can leave the
                # write's own error (FencedOut) unretrieved in wait_for's inner task, printed
                # as a traceback at exit. Here the write runs in this task and its error is raised.
                await guard.run(work, timeout)
        except asyncio.CancelledError:
            if inline and task is not None and guard.timed_out(task):
                raise self._unavailable() from None
            raise
        except RecordTooLarge as exc:
            raise _Unrecordable(exc.message) from None
        except (ValueError, RecursionError) as exc:
            # The stores encode a record before they write anything: pydantic's
            # PydanticSerializationError and UnicodeEncodeError are ValueErrors.
            raise _Unrecordable(f"{type(exc).__name__}: {exc}") from None
        except TimeoutError:
            raise self._unavailable() from None
        finally:
            if inline and task is not None:
                guard.leave(task)
        if step is not None:
            self.done[step.step_id] = step
            if step.status in FINAL_STEP_STATUSES:
                self.scope["steps"][step.step_id] = {"output": step.output}
        # What the commit wrote, applied to the in-memory record when it is next read.
        self._written = (progress, time.time())
        if budget_total is not None:
            self._update["budget_total_ms"] = budget_total
        if trace is not None:
            self._update["trace"] = trace
        if release:
            self._update["owner"] = None
