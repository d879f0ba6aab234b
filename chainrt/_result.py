"""The result of a run, shaped like the CLI's ``--json`` object (DESIGN §9)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .store._records import RunRecord, StepRecord

__all__ = ["BudgetSummary", "RunResult", "StepSummary"]


class StepSummary(BaseModel):
    """One step as reported to the caller."""

    model_config = ConfigDict(extra="forbid")

    id: str
    status: str
    attempts: int = 0
    allotted_ms: float = 0.0
    elapsed_ms: float = 0.0
    model: str | None = None
    fallback: str | None = Field(
        default=None, description="The model that answered when it was not the step's primary."
    )
    error: str | None = None


class BudgetSummary(BaseModel):
    """The run's budget: total and used, in milliseconds."""

    model_config = ConfigDict(extra="forbid")

    total_ms: float
    used_ms: float


class RunResult(BaseModel):
    """What a run ended with. ``status`` is completed | partial | rejected | failed."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    chain: str
    status: Literal["completed", "partial", "rejected", "failed", "running"]
    output: Any = None
    budget: BudgetSummary
    steps: list[StepSummary]
    stopped_at: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """True for completed and partial runs (exit code 0 in the CLI)."""
        return self.status in ("completed", "partial")

    @classmethod
    def from_records(cls, run: RunRecord, steps: dict[str, StepRecord]) -> RunResult:
        """Build the result from stored records, steps in chain order."""
        order = [s.get("id") for s in run.spec.get("steps", []) if isinstance(s, dict)]
        summaries = [
            StepSummary(
                id=rec.step_id,
                status=rec.status,
                attempts=rec.attempts,
                allotted_ms=round(rec.allotted_ms, 3),
                elapsed_ms=round(rec.elapsed_ms, 3),
                model=rec.model,
                fallback=rec.fallback,
                error=rec.error,
            )
            for step_id in order
            if isinstance(step_id, str) and (rec := steps.get(step_id)) is not None
        ]
        return cls(
            run_id=run.run_id,
            chain=run.chain,
            status=run.status,
            output=run.output,
            budget=BudgetSummary(
                total_ms=round(run.budget_total_ms, 3), used_ms=round(run.budget_used_ms, 3)
            ),
            steps=summaries,
            stopped_at=run.stopped_at,
            error=run.error,
        )
