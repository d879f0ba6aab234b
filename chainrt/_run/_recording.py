"""Writing how a step ended, even when the store cannot take what the step produced.

A tool may return a list nested 300 deep or a string holding a lone surrogate (``"\\ud800"``):
JSON-serialisable to Python, not to the store. Raised out of the budget loop, such a value left
the run ``running`` with its lease released, and every resume ran the tool again and failed the
same way. Here the step is written as ``failed`` instead — without the output, with a message
that says why — and the run ends ``failed``; a resume of that run returns it as it is rather than
calling the tool a second time (:func:`repeats_side_effects`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._progress import Progress
from .._records import AttemptRecord, StepRecord
from ..spec import ChainSpec, StepSpec, render_value
from ._journal import RunJournal, _Unrecordable

__all__ = [
    "UNRECORDED",
    "end_step",
    "finish_output",
    "repeats_side_effects",
    "run_output",
    "unrecorded",
]

UNRECORDED = "its record could not be stored"
"""How the error of a step whose record the store refused begins."""

_MAX_REASON = 300


def _safe(text: str) -> str:
    """``text`` as the store can hold it: lone surrogates escaped, one line, bounded."""
    safe = text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\n", " ")
    return safe if len(safe) <= _MAX_REASON else safe[: _MAX_REASON - 3] + "..."


def unrecorded(record: StepRecord, reason: str) -> StepRecord:
    """A storable ``failed`` record of a step whose record the store refused."""
    return StepRecord(
        step_id=record.step_id,
        status="failed",
        output=None,
        attempts=record.attempts,
        model=record.model,
        fallback=record.fallback,
        allotted_ms=record.allotted_ms,
        elapsed_ms=record.elapsed_ms,
        started_at=record.started_at,
        finished_at=record.finished_at,
        error=(
            f"{UNRECORDED} ({_safe(reason)}); the step ran and will not run again on resume — "
            "make its output smaller, shallower or valid UTF-8"
        ),
        attempt_log=[
            AttemptRecord(
                attempt=a.attempt,
                model=a.model,
                endpoint=a.endpoint,
                status=a.status,
                elapsed_ms=a.elapsed_ms,
                detail=None if a.detail is None else _safe(a.detail),
            )
            for a in record.attempt_log
        ],
        waits_ms={_safe(key): ms for key, ms in record.waits_ms.items()},
    )


async def end_step(
    journal: RunJournal,
    progress: Progress,
    step: StepSpec,
    record: StepRecord,
    stop: str | None,
) -> bool:
    """Write the step's ``record`` (and the run's end, when ``stop`` says the run stops here);
    True when the run ended. A record the store refuses ends the step and the run ``failed``."""
    try:
        if stop is None:
            await journal.record_step(record)
        else:
            await journal.finish(
                stop,
                error=f"step {step.id}: {record.error or record.status}",
                stopped_at=step.id,
                step=record,
            )
    except _Unrecordable as exc:
        record, stop = unrecorded(record, exc.message), "failed"
        await journal.finish(
            stop, error=f"step {step.id}: {record.error}", stopped_at=step.id, step=record
        )
    progress.step_finished(record)
    return stop is not None


def run_output(spec: ChainSpec, scope: dict[str, Any]) -> Any:
    """The run's output: the chain's ``output`` template rendered, else the output of the last
    step that ran (a skipped last step gives way to the one before it)."""
    if spec.output is not None:
        return render_value(spec.output, scope)
    last = spec.steps[-1].id
    for step in reversed(spec.steps):
        if step.id in scope["steps"]:
            last = step.id
            break
    return scope["steps"].get(last, {}).get("output")


async def finish_output(journal: RunJournal, output: object) -> None:
    """End the run ``completed`` with ``output``, or ``failed`` if the store refuses it."""
    try:
        await journal.finish("completed", output=output)
    except _Unrecordable as exc:
        await journal.finish(
            "failed",
            error=f"output: the run's output could not be recorded ({_safe(exc.message)})",
        )


def repeats_side_effects(steps: Mapping[str, StepRecord]) -> str | None:
    """The step a resume must not run again: it ran, and only its output could not be recorded."""
    for step_id, record in steps.items():
        if record.status == "failed" and (record.error or "").startswith(UNRECORDED):
            return step_id
    return None
