"""What a person sees: live per-step progress and readable summaries."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

from .._durations import format_ms
from .._progress import Progress

if TYPE_CHECKING:  # annotations only: `chainrt runs` loads no chain-spec models
    from .._records import AttemptRecord, RunRecord, StepRecord, TokenUsage
    from .._result import RunResult
    from ..spec import StepSpec

__all__ = [
    "LivePrinter",
    "duration_arg",
    "print_inspect",
    "print_result",
    "print_runs",
    "resume_command",
]

_MARK = {
    "completed": "ok",
    "skipped": "--",
    "partial": "~~",
    "failed": "!!",
    "timed_out": "!!",
    "rejected": "!!",
    "running": "..",
    "cancelled": "--",
    "waiting": "||",
}


class LivePrinter(Progress):
    """Prints each step as it starts and ends (to stderr, so stdout stays the result)."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stderr

    def _say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def run_started(self, record: RunRecord, *, resumed: bool) -> None:
        verb = "resuming" if resumed else "running"
        left = record.budget_total_ms - record.budget_used_ms
        self._say(
            f"{verb} {record.chain}  run {record.run_id}  budget {format_ms(left)} left of {format_ms(record.budget_total_ms)}"
        )

    def step_started(self, step: StepSpec, allotted_ms: float, model: str | None) -> None:
        what = f"llm {model}" if model else step.kind
        self._say(f"  > {step.id:<16} {what:<18} allotted {format_ms(allotted_ms)}")

    def step_finished(self, record: StepRecord) -> None:
        via = (
            f"  via {record.fallback} (fallback)"
            if record.fallback
            else (f"  via {record.model}" if record.model else "")
        )
        why = f"  - {record.error}" if record.error and record.status != "completed" else ""
        self._say(
            f"  {_MARK.get(record.status, '??')} {record.step_id:<16} {record.status:<10} "
            f"{format_ms(record.elapsed_ms)} of {format_ms(record.allotted_ms)}{via}{why}"
        )

    def run_finished(self, result: RunResult) -> None:
        return None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _short(value: Any, width: int | None) -> str:
    """The value as text, cut at ``width`` characters (``None``: whole) with what was left out."""
    text = _text(value)
    if width is None or len(text) <= width:
        return text
    return f"{text[:width]}... ({len(text) - width} more characters; --full shows all)"


def degraded_note(result: RunResult) -> str | None:
    """One line saying which LLM steps were answered by their static answer, or ``None``."""
    if not result.degraded:
        return None
    answers = result.llm_answers
    return (
        f"degraded: {answers.static} of {answers.steps} LLM steps answered by their static "
        f"answer, not a model (primary {answers.primary}, fallback {answers.fallback}, "
        f"unanswered {answers.unanswered})"
    )


def duration_arg(ms: float) -> str:
    """``ms`` as a ``--budget`` value: ``8s``, ``1.5s``, ``600ms``."""
    if ms >= 1000 and ms % 100 == 0:
        return f"{ms / 1000:g}s"
    return f"{ms:.0f}ms"


def resume_command(
    run_id: str,
    *,
    budget_ms: float | None = None,
    store: str | None = None,
    pool: str | None = None,
    chains: Sequence[str] = (),
) -> str:
    """The ``chainrt resume`` line that continues a run as it was run: its budget, and the
    store, pool and chain roots it needs (a store URL's credentials masked, never printed)."""
    from .._redact import redact_text

    parts = ["chainrt", "resume", shlex.quote(run_id)]
    if budget_ms:
        parts += ["--budget", duration_arg(budget_ms)]
    if store:
        parts += ["--store", shlex.quote(redact_text(store))]
    if pool:
        parts += ["--pool", shlex.quote(pool)]
    for folder in chains:
        parts += ["--chains", shlex.quote(folder)]
    return " ".join(parts)


def print_result(result: RunResult, out: TextIO, *, resume: str | None = None) -> None:
    """The summary after ``run``/``resume``; ``resume`` is the command that would continue the
    run (:func:`resume_command`; default: the run id alone)."""
    used, total = result.budget.used_ms, result.budget.total_ms
    status = result.status.upper() + (" (DEGRADED)" if result.degraded else "")
    print(
        f"{status}  {result.chain}  run {result.run_id}  used {format_ms(used)} of {format_ms(total)}",
        file=out,
    )
    if result.stopped_at:
        print(f"stopped at step {result.stopped_at}: {result.error}", file=out)
    elif result.error:
        print(f"error: {result.error}", file=out)
    note = degraded_note(result)
    if note:
        print(note, file=out)
    if result.usage is not None:
        print(f"tokens: {format_usage(result.usage)}", file=out)
    print(f"output: {_text(result.output)}", file=out)
    if result.status == "waiting":
        if resume:
            print(f"continue with: {resume}", file=out)
    elif result.status not in ("completed", "running"):
        hint = resume or resume_command(result.run_id)
        print(f"resume with: {hint}", file=out)


def print_runs(runs: list[RunRecord], out: TextIO) -> None:
    """The table of ``chainrt runs``."""
    if not runs:
        print("no runs", file=out)
        return
    print(f"{'RUN ID':<34} {'CHAIN':<18} {'STATUS':<10} {'USED':>9} {'BUDGET':>9}", file=out)
    for run in runs:
        print(
            f"{run.run_id:<34} {run.chain:<18} {run.status:<10} {format_ms(run.budget_used_ms):>9} {format_ms(run.budget_total_ms):>9}",
            file=out,
        )


def print_inspect(
    run: RunRecord,
    steps: dict[str, StepRecord],
    trace_url: str | None,
    out: TextIO,
    *,
    full: bool = False,
) -> None:
    """The detail view of ``chainrt inspect``: the run's input and output whole, each step's
    output cut at 200 characters unless ``full``."""
    from .._result import RunResult, step_usage

    width = None if full else 200
    print(f"run      {run.run_id}", file=out)
    print(f"chain    {run.chain}  ({run.source or 'no source dir'})", file=out)
    print(
        f"status   {run.status}" + (f"  stopped at {run.stopped_at}" if run.stopped_at else ""),
        file=out,
    )
    print(
        f"budget   {format_ms(run.budget_used_ms)} used of {format_ms(run.budget_total_ms)}",
        file=out,
    )
    if run.owner:
        print(f"owner    {run.owner.host}:{run.owner.pid} (token {run.owner.token})", file=out)
    if run.error:
        print(f"error    {run.error}", file=out)
    result = RunResult.from_records(run, steps)
    note = degraded_note(result)
    if note:
        print(f"         {note}", file=out)
    if result.usage is not None:
        print(f"tokens   {format_usage(result.usage)}", file=out)
    for key, ms in run.waits_ms.items():
        if key.startswith("wait:"):  # parked at a wait step (not budget time)
            print(f"waited   {format_ms(ms)} for a signal at step {key[5:]}", file=out)
        else:
            print(f"waited   {format_ms(ms)} for key {key}", file=out)
    print(f"input    {_text(run.input)}", file=out)
    print(f"output   {_text(run.output)}", file=out)
    if trace_url:
        print(f"trace    {trace_url}", file=out)
    print("steps:", file=out)
    for spec_step in run.spec.get("steps", []):
        step_id = spec_step.get("id") if isinstance(spec_step, dict) else None
        rec = steps.get(step_id) if isinstance(step_id, str) else None
        if rec is None:
            print(f"  .. {step_id:<16} not run", file=out)
            continue
        model = f"  model {rec.model}" if rec.model else ""
        fallback = f"  fallback {rec.fallback}" if rec.fallback else ""
        print(
            f"  {_MARK.get(rec.status, '??')} {rec.step_id:<16} {rec.status:<10} {format_ms(rec.elapsed_ms)} of "
            f"{format_ms(rec.allotted_ms)}  attempts {rec.attempts}{model}{fallback}",
            file=out,
        )
        for key, ms in rec.waits_ms.items():
            print(f"       waited {format_ms(ms)} for key {key}", file=out)
        if (usage := step_usage(rec)) is not None:
            print(f"       tokens {format_usage(usage)}", file=out)
        for attempt in rec.attempt_log:
            where = attempt.endpoint or attempt.model or "-"
            # A tool's error detail carries its trace after the first line: shown with --full.
            first, *more = (attempt.detail or "").split("\n")
            detail = f" - {first}" if first else ""
            print(
                f"       #{attempt.attempt} {where} {attempt.status} {format_ms(attempt.elapsed_ms)}"
                f"{_quality(attempt)}{detail}",
                file=out,
            )
            for extra in more if full else ():
                print(f"         {extra}", file=out)
        if rec.confidence_score is not None or rec.verification_status or rec.degraded:
            print(f"       {_judged(rec)}", file=out)
        if rec.contradictions:
            print(f"       contradictions: {'; '.join(rec.contradictions)}", file=out)
        if rec.error:
            print(f"       error: {rec.error}", file=out)
        print(f"       output: {_short(rec.output, width)}", file=out)
        # Imported here: the tree needs the chain spec's names, and ``chainrt runs`` (which
        # shares this module) must not load the spec package and YAML.
        from ._tree import print_inner

        print_inner(spec_step, steps, out, full=full)


def _quality(attempt: AttemptRecord) -> str:
    """`` confidence 0.41 [queue 1ms admission 0ms prefill 80ms decode 120ms network 3ms]``."""
    text = "" if attempt.confidence is None else f" confidence {attempt.confidence:.2f}"
    if attempt.usage is not None:
        text += f" tokens {attempt.usage.prompt_tokens}+{attempt.usage.completion_tokens}"
    if attempt.hops_ms:
        hops = " ".join(f"{name} {format_ms(ms)}" for name, ms in attempt.hops_ms.items())
        text += f" [{hops}]"
    return text


def format_usage(usage: TokenUsage) -> str:
    """``1234 (prompt 1000, completion 234, cached 800)  cost 0.0123``."""
    cached = "" if usage.cached_tokens is None else f", cached {usage.cached_tokens}"
    cost = "" if usage.cost is None else f"  cost {usage.cost:.6g}"
    return (
        f"{usage.total_tokens} (prompt {usage.prompt_tokens}, completion "
        f"{usage.completion_tokens}{cached}){cost}"
    )


def _judged(rec: StepRecord) -> str:
    """The step's confidence, verification and degrade verdicts on one line."""
    parts = []
    if rec.confidence_score is not None:
        parts.append(f"confidence {rec.confidence_score:.2f}")
    if rec.verification_status:
        parts.append(f"verification {rec.verification_status}")
    if rec.degraded:
        how = ", ".join(f"{k} {v}" for k, v in rec.degraded.items())
        parts.append(f"degraded ({how})")
    return "  ".join(parts)
