"""Run events (docs/serve.md, Run events): one schema for ``Runtime.stream``, the SSE of ``chainrt serve`` and
the event bus between runner processes.

An event is a JSON object with ``type``, ``run_id``, ``ts`` (unix seconds) and, for step events,
``step_id``. Live events come from the runner's progress seam (:class:`EventProgress`); a run's
history is rebuilt from its stored records (:func:`history`), so a client that connects late (or
to another runner than the run's owner) sees the same sequence.

Types: ``run_started`` (chain, budget), ``step_started`` (allotted_ms, model), ``token`` (text),
``attempt`` (endpoint, status, ms, why; ``usage`` when the attempt's server reported tokens),
``step_finished`` (the step summary of ``--json``),
``run_finished`` (the whole ``--json`` object).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._progress import Progress
from ._result import RunResult, step_usage

if TYPE_CHECKING:
    from ._records import AttemptRecord, RunRecord, StepRecord
    from .spec import StepSpec

__all__ = ["EVENT_TYPES", "EventProgress", "FanOut", "RunEvent", "history", "step_events"]

EVENT_TYPES = ("run_started", "step_started", "token", "attempt", "step_finished", "run_finished")
"""Every event type, in the order a run produces them."""


@dataclass(frozen=True, slots=True)
class RunEvent:
    """One event of a run. ``data`` holds the type's own fields (``to_dict`` flattens them)."""

    type: str
    run_id: str
    ts: float
    step_id: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The event as its JSON object (docs/serve.md, Run events)."""
        out: dict[str, Any] = {"type": self.type, "run_id": self.run_id, "ts": self.ts}
        if self.step_id is not None:
            out["step_id"] = self.step_id
        out.update(self.data)
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> RunEvent:
        """Parse an event's JSON object (ValueError naming what is wrong)."""
        kind, run_id, ts = raw.get("type"), raw.get("run_id"), raw.get("ts")
        if kind not in EVENT_TYPES or not isinstance(run_id, str):
            raise ValueError(f"not a run event: type={kind!r} run_id={run_id!r}")
        if not isinstance(ts, int | float):
            raise ValueError(f"run event {kind} has no numeric ts")
        step_id = raw.get("step_id")
        data = {k: v for k, v in raw.items() if k not in ("type", "run_id", "ts", "step_id")}
        return cls(kind, run_id, float(ts), step_id if isinstance(step_id, str) else None, data)

    @property
    def final(self) -> bool:
        """True for ``run_finished``, the last event of an execution that ended."""
        return self.type == "run_finished"


def _budget(record: RunRecord) -> dict[str, float]:
    return {"total_ms": record.budget_total_ms, "used_ms": record.budget_used_ms}


def _attempt(run_id: str, step_id: str, attempt: AttemptRecord, ts: float) -> RunEvent:
    data: dict[str, Any] = {
        "attempt": attempt.attempt,
        "model": attempt.model,
        "endpoint": attempt.endpoint,
        "status": attempt.status,
        "ms": attempt.elapsed_ms,
        "why": attempt.detail,
    }
    if attempt.hedge is not None:  # one of a hedged pair: the other attempt's number
        data["hedge"] = attempt.hedge
    if attempt.usage is not None:  # tokens the attempt's server reported
        data["usage"] = attempt.usage.model_dump(mode="json")
    return RunEvent("attempt", run_id, ts, step_id, data)


def step_events(run_id: str, record: StepRecord, ts: float | None = None) -> list[RunEvent]:
    """The ``attempt`` events of a written step record, then its ``step_finished``."""
    when = (record.finished_at or time.time()) if ts is None else ts
    events = [_attempt(run_id, record.step_id, a, when) for a in record.attempt_log]
    summary: dict[str, Any] = {
        "status": record.status,
        "attempts": record.attempts,
        "allotted_ms": round(record.allotted_ms, 3),
        "elapsed_ms": round(record.elapsed_ms, 3),
        "model": record.model,
        "fallback": record.fallback,
        "error": record.error,
    }
    usage = step_usage(record)
    if usage is not None:
        summary["usage"] = usage.model_dump(mode="json")
    events.append(RunEvent("step_finished", run_id, when, record.step_id, summary))
    return events


def history(run: RunRecord, steps: dict[str, StepRecord]) -> list[RunEvent]:
    """The events a run's stored records stand for, in order (``run_finished`` if it is final)."""
    if run.status == "queued":
        return []
    events = [
        RunEvent("run_started", run.run_id, run.created_at, data=_started_data(run, resumed=False))
    ]
    written = sorted(steps.values(), key=lambda r: (r.started_at, r.finished_at))
    for record in written:
        events.append(
            RunEvent(
                "step_started",
                run.run_id,
                record.started_at or run.created_at,
                record.step_id,
                {"allotted_ms": round(record.allotted_ms, 3), "model": record.model},
            )
        )
        if record.status == "running":  # an attempt written before its call: not finished
            when = record.started_at or run.created_at
            events.extend(_attempt(run.run_id, record.step_id, a, when) for a in record.attempt_log)
            continue
        events.extend(step_events(run.run_id, record))
    if run.finished or run.status == "waiting":  # a parked run's execution ended there too
        result = RunResult.from_records(run, steps).model_dump(mode="json")
        events.append(RunEvent("run_finished", run.run_id, run.updated_at, data=result))
    return events


def _started_data(record: RunRecord, *, resumed: bool) -> dict[str, Any]:
    return {"chain": record.chain, "budget": _budget(record), "resumed": resumed}


class EventProgress(Progress):
    """Turns one run's progress calls into :class:`RunEvent` s handed to ``sink``.

    ``attempt`` and ``token`` events are sent as they happen (LLM steps stream for it); attempts
    a step's record holds that were not sent live (a step kind that does not report them) are
    sent before its ``step_finished``.
    """

    wants_tokens = True

    def __init__(self, sink: Callable[[RunEvent], None], run_id: str = "") -> None:
        self._sink = sink
        self._run_id = run_id
        self._sent: dict[str, int] = {}
        """Attempts sent live, per step id."""

    def run_started(self, record: RunRecord, *, resumed: bool) -> None:
        """``run_started``: chain and budget."""
        self._run_id = record.run_id
        data = _started_data(record, resumed=resumed)
        self._sink(RunEvent("run_started", record.run_id, time.time(), data=data))

    def step_started(self, step: StepSpec, allotted_ms: float, model: str | None) -> None:
        """``step_started``: allotted ms and model."""
        data = {"allotted_ms": round(allotted_ms, 3), "model": model}
        self._sink(RunEvent("step_started", self._run_id, time.time(), step.id, data))

    def attempt(self, step_id: str, record: AttemptRecord) -> None:
        """``attempt``: endpoint, status, ms, why — as soon as the attempt ended."""
        self._sent[step_id] = self._sent.get(step_id, 0) + 1
        self._sink(_attempt(self._run_id, step_id, record, time.time()))

    def token(self, step_id: str, text: str) -> None:
        """``token``: generated text as it streams."""
        self._sink(RunEvent("token", self._run_id, time.time(), step_id, {"text": text}))

    def step_finished(self, record: StepRecord) -> None:
        """Its ``attempt`` events not sent live, then ``step_finished``."""
        sent = self._sent.pop(record.step_id, 0)
        for event in step_events(self._run_id, record, time.time())[sent:]:
            self._sink(event)

    def run_finished(self, result: RunResult) -> None:
        """``run_finished``: the whole ``--json`` object."""
        data = result.model_dump(mode="json")
        self._sink(RunEvent("run_finished", result.run_id, time.time(), data=data))


class FanOut(Progress):
    """Hands every call to each of ``targets`` in turn (the runtime's and the run's own)."""

    def __init__(self, *targets: Progress) -> None:
        self._targets = targets
        self._token_targets = tuple(t for t in targets if t.wants_tokens)
        self.wants_tokens = bool(self._token_targets)

    def run_started(self, record: RunRecord, *, resumed: bool) -> None:
        """To every target."""
        for target in self._targets:
            target.run_started(record, resumed=resumed)

    def step_started(self, step: StepSpec, allotted_ms: float, model: str | None) -> None:
        """To every target."""
        for target in self._targets:
            target.step_started(step, allotted_ms, model)

    def attempt(self, step_id: str, record: AttemptRecord) -> None:
        """To every target."""
        for target in self._targets:
            target.attempt(step_id, record)

    def token(self, step_id: str, text: str) -> None:
        """To every target that wants tokens."""
        for target in self._token_targets:
            target.token(step_id, text)

    def step_finished(self, record: StepRecord) -> None:
        """To every target."""
        for target in self._targets:
            target.step_finished(record)

    def run_finished(self, result: RunResult) -> None:
        """To every target."""
        for target in self._targets:
            target.run_finished(result)
