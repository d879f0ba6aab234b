"""The ``wait`` step kind: ends the step with the signal's payload, or parks the run.

Reached with its signal kept (sent early, or sent while the run was parked), the step completes
at once with the payload as its output. Reached without, it ends ``waiting``: :func:`settle`
stops the run there with status ``waiting``, the journal's final commit gives the owner lease
back, the loop gives the run's keys back, and the budget clock stops with the execution (a
resume starts a new clock from the budget used so far). The waiting record's output says what
the run waits for (``{"signal", "since", "until"}``), so a later execution knows when the wait
began (its timeout counts from then) and how long it lasted: that time goes into the run's
``waits_ms`` under ``wait:<path>``, apart from ``used_ms``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from .._durations import format_ms
from ..spec import StepSpec
from ..store._protocol import CheckpointStore
from ..store._signals import SignalRecord
from ._step import StepOutcome
from ._tool import TOOL_JOURNAL

__all__ = ["WAIT_KEY_PREFIX", "WaitExecutor", "wait_outcome"]

WAIT_KEY_PREFIX = "wait:"
"""The run's ``waits_ms`` holds each wait's time under ``wait:<path>`` (apart from keys' waits)."""


def wait_outcome(
    step: StepSpec, signal: SignalRecord | None, since: float, now: float
) -> tuple[StepOutcome, float | None]:
    """What a wait step is, given the signal kept (or None), when the wait began and now (pure):
    its outcome, and the ms it waited when it ended (None while it still waits)."""
    wait = step.wait
    assert wait is not None
    until = None if wait.timeout is None else since + wait.timeout / 1000
    if signal is not None and (until is None or signal.at <= until):
        return StepOutcome("completed", output=signal.payload), max(0.0, signal.at - since) * 1000
    if until is not None and now >= until:
        waited = (until - since) * 1000
        if wait.on_timeout == "continue":
            return StepOutcome("completed", output=None), waited
        why = f"no signal {wait.signal!r} came within its timeout ({format_ms(wait.timeout or 0)})"
        return StepOutcome("failed", error=why), waited
    parked = {"signal": wait.signal, "since": since, "until": until}
    return StepOutcome("waiting", output=parked, error=f"waiting for signal {wait.signal!r}"), None


class WaitExecutor:
    """The executor of ``wait`` steps: reads the step's signal from the store."""

    def __init__(self, store: CheckpointStore) -> None:
        self.store = store

    async def run(
        self,
        step: StepSpec,
        scope: dict[str, Any],
        *,
        run_id: str,
        deadline: float,
        source_dir: Path | None,
    ) -> StepOutcome:
        """End the wait ``step`` (named by its path) or park the run at it."""
        wait = step.wait
        if wait is None:
            return StepOutcome("failed", error="a wait executor was given another step kind")
        journal = TOOL_JOURNAL.get()
        now = time.time()
        since = now
        earlier = journal.done.get(step.id) if journal is not None else None
        if earlier is not None and earlier.status == "waiting":
            held = earlier.output.get("since") if isinstance(earlier.output, dict) else None
            if isinstance(held, int | float) and held <= now:
                since = float(held)
        signal = await self.store.get_signal(run_id, wait.signal)
        outcome, waited_ms = wait_outcome(step, signal, since, now)
        if waited_ms is not None and journal is not None:
            journal.waits_ms[WAIT_KEY_PREFIX + step.id] = round(waited_ms, 3)
        return outcome
