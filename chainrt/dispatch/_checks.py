"""Checks around one attempt: its time guard, the answer's validity, whether a fallback remains."""

from __future__ import annotations

import json
import time
from collections.abc import Coroutine, Sequence
from typing import Any

from .._bounded import within
from .._jsonschema import schema_violation
from ..errors import BackendError
from ._backend import BackendAnswer
from ._policy import NextCandidate
from ._types import LlmCall

__all__ = ["bounded", "check_answer", "worth_saving_for"]

_GUARD_SLACK_S = 0.01
"""Backends stop themselves at the attempt's end; this guard cancels one that does not."""


async def bounded(
    work: Coroutine[Any, Any, BackendAnswer], end: float, went: Sequence[str] = ()
) -> BackendAnswer:
    """Await a backend attempt, cancelling it a little after ``end`` (backends stop by then);
    one that does not wind down at once is abandoned (:func:`chainrt._bounded.within`).

    ``went``: the endpoints the attempt was sent to so far; a cut names the last, as the
    backend's own timeout would (on a loaded machine the guard can fire first), so the attempt
    log, the endpoint's breaker and the retry's ``avoid`` see the same cut either way.
    """
    try:
        return await within(work, max(end - time.time(), 0) + _GUARD_SLACK_S)
    except TimeoutError:
        raise BackendError(
            "attempt ran past its end and was cancelled",
            error_class="timeout",
            endpoint=went[-1] if went else None,
        ) from None


def check_answer(call: LlmCall, got: BackendAnswer) -> None:
    if got.finish_reason == "deadline" and not call.keep_partial:
        raise BackendError(
            "generation cut off by the deadline",
            error_class="timeout",
            endpoint=got.endpoint,
        )
    if (call.json_output or call.json_schema is not None) and got.finish_reason != "deadline":
        try:
            value = json.loads(got.text)
        except ValueError:
            raise BackendError(
                f"output is not valid JSON: {got.text[:80]!r}",
                error_class="bad_output",
                endpoint=got.endpoint,
            ) from None
        problem = None if call.json_schema is None else schema_violation(value, call.json_schema)
        if problem is not None:
            raise BackendError(
                f"output does not match the step's JSON Schema ({problem}): {got.text[:80]!r}",
                error_class="bad_output",
                endpoint=got.endpoint,
            )


def worth_saving_for(rest: list[NextCandidate]) -> bool:
    """Whether anything after the current candidate could still answer (a usable model, or the
    static answer)."""
    return any(candidate.static or candidate.usable for candidate in rest)
