"""Entries of the attempt log that no backend wrote, and how a dispatch ends without an answer:
the step's static answer, or the error that lists every attempt."""

from __future__ import annotations

from .._records import AttemptRecord
from ..errors import DispatchFailed, NoEndpoint
from ._types import LlmAnswer, LlmCall

__all__ = ["append", "no_answer", "skip", "static_answer"]


def append(call: LlmCall, attempts: list[AttemptRecord], record: AttemptRecord) -> None:
    """Add ``record`` to the attempt log and tell the call's ``on_attempt``."""
    attempts.append(record)
    if call.on_attempt is not None:
        call.on_attempt(record)


def skip(call: LlmCall, attempts: list[AttemptRecord], model: str, detail: str) -> None:
    """Log that ``model`` was not tried, and why."""
    append(
        call,
        attempts,
        AttemptRecord(
            attempt=len(attempts) + 1, model=model, status="skipped", elapsed_ms=0, detail=detail
        ),
    )


def static_answer(call: LlmCall, attempts: list[AttemptRecord]) -> LlmAnswer:
    """The step's static answer, once every model failed (streamed as one piece)."""
    assert call.static_answer is not None
    append(
        call,
        attempts,
        AttemptRecord(
            attempt=len(attempts) + 1,
            model="static",
            status="ok",
            elapsed_ms=0,
            detail="every model failed; the step's static answer was used",
        ),
    )
    if call.on_token is not None and call.static_answer:
        call.on_token(call.static_answer)
    return LlmAnswer(
        text=call.static_answer,
        model="static",
        endpoint=None,
        finish_reason="static",
        attempts=attempts,
    )


def no_answer(call: LlmCall, attempts: list[AttemptRecord], *, tried: bool) -> DispatchFailed:
    """The error of a dispatch that got no answer: :class:`NoEndpoint` when no model had an
    endpoint to try at all (``tried`` False), else :class:`DispatchFailed`."""
    summary = "; ".join(f"{a.model}: {a.status} ({a.detail})" for a in attempts) or "nothing"
    if not tried:
        return NoEndpoint(
            f"no model of step {call.step_id!r} has an endpoint to try: {summary}", attempts
        )
    return DispatchFailed(f"no model answered step {call.step_id!r}: {summary}", attempts)
