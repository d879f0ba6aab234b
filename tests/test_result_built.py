"""A run's result built without validation (``RunResult.from_records``) is the result validation
makes: equal, the same JSON, every field in declaration order, its containers not shared with the
records it was built from."""

from __future__ import annotations

from typing import Any

import pytest

from chainrt._records import RunRecord, StepRecord
from chainrt._result import RunResult, step_usage
from chainrt.store._built import attempt_record, step_record

SPEC: dict[str, Any] = {
    "steps": [
        {"id": "fetch", "tool": "t.py:f"},
        {"id": "draft", "llm": {"model": "m"}},
        {"id": "check", "llm": {"model": "m"}},
        "not a step",  # a stored spec is read as it is: entries that are not steps are skipped
        {"id": 7},
        {"id": "later", "tool": "t.py:f"},
    ]
}


def _validated(run: RunRecord, steps: dict[str, StepRecord]) -> RunResult:
    """The result as validation builds it, from plain dicts (how it was built before)."""
    built = RunResult.from_records(run, steps)  # for the llm_answers counts only
    order = [s.get("id") for s in run.spec.get("steps", []) if isinstance(s, dict)]
    return RunResult.model_validate(
        {
            "run_id": run.run_id,
            "chain": run.chain,
            "status": run.status,
            "output": run.output,
            "budget": {
                "total_ms": round(run.budget_total_ms, 3),
                "used_ms": round(run.budget_used_ms, 3),
            },
            "steps": [
                {
                    "id": rec.step_id,
                    "status": rec.status,
                    "attempts": rec.attempts,
                    "allotted_ms": round(rec.allotted_ms, 3),
                    "elapsed_ms": round(rec.elapsed_ms, 3),
                    "model": rec.model,
                    "fallback": rec.fallback,
                    "error": rec.error,
                    "confidence_score": rec.confidence_score,
                    "verification_status": rec.verification_status,
                    "degraded": rec.degraded,
                    "contradictions": rec.contradictions,
                    "path": rec.step_id,
                    "branch": None,
                    "steps": None,
                    "usage": step_usage(rec),
                }
                for step_id in order
                if isinstance(step_id, str) and (rec := steps.get(step_id)) is not None
            ],
            "stopped_at": run.stopped_at,
            "error": run.error,
            "degraded": built.llm_answers.static > 0,
            "llm_answers": built.llm_answers,  # as it was passed before
            "usage": built.usage,
        }
    )


def _same(built: Any, validated: Any) -> None:
    assert built == validated
    assert list(built.__dict__) == list(type(validated).model_fields)  # declaration order
    assert built.model_fields_set == validated.model_fields_set
    assert {k: type(v) for k, v in built.__dict__.items()} == {
        k: type(v) for k, v in validated.__dict__.items()
    }
    assert built.model_dump_json() == validated.model_dump_json()


def _records() -> dict[str, StepRecord]:
    return {
        "fetch": step_record(
            step_id="fetch",
            status="completed",
            output={"order": [1, 2]},
            attempts=1,
            model=None,
            fallback=None,
            allotted_ms=1000 / 3,
            elapsed_ms=0.1234567,
            started_at=1.0,
            finished_at=1.5,
            error=None,
            attempt_log=[attempt_record(1, "ok", 0.12)],
            waits_ms={"user:u1": 0.5},
            confidence_score=None,
            verification_status=None,
            degraded=None,
            contradictions=None,
        ),
        # read back from a store: validated, with every optional field set
        "draft": StepRecord(
            step_id="draft",
            status="completed",
            output="hello",
            attempts=2,
            model="m",
            fallback="small",
            allotted_ms=250,
            elapsed_ms=12.5,
            confidence_score=0.75,
            verification_status="mismatch",
            degraded={"by": "cache", "age_s": 3},
            contradictions=["the prompt says 3, the answer 4"],
        ),
        "check": StepRecord(
            step_id="check", status="timed_out", model="m", fallback="static", error="late"
        ),
        "orphan": StepRecord(step_id="orphan", status="completed"),  # not in the spec
    }


@pytest.mark.parametrize("status", ["running", "completed", "partial", "failed", "queued"])
def test_a_built_result_is_the_validated_result(status: str) -> None:
    run = RunRecord(
        run_id="r1", chain="c", spec=SPEC, input={"q": 1}, status=status,
        budget_total_ms=30_000, budget_used_ms=1234.56789, output={"answer": [1, None]},
        error="step check: late" if status == "failed" else None, stopped_at="check",
    )  # fmt: skip
    steps = _records()
    built, validated = RunResult.from_records(run, steps), _validated(run, steps)
    _same(built, validated)
    _same(built.budget, validated.budget)
    _same(built.llm_answers, validated.llm_answers)
    assert [s.id for s in built.steps] == ["fetch", "draft", "check"]  # chain order, known only
    for mine, theirs in zip(built.steps, validated.steps, strict=True):
        _same(mine, theirs)
    assert built.steps[0].allotted_ms == 333.333
    assert built.steps[0].elapsed_ms == 0.123
    assert built.budget.used_ms == 1234.568


def test_a_built_result_shares_no_container_with_the_records() -> None:
    run = RunRecord(run_id="r1", chain="c", spec=SPEC, input={}, budget_total_ms=1000)
    steps = _records()
    result = RunResult.from_records(run, steps)
    draft = result.steps[1]
    assert draft.degraded is not None
    assert draft.contradictions is not None
    draft.degraded["by"] = "changed"
    draft.contradictions.append("changed")
    assert steps["draft"].degraded == {"by": "cache", "age_s": 3}
    assert steps["draft"].contradictions == ["the prompt says 3, the answer 4"]


def test_a_run_without_steps_or_spec_has_an_empty_result() -> None:
    run = RunRecord(run_id="r2", chain="c", spec={}, input={}, budget_total_ms=5)
    built = RunResult.from_records(run, {})
    _same(built, _validated(run, {}))
    assert built.steps == []
    assert built.llm_answers.steps == 0
    assert not built.degraded
