"""``GET /v1/runs/{id}/record``: one run as the dashboard draws it (docs/serve.md, Run events).

The ``chainrt run --json`` object plus what a waterfall needs and the summary leaves out: the
run's input and creation time, the chain's steps in order (optional ones marked, so a step the
budget skipped shows greyed; a group's kind, so its branches and items are drawn as lanes),
each written step's record (start and end times, attempts with endpoint and status, concurrency
waits, output; a group's inner steps under their path) and where its trace can be seen.
"""

from __future__ import annotations

from typing import Any

from .._hooks import Hooks
from .._records import RunRecord, StepRecord
from .._result import RunResult
from ..runs._signals import parked_detail

__all__ = ["run_detail"]


def _plan(record: RunRecord) -> list[dict[str, Any]]:
    plan = []
    for step in record.spec.get("steps", []):
        if not isinstance(step, dict) or not isinstance(step.get("id"), str):
            continue
        kinds = ("llm", "agent", "tool", "runnable", "switch", "parallel", "map", "wait")
        kind = next((k for k in kinds if step.get(k) is not None), "step")
        plan.append({"id": step["id"], "kind": kind, "optional": bool(step.get("optional"))})
    return plan


def run_detail(record: RunRecord, steps: dict[str, StepRecord], hooks: Hooks) -> dict[str, Any]:
    """The JSON object of ``GET /v1/runs/{id}/record``."""
    detail = RunResult.from_records(record, steps).model_dump(mode="json")
    trace_id = record.trace.get("trace_id")
    detail.update(
        input=record.input,
        created_at=record.created_at,
        updated_at=record.updated_at,
        waits_ms=record.waits_ms,
        trace={
            "trace_id": trace_id,
            "url": hooks.trace_url(str(trace_id)) if trace_id else None,
        },
        plan=_plan(record),
        records={
            step_id: rec.model_dump(mode="json", by_alias=True) for step_id, rec in steps.items()
        },
        waiting_for=parked_detail(record, steps),  # the dashboard's signal form
    )
    return detail
