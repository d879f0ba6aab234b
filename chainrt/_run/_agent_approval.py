"""An agent's tool call that waits for its approval (chainrt/agent/_approvals.py): read the decision
kept for the call, or write the call's ``waiting`` record so that the run parks.

Used by :mod:`chainrt._run._agent`. The decision goes into the call's entry (``approval``), and
the time the call waited into the run's ``waits_ms`` under ``wait:<call path>``.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from .._records import StepRecord
from ..agent._approvals import Decision, approval_key, decision_of
from ._journal import RunJournal
from ._wait import WAIT_KEY_PREFIX

__all__ = ["Parked", "decide", "refusal"]


class Parked:
    """A call that waits for its approval: the agent step parks the run."""

    __slots__ = ("path", "signal", "tool")

    def __init__(self, path: str, signal: str, tool: str) -> None:
        self.path, self.signal, self.tool = path, signal, tool


def refusal(signal: str | None, decision: Decision) -> str:
    """What the model is told of a refused call."""
    reason = f": {decision.reason}" if decision.reason else ""
    return f"the call was refused (approval {signal!r}){reason}"


async def decide(
    journal: RunJournal | None,
    run_id: str,
    what: tuple[str, str, str],
    entry: dict[str, Any],
    recorded: StepRecord | None,
    write: Callable[[StepRecord], Awaitable[StepRecord]],
) -> Decision | Parked:
    """The decision on a call (``what``: its approval's signal, its tool, its path), noted in its
    ``entry``; or Parked after its ``waiting`` record is written with ``write`` (the first time
    only: ``since`` is kept across resumes, and ``recorded`` is the call's earlier record)."""
    signal, tool, cpath = what
    if journal is None:
        return Decision(False, "an approval needs the run's store, and this run has none")
    kept = await journal.store.get_signal(run_id, approval_key(signal, cpath))
    held = recorded.output if recorded is not None and recorded.status == "waiting" else None
    since = held.get("since") if isinstance(held, dict) else None
    if kept is not None:
        decision = decision_of(kept)
        entry["approval"] = {"signal": signal, "approve": decision.approve}
        if decision.reason is not None:
            entry["approval"]["reason"] = decision.reason
        if isinstance(since, int | float):
            waited = max(0.0, kept.at - since) * 1000
            journal.waits_ms[WAIT_KEY_PREFIX + cpath] = round(waited, 3)
        return decision
    if not isinstance(since, int | float):
        now = time.time()
        record = StepRecord(
            step_id=cpath,
            status="waiting",
            output={**entry, "approval": signal, "since": now},
            allotted_ms=0.0,
            elapsed_ms=0.0,
            started_at=now,
            finished_at=now,
            error=f"waiting for approval {signal!r}",
        )
        written = await write(record)
        if written is not record:
            return Decision(False, f"the call's wait could not be recorded: {written.error}")
    return Parked(cpath, signal, tool)
