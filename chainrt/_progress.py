"""Live progress of a run, for people (the CLI prints it); silent by default."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._result import RunResult
    from .spec import StepSpec
    from .store._records import RunRecord, StepRecord

__all__ = ["NO_PROGRESS", "Progress"]


class Progress:
    """Receives run and step events. Override what you need; the defaults do nothing."""

    def run_started(self, record: RunRecord, *, resumed: bool) -> None:
        """A run (or a resumed run) starts executing."""

    def step_started(self, step: StepSpec, allotted_ms: float, model: str | None) -> None:
        """A step starts with ``allotted_ms`` of budget."""

    def step_finished(self, record: StepRecord) -> None:
        """A step's record was written (completed, skipped, failed, ...)."""

    def run_finished(self, result: RunResult) -> None:
        """The run reached a final status."""


NO_PROGRESS = Progress()
