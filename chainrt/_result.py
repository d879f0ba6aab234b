"""The result of a run, shaped like the CLI's ``--json`` object (README.md, Using it)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ._records import RunRecord, StepRecord, TokenUsage
from ._result_tree import inner_llm_paths, nest_groups
from .store._built import SharedFields, made

__all__ = ["BudgetSummary", "LlmAnswers", "RunResult", "StepSummary", "TokenUsage", "step_usage"]


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
    confidence_score: float | None = Field(
        default=None, description="The answer's confidence in [0, 1] (llm steps)."
    )
    verification_status: str | None = Field(
        default=None, description="match | mismatch | unverified (llm steps with `verify:`)."
    )
    degraded: dict[str, Any] | None = Field(
        default=None, description="The `degrade:` action that answered, e.g. {by: cache, age_s}."
    )
    contradictions: list[str] | None = Field(
        default=None, description="Contradictions found between the prompt and the answer."
    )
    path: str | None = Field(
        default=None,
        description="Where the step sits: its id, or inside a group e.g. 'gather.kb.search', "
        "'per_item[3].classify', 'route.refund.policy'.",
    )
    branch: str | None = Field(default=None, description="The branch a switch took.")
    steps: list[StepSummary] | None = Field(
        default=None, description="A group's inner steps that ran, in order (groups only)."
    )
    usage: TokenUsage | None = Field(
        default=None,
        description="Tokens of every attempt of the step that reported usage (and their cost, "
        "with a pool price); None when no attempt reported any.",
    )


class BudgetSummary(BaseModel):
    """The run's budget: total and used, in milliseconds."""

    model_config = ConfigDict(extra="forbid")

    total_ms: float
    used_ms: float


class LlmAnswers(BaseModel):
    """Who answered the run's LLM steps: the step's own model, a fallback model, or nobody.

    A step whose every model failed and whose ``static_answer`` was used counts under ``static``;
    a step that failed or timed out with no answer at all counts under ``unanswered``.
    """

    model_config = ConfigDict(extra="forbid")

    steps: int = Field(default=0, description="LLM steps that ran.")
    primary: int = Field(default=0, description="Answered by the step's own model.")
    fallback: int = Field(default=0, description="Answered by one of the step's fallback models.")
    static: int = Field(default=0, description="Answered by the step's static answer.")
    unanswered: int = Field(default=0, description="Failed or timed out without an answer.")


STATIC_MODEL = "static"
"""The name the dispatcher records as the model of a static answer."""


def _llm_answers(llm_steps: list[StepRecord]) -> LlmAnswers:
    counts = LlmAnswers(steps=len(llm_steps))
    for rec in llm_steps:
        if rec.status not in ("completed", "partial"):
            counts.unanswered += 1
        elif rec.fallback == STATIC_MODEL:
            counts.static += 1
        elif rec.fallback is not None:
            counts.fallback += 1
        else:
            counts.primary += 1
    return counts


class RunResult(BaseModel):
    """What a run ended with (completed | partial | rejected | failed | cancelled), or where it
    is (queued | running | waiting) when read before the end."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    chain: str
    status: Literal[
        "queued", "running", "completed", "partial", "rejected", "failed", "cancelled", "waiting"
    ]
    output: Any = None
    budget: BudgetSummary
    steps: list[StepSummary]
    stopped_at: str | None = None
    error: str | None = None
    degraded: bool = Field(
        default=False,
        description="True when at least one LLM step was answered by its static answer "
        "instead of a model; `llm_answers` has the counts.",
    )
    llm_answers: LlmAnswers = Field(default_factory=LlmAnswers)
    usage: TokenUsage | None = Field(
        default=None, description="The sum of the steps' usage; None when no step reported any."
    )

    @property
    def ok(self) -> bool:
        """True for completed and partial runs (exit code 0 in the CLI)."""
        return self.status in ("completed", "partial")

    @classmethod
    def from_records(cls, run: RunRecord, steps: dict[str, StepRecord]) -> RunResult:
        """Build the result from stored records, steps in chain order."""
        spec_steps = [s for s in run.spec.get("steps", []) if isinstance(s, dict)]
        order = [s.get("id") for s in spec_steps]
        llm_ids = {s.get("id") for s in spec_steps if s.get("llm") is not None}
        if len(steps) > len(spec_steps):  # records of steps inside groups: their llm steps too
            llm_ids |= inner_llm_paths(spec_steps, steps)
        answers = _llm_answers([rec for step_id, rec in steps.items() if step_id in llm_ids])
        # Built without validation (issue 18): every value comes from a RunRecord and its
        # StepRecords, already of these fields' types; validating 100 summaries cost ~5 us of
        # CPU per step of a 100-step run. tests/test_result_built.py compares both ways.
        summaries = [
            _summary(rec)
            for step_id in order
            if isinstance(step_id, str) and (rec := steps.get(step_id)) is not None
        ]
        if len(steps) > len(summaries):  # records of steps inside groups: nest them
            summaries = nest_groups(spec_steps, steps, summaries, _summary)
        budget = made(
            BudgetSummary,
            {
                "total_ms": float(round(run.budget_total_ms, 3)),
                "used_ms": float(round(run.budget_used_ms, 3)),
            },
            _BUDGET_FIELDS,
        )
        data = {
            "run_id": run.run_id,
            "chain": run.chain,
            "status": run.status,
            "output": run.output,
            "budget": budget,
            "steps": summaries,
            "stopped_at": run.stopped_at,
            "error": run.error,
            "degraded": answers.static > 0,
            "llm_answers": answers,
            # Every record, those of steps inside groups included (a group's own has no attempts).
            "usage": TokenUsage.of([step_usage(rec) for rec in steps.values()]),
        }
        return made(cls, data, _RESULT_FIELDS)


def step_usage(rec: StepRecord) -> TokenUsage | None:
    """The tokens of a step: the sum of its attempts' usage (None when none reported any)."""
    if not rec.attempt_log:
        return None
    return TokenUsage.of([a.usage for a in rec.attempt_log])


def _summary(rec: StepRecord) -> StepSummary:
    """The summary of one step record (its containers copied, as validation copies them)."""
    data = {
        "id": rec.step_id,
        "status": rec.status,
        "attempts": rec.attempts,
        "allotted_ms": float(round(rec.allotted_ms, 3)),
        "elapsed_ms": float(round(rec.elapsed_ms, 3)),
        "model": rec.model,
        "fallback": rec.fallback,
        "error": rec.error,
        "confidence_score": rec.confidence_score,
        "verification_status": rec.verification_status,
        "degraded": None if rec.degraded is None else dict(rec.degraded),
        "contradictions": None if rec.contradictions is None else list(rec.contradictions),
        "path": rec.step_id,
        "branch": None,
        "steps": None,
        "usage": step_usage(rec),
    }
    return made(StepSummary, data, _SUMMARY_FIELDS)


_SUMMARY_FIELDS = SharedFields(StepSummary.model_fields)
_BUDGET_FIELDS = SharedFields(BudgetSummary.model_fields)
_RESULT_FIELDS = SharedFields(RunResult.model_fields)
