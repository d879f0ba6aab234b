"""One step from its allotment to its record: step-scoped keys, then the step kind's executor.

Every kind (``llm``, ``tool``, ``runnable``) has an executor in its own module with one method,
``run(step, scope, run_id=, deadline=, source_dir=) -> StepOutcome``. This module holds what they
share: the outcome type, the step record built from it, the concurrency keys taken inside the
allotment, and :func:`settle`, the pure rule that says what a step's record means for the run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from .._errors import ChainRTError, ConcurrencyError, ConcurrencyRejected, TemplateError
from .._records import FINAL_STEP_STATUSES, AttemptRecord, StepRecord
from ..concurrency import Holding, KeyRequest, Limiter
from ..spec import StepSpec, render_value
from ..spec._models import ConcurrencyKeySpec, rate_per_second
from ..store._built import step_record as built_step_record

__all__ = [
    "KindExecutor",
    "StepOutcome",
    "StepStart",
    "acquire_keys",
    "run_step",
    "settle",
    "skipped_record",
    "step_record",
]


@dataclass(slots=True)
class StepOutcome:
    """How a step's attempts ended."""

    status: str
    """completed | partial | timed_out | failed | rejected | skipped | waiting"""
    output: Any = None
    attempts: int = 0
    model: str | None = None
    fallback: str | None = None
    error: str | None = None
    attempt_log: list[AttemptRecord] = field(default_factory=list)
    confidence_score: float | None = None
    verification_status: Literal["match", "mismatch", "unverified"] | None = None
    degraded: dict[str, Any] | None = None
    contradictions: list[str] | None = None


@dataclass(frozen=True, slots=True)
class StepStart:
    """A step the budget let start: what interceptors of ``execute_step`` see."""

    run_id: str
    step: StepSpec
    allotted_ms: float


class KindExecutor(Protocol):
    """Runs one kind of step inside its deadline (unix seconds); never raises for the step's own
    failures (a ChainRTError it raises is recorded as the step's failure)."""

    async def run(
        self,
        step: StepSpec,
        scope: dict[str, Any],
        *,
        run_id: str,
        deadline: float,
        source_dir: Path | None,
    ) -> StepOutcome:
        """Run ``step`` with templates rendered against ``scope``."""
        ...


def key_requests(keys: list[ConcurrencyKeySpec], scope: dict[str, Any]) -> list[KeyRequest]:
    """The concurrency keys of a chain or step, rendered against ``scope``."""
    return [
        KeyRequest(
            key=str(render_value(key.key, scope)),
            limit=key.limit,
            rate_per_s=rate_per_second(key.rate) if key.rate else None,
            burst=key.burst or 1,
        )
        for key in keys
    ]


async def acquire_keys(
    limiter: Limiter,
    keys: list[ConcurrencyKeySpec],
    scope: dict[str, Any],
    *,
    within_ms: float,
    holder: str,
) -> Holding:
    """Take ``keys`` within ``within_ms`` (ConcurrencyRejected when they cannot be had in time)."""
    if not keys:
        return await limiter.acquire([], timeout_s=0.0, holder=holder)
    return await limiter.acquire(
        key_requests(keys, scope), timeout_s=max(within_ms, 0.0) / 1000, holder=holder
    )


async def run_step(
    run_id: str,
    step: StepSpec,
    allot_ms: float,
    scope: dict[str, Any],
    limiter: Limiter,
    executor: KindExecutor,
    source_dir: Path | None,
) -> StepRecord:
    """Run ``step`` of run ``run_id``, allotted ``allot_ms``: its keys, then its executor, all
    inside the allotment; return its record."""
    started_at = time.time()
    t0 = time.perf_counter()
    deadline = started_at + allot_ms / 1000
    waits: dict[str, float] | None = None
    holding: Holding | None = None
    outcome: StepOutcome | None = None
    if not step.concurrency:  # no keys to take or give back: no limiter call at all
        # A tool step without ``args`` renders nothing: no scope of its own (issue 18).
        bare = step.tool is not None and not step.args
        step_scope = scope if bare else _step_scope(step, scope)
    else:
        step_scope = _step_scope(step, scope)
        try:
            holding = await acquire_keys(
                limiter,
                step.concurrency,
                step_scope,
                within_ms=allot_ms,
                holder=f"{run_id}:{step.id}",
            )
        except ConcurrencyRejected as exc:
            outcome = StepOutcome("rejected", error=exc.message)
        except (ConcurrencyError, TemplateError) as exc:  # a key that cannot be a key
            outcome = StepOutcome("failed", error=f"concurrency: {exc.message}")
        else:
            waits = holding.waits_ms
    if outcome is None:  # the keys (if any) are held: the step kind's executor runs it
        try:
            outcome = await executor.run(
                step, step_scope, run_id=run_id, deadline=deadline, source_dir=source_dir
            )
        except ChainRTError as exc:  # raised by the executor: the step's failure
            outcome = StepOutcome("failed", error=exc.message)
        finally:
            if holding is not None:
                await holding.release_unconfirmed()
    elapsed_ms = (time.perf_counter() - t0) * 1000
    return step_record(step, outcome, allot_ms, started_at, elapsed_ms, waits)


def _step_scope(step: StepSpec, scope: dict[str, Any]) -> dict[str, Any]:
    """What the step's templates see: the run's scope and ``step`` (id, model, weight)."""
    model = step.llm.model if step.llm is not None else None
    if step.agent is not None:
        model = step.agent.model
    return {**scope, "step": {"id": step.id, "model": model, "weight": step.weight}}


def step_record(
    step: StepSpec,
    outcome: StepOutcome,
    allot_ms: float,
    started_at: float,
    elapsed_ms: float,
    waits: dict[str, float] | None = None,
) -> StepRecord:
    """The record a step's outcome is written as (built without validation: every value here
    is the runtime's own, of the right type)."""
    # By position, in StepRecord's field order (see built_step_record).
    return built_step_record(
        step.id,
        outcome.status,
        outcome.output,
        outcome.attempts,
        outcome.model,
        outcome.fallback,
        round(allot_ms, 3),
        round(elapsed_ms, 3),
        started_at,
        started_at + elapsed_ms / 1000,
        outcome.error,
        outcome.attempt_log,
        {} if not waits else dict(waits),
        outcome.confidence_score,
        outcome.verification_status,
        outcome.degraded,
        outcome.contradictions,
    )


def skipped_record(step: StepSpec, reason: str) -> StepRecord:
    """The record of a step the budget skipped before it started."""
    return step_record(step, StepOutcome("skipped", error=reason), 0.0, time.time(), 0.0)


_RUN_STATUS = {
    "timed_out": "partial",
    "partial": "partial",
    "rejected": "rejected",
    "waiting": "waiting",  # a wait step without its signal parks the run (chainrt/_run/_wait.py)
}
"""How a required step that did not complete ends the run (anything else: ``failed``)."""

_CUT = "cut off at its deadline (on_timeout: partial); its output is the text generated so far"


def settle(step: StepSpec, record: StepRecord) -> tuple[StepRecord, str | None]:
    """What a step's record means for the run (pure): the record to write, and the run's final
    status when the run stops here (None: go on with the next step).

    A completed step goes on. An optional step that timed out, failed, was rejected or was cut
    off (``partial``) is written as skipped, and the run goes on. Any other step stops the run:
    ``partial`` after a timeout or a cut-off LLM answer (docs/chain-format.md, Budget: the budget ran out there; the
    step's record keeps the text so far), ``rejected`` when its keys were not to be had, else
    ``failed``.
    """
    if record.status in FINAL_STEP_STATUSES:
        return record, None
    if record.status == "partial" and record.error is None:
        record = record.model_copy(update={"error": _CUT})
    if step.optional and record.status in ("timed_out", "failed", "rejected", "partial"):
        skipped = record.model_copy(
            update={"status": "skipped", "error": f"{record.status}: {record.error}"}
        )
        return skipped, None
    return record, _RUN_STATUS.get(record.status, "failed")
