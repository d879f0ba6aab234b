"""Records the runtime builds itself on the step path, made without pydantic validation.

Every durable step builds a :class:`StepRecord`, a :class:`RunProgress` and (for a tool) an
:class:`AttemptRecord` from values the runtime produced and typed itself. Validating them again
costs a few microseconds each (issue 18); pydantic's ``model_construct`` is slower still (it
walks the fields in Python). These builders fill the instance's fields directly, in declaration
order, exactly as validation would leave them: the same values, equal records, the same JSON
(``tests/test_store_built.py`` compares them field for field). The one validator these models
carry, credential redaction of ``error`` and ``detail`` text, runs here too.

Only for values of the right types: anything read from outside (a store, a file, a caller) goes
through the models themselves.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel

from ._records import RECORD_SCHEMA, AttemptRecord, RunProgress, StepRecord
from ._url import redact_text

__all__ = ["attempt_record", "run_progress", "step_record"]

_M = TypeVar("_M", bound=BaseModel)
_set = object.__setattr__


def _made(cls: type[_M], data: dict[str, Any], given: set[str]) -> _M:
    record = cls.__new__(cls)
    _set(record, "__dict__", data)
    _set(record, "__pydantic_fields_set__", given)
    _set(record, "__pydantic_extra__", None)
    _set(record, "__pydantic_private__", None)
    return record


def _redacted(text: str | None) -> str | None:
    return None if text is None else redact_text(text)


def attempt_record(
    attempt: int,
    status: str,
    elapsed_ms: float,
    detail: str | None = None,
) -> AttemptRecord:
    """``AttemptRecord(attempt=, status=, elapsed_ms=, detail=)`` without validation (a tool's
    attempt: no model, endpoint, confidence, hops or hedge)."""
    data = {
        "attempt": attempt,
        "model": None,
        "endpoint": None,
        "status": status,
        "elapsed_ms": float(elapsed_ms),
        "detail": _redacted(detail),
        "confidence": None,
        "hops_ms": None,
        "hedge": None,
    }
    return _made(AttemptRecord, data, {"attempt", "status", "elapsed_ms", "detail"})


def step_record(
    *,
    step_id: str,
    status: str,
    output: Any,
    attempts: int,
    model: str | None,
    fallback: str | None,
    allotted_ms: float,
    elapsed_ms: float,
    started_at: float,
    finished_at: float,
    error: str | None,
    attempt_log: list[AttemptRecord],
    waits_ms: dict[str, float],
    confidence_score: float | None,
    verification_status: Literal["match", "mismatch", "unverified"] | None,
    degraded: dict[str, Any] | None,
    contradictions: list[str] | None,
) -> StepRecord:
    """A :class:`StepRecord` of every field, without validation (``attempt_log`` and
    ``waits_ms`` are kept as given: the caller hands over lists and dicts it no longer changes)."""
    data = {
        "schema_version": RECORD_SCHEMA,
        "step_id": step_id,
        "status": status,
        "output": output,
        "attempts": attempts,
        "model": model,
        "fallback": fallback,
        "allotted_ms": float(allotted_ms),
        "elapsed_ms": float(elapsed_ms),
        "started_at": float(started_at),
        "finished_at": float(finished_at),
        "error": _redacted(error),
        "attempt_log": attempt_log,
        "waits_ms": waits_ms,
        "confidence_score": None if confidence_score is None else float(confidence_score),
        "verification_status": verification_status,
        "degraded": degraded,
        "contradictions": contradictions,
    }
    return _made(StepRecord, data, set(_STEP_GIVEN))


_STEP_GIVEN = frozenset(StepRecord.model_fields) - {"schema_version"}


def run_progress(
    *,
    status: str,
    budget_used_ms: float,
    output: Any,
    error: str | None,
    stopped_at: str | None,
    release_owner: bool,
    waits_ms: dict[str, float],
    budget_total_ms: float | None,
    trace: dict[str, Any] | None,
) -> RunProgress:
    """A :class:`RunProgress` of every field, without validation (``waits_ms`` is copied)."""
    data = {
        "status": status,
        "budget_used_ms": float(budget_used_ms),
        "output": output,
        "error": _redacted(error),
        "stopped_at": stopped_at,
        "release_owner": release_owner,
        "waits_ms": dict(waits_ms),
        "budget_total_ms": None if budget_total_ms is None else float(budget_total_ms),
        "trace": trace,
    }
    return _made(RunProgress, data, set(_PROGRESS_GIVEN))


_PROGRESS_GIVEN = frozenset(RunProgress.model_fields)
