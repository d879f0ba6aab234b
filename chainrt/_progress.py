"""The runner's event sink: live progress of runs, silent by default.

The CLI prints it (``LivePrinter``) and the LangChain bridge turns it into ``astream_events``. A
runner has one for every run, and a run may bring its own (``Runner.run(..., progress=...)``):
that is where one run's event stream (docs/serve.md, Run events) attaches. Calls for one run come in order from
the run's own task: ``run_started``, then per step ``step_started``, the step's ``attempt`` and
``token`` calls, and ``step_finished`` (a step the budget skipped has only ``step_finished``,
written), then ``run_finished`` — unless the run ends by an exception (cancelled, fenced out,
store down), which its caller sees instead.

``attempt`` hears each entry of an LLM step's attempt log as it is written. ``token`` hears the
generated text of LLM steps as it streams, but only from a progress whose ``wants_tokens`` is
True (streaming costs a little; nobody pays for it unless someone listens). After a failed
attempt, the next attempt's tokens start over: an ``attempt`` call between them says so
 (docs/serve.md, Run events).
Spans are not made here but by tracing's interceptors (:mod:`chainrt.tracing._intercept`).
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._records import AttemptRecord, RunRecord, StepRecord
    from ._result import RunResult
    from .spec import StepSpec

__all__ = ["NO_PROGRESS", "STEP_PROGRESS", "Progress"]


class Progress:
    """Receives run and step events. Override what you need; the defaults do nothing."""

    wants_tokens: bool = False
    """True: LLM steps stream their answers and :meth:`token` hears every piece."""

    def run_started(self, record: RunRecord, *, resumed: bool) -> None:
        """A run (or a resumed run) starts executing."""

    def step_started(self, step: StepSpec, allotted_ms: float, model: str | None) -> None:
        """A step starts with ``allotted_ms`` of budget."""

    def attempt(self, step_id: str, record: AttemptRecord) -> None:
        """An LLM step's attempt ended (or a model was skipped): one entry of its attempt log."""

    def token(self, step_id: str, text: str) -> None:
        """An LLM step generated ``text`` (only when :attr:`wants_tokens` is True)."""

    def step_finished(self, record: StepRecord) -> None:
        """A step's record was written (completed, skipped, failed, ...)."""

    def run_finished(self, result: RunResult) -> None:
        """The run reached a final status."""


NO_PROGRESS = Progress()

STEP_PROGRESS: ContextVar[Progress] = ContextVar("chainrt_step_progress", default=NO_PROGRESS)
"""The progress of the run whose step is running in this task (set by the runner per step)."""
