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

from .._records import RECORD_SCHEMA, AttemptRecord, RunProgress, StepRecord
from .._redact import redact_text

__all__ = ["SharedFields", "attempt_record", "made", "run_progress", "step_record"]

_M = TypeVar("_M", bound=BaseModel)


class SharedFields(set[str]):
    """The set of given fields that every record one builder makes shares.

    A set per record was the larger part of what a durable step keeps in memory until its run
    ends (1.2 KB of a step record's 2.7 KB, issue 18). Pydantic adds a field's name to this set
    when the field is assigned; assigning a field that is not in it raises instead, so that one
    record can never change another's (copies made by ``model_copy`` get a set of their own).
    """

    def add(self, name: str) -> None:
        """Refuse a new member (see the class)."""
        if name not in self:
            raise TypeError(
                f"field {name!r} of a record built without validation cannot be assigned; "
                "use model_copy(update=...)"
            )


def made(cls: type[_M], data: dict[str, Any], given: set[str]) -> _M:
    """An instance of ``cls`` holding ``data`` (every field, in declaration order, already of its
    type) with ``given`` as its set fields: what validation would make, without validating.
    ``given`` is kept as it is: a :class:`SharedFields` for records made many times."""
    record = _new(cls)
    _set_dict(record, data)
    _set_given(record, given)
    _set_extra(record, None)
    _set_private(record, None)
    return record


# BaseModel's slots, set through their descriptors (object.__setattr__ looks each one up
# through the class's MRO first: ~0.2 us of a record's ~0.7).
_new = object.__new__
_set_dict = BaseModel.__dict__["__dict__"].__set__
_set_given = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__


def _redacted(text: str | None) -> str | None:
    return None if text is None else redact_text(text)


def attempt_record(
    attempt: int,
    status: str,
    elapsed_ms: float,
    detail: str | None = None,
) -> AttemptRecord:
    """``AttemptRecord(attempt=, status=, elapsed_ms=, detail=)`` without validation (a tool's
    attempt: no model, endpoint, confidence, hops, usage or hedge)."""
    data = {
        "attempt": attempt,
        "model": None,
        "endpoint": None,
        "status": status,
        "elapsed_ms": float(elapsed_ms),
        "detail": _redacted(detail),
        "confidence": None,
        "hops_ms": None,
        "usage": None,
        "hedge": None,
    }
    return made(AttemptRecord, data, _ATTEMPT_GIVEN)


_ATTEMPT_GIVEN = SharedFields({"attempt", "status", "elapsed_ms", "detail"})


def step_record(
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
    ``waits_ms`` are kept as given: the caller hands over lists and dicts it no longer changes).

    The hot path passes the fields by position (in declaration order): 17 keyword arguments
    cost ~0.7 us more per call on a 2-CPU machine (issue 18)."""
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
    return made(StepRecord, data, _STEP_GIVEN)


_STEP_GIVEN = SharedFields(set(StepRecord.model_fields) - {"schema_version"})


def run_progress(
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
    """A :class:`RunProgress` of every field, without validation (``waits_ms`` is copied); the
    hot path passes the fields by position, in declaration order."""
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
    return made(RunProgress, data, _PROGRESS_GIVEN)


_PROGRESS_GIVEN = SharedFields(RunProgress.model_fields)
