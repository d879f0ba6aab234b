"""Records built without validation (chainrt.store._built) are the records validation makes:
equal, with the same JSON, every field in declaration order, credentials in text redacted."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import TypeAdapter

from chainrt._records import AttemptRecord, RunProgress, StepRecord
from chainrt.store._built import attempt_record, run_progress, step_record
from chainrt.store._codec import encode

SECRET = "connect to http://bob:hunter2@db.example:5432 failed"


def _same(built: Any, validated: Any) -> None:
    assert built == validated
    assert list(built.__dict__) == list(type(validated).model_fields)  # declaration order
    assert built.__dict__ == validated.__dict__
    assert {k: type(v) for k, v in built.__dict__.items()} == {
        k: type(v) for k, v in validated.__dict__.items()
    }
    assert built.model_dump_json(by_alias=True) == validated.model_dump_json(by_alias=True)
    if not isinstance(built, AttemptRecord):  # the stores encode step records and progress
        data = encode(built, limit=1 << 20, what="x")
        assert data == encode(validated, limit=1 << 20, what="x")
        # the serializer encode calls directly writes what a TypeAdapter of the model writes
        assert data == TypeAdapter(type(validated)).dump_json(validated, by_alias=True)
    assert built.model_copy(update={"status": "failed"}).status == "failed"


def test_attempt_records_match() -> None:
    for detail in (None, "boom", SECRET):
        _same(
            attempt_record(2, "error", 1, detail),
            AttemptRecord(attempt=2, status="error", elapsed_ms=1, detail=detail),
        )
    assert "hunter2" not in (attempt_record(1, "error", 0.5, SECRET).detail or "")


def test_step_records_match() -> None:
    log = [attempt_record(1, "ok", 0.25)]
    values: dict[str, Any] = {
        "step_id": "s1",
        "status": "completed",
        "output": {"a": [1, 2.5, None, "x"]},
        "attempts": 1,
        "model": None,
        "fallback": None,
        "allotted_ms": 1000,
        "elapsed_ms": 0.125,
        "started_at": 1_700_000_000.25,
        "finished_at": 1_700_000_000.5,
        "error": None,
        "attempt_log": log,
        "waits_ms": {"user:u1": 0.5},
        "confidence_score": None,
        "verification_status": None,
        "degraded": None,
        "contradictions": None,
    }
    _same(step_record(**values), StepRecord(**values))
    others = {
        **values,
        "status": "timed_out",
        "model": "m",
        "fallback": "f",
        "error": SECRET,
        "confidence_score": 1,
        "verification_status": "match",
        "degraded": {"by": "cache", "age_s": 3},
        "contradictions": ["a"],
    }
    _same(step_record(**others), StepRecord(**others))


def test_run_progress_matches() -> None:
    waits = {"k": 1.5}
    values: dict[str, Any] = {
        "status": "running",
        "budget_used_ms": 12,
        "output": None,
        "error": None,
        "stopped_at": None,
        "release_owner": False,
        "waits_ms": waits,
        "budget_total_ms": None,
        "trace": None,
    }
    built = run_progress(**values)
    _same(built, RunProgress(**values))
    assert built.waits_ms is not waits  # copied, as validation copies it
    final = {
        **values,
        "status": "failed",
        "output": [1],
        "error": SECRET,
        "stopped_at": "s1",
        "release_owner": True,
        "budget_total_ms": 5000,
        "trace": {"trace_id": "t"},
    }
    _same(run_progress(**final), RunProgress(**final))


def test_built_records_share_their_fields_set_and_no_record_can_change_it() -> None:
    one = attempt_record(1, "ok", 0.5)
    two = attempt_record(2, "error", 1.5, "boom")
    assert one.model_fields_set is two.model_fields_set  # one set for every built attempt
    one.detail = "changed"  # a given field: assignable, and the shared set stays as it was
    assert one.detail == "changed"
    assert two.detail == "boom"
    with pytest.raises(TypeError, match="model_copy"):
        one.model = "m"  # not given: adding it would change every built record's set
    assert "model" not in two.model_fields_set
    copied = one.model_copy(update={"model": "m"})  # the way to change one: a copy of its own
    assert copied.model == "m"
    assert "model" in copied.model_fields_set
    assert "model" not in attempt_record(3, "ok", 0.1).model_fields_set
    step = step_record(
        "s1", "completed", None, 1, None, None, 1.0, 0.5, 1.0, 1.5, None, [one], {}, None, None,
        None, None,
    )  # fmt: skip
    again = step.model_copy(update={"schema_version": 2})
    assert "schema_version" in again.model_fields_set
    assert "schema_version" not in step.model_fields_set
