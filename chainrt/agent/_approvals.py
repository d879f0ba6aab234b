"""Approvals: an agent's tool call that waits for a person's signal before it runs.

A tool of an ``agent`` step given ``approval: NAME`` (docs/chain-format.md, Agent steps) waits
for signal ``NAME`` before each call: the call's record is written ``waiting`` (its output names
the tool, the arguments and the signal) and the run parks as at a ``wait`` step.

Signals are kept once per name per run, and one approval name serves many calls, so an approval
is addressed to one call: ``chainrt signal RUN NAME`` goes to the call parked waiting for
``NAME`` at that moment (the first in turn order when several are) and is kept under
:func:`approval_key` (``NAME@agent.call[2.1]``). The call reads its own key on resume and writes
the decision into its record, so a resume never asks twice (the key is still there) and never
runs a refused call (a refused call's record is final). An approval sent while no call waits for
it is refused (409): a person approves a call they have been shown.

The payload is ``{"approve": bool, "reason"?: str}`` (:data:`APPROVAL_WAIT`); anything else is
refused (422) and the run keeps waiting.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from .._errors import SignalRefused
from .._records import RunRecord, StepRecord
from ..spec._flow_check import data_steps
from ..spec._wait import WaitSpec, payload_problem
from ..store._protocol import CheckpointStore
from ..store._signals import KeptSignal, SignalRecord

__all__ = [
    "APPROVAL_WAIT",
    "Decision",
    "ParkedCall",
    "approval_detail",
    "approval_key",
    "decision_of",
    "keep_approval",
    "parked_approval",
    "parked_calls",
    "refuse_early",
]

APPROVAL_WAIT: Final = WaitSpec(signal="approval", payload={"approve": "bool", "reason?": "str"})
"""The payload's shape of every approval (its ``signal`` is replaced by the tool's name)."""

_CALL = re.compile(r"\.call\[(\d+)\.(\d+)\]$")


def approval_key(name: str, call_path: str) -> str:
    """The name an approval ``name`` for the call at ``call_path`` is kept under."""
    return f"{name}@{call_path}"


@dataclass(frozen=True, slots=True)
class ParkedCall:
    """A tool call parked waiting for its approval: its record's path and what it waits for."""

    path: str
    signal: str
    tool: str
    arguments: Any
    since: float | None

    @property
    def wait(self) -> WaitSpec:
        """The approval as a wait (the CLI's ``chainrt signal`` hint, the dashboard's form)."""
        return APPROVAL_WAIT.model_copy(update={"signal": self.signal})


@dataclass(frozen=True, slots=True)
class Decision:
    """What an approval's payload says: run the call, or not and why."""

    approve: bool
    reason: str | None


def decision_of(signal: SignalRecord) -> Decision:
    """The decision an approval's payload carries (a payload of another shape: refused)."""
    payload = signal.payload
    if payload_problem(APPROVAL_WAIT, payload) is not None or not isinstance(payload, dict):
        return Decision(False, f"the approval's payload has the wrong shape: {payload!r}")
    reason = payload.get("reason")
    return Decision(payload["approve"] is True, None if reason is None else str(reason))


def _order(path: str) -> tuple[int, int, str]:
    found = _CALL.search(path)
    return (int(found[1]), int(found[2]), path) if found else (-1, -1, path)


def parked_calls(steps: Mapping[str, StepRecord]) -> list[ParkedCall]:
    """The calls of ``steps`` parked waiting for an approval, in turn order."""
    parked = []
    for path, step in steps.items():
        out = step.output
        if step.status != "waiting" or not isinstance(out, dict) or "approval" not in out:
            continue
        if not _CALL.search(path):  # the agent step's own record: not a call
            continue
        since = out.get("since")
        parked.append(
            ParkedCall(
                path=path,
                signal=str(out["approval"]),
                tool=str(out.get("name")),
                arguments=out.get("arguments"),
                since=float(since) if isinstance(since, int | float) else None,
            )
        )
    return sorted(parked, key=lambda call: _order(call.path))


async def parked_approval(
    store: CheckpointStore, record: RunRecord, name: str | None = None, path: str | None = None
) -> ParkedCall | None:
    """The call the ``waiting`` run ``record`` is parked at for approval (for signal ``name``,
    at ``path``, when given), else None."""
    if record.status != "waiting" or not _has_approvals(record.spec):
        return None
    for call in parked_calls(await store.get_steps(record.run_id)):
        if (name is None or call.signal == name) and (path is None or call.path == path):
            return call
    return None


async def keep_approval(
    store: CheckpointStore, run_id: str, call: ParkedCall, payload: Any
) -> KeptSignal:
    """Check ``payload`` and keep it as the approval of ``call`` (SignalRefused: nothing kept)."""
    problem = payload_problem(APPROVAL_WAIT, payload)
    if problem is not None:
        raise SignalRefused(
            f'the payload of approval {call.signal!r} must be {{"approve": bool, '
            f'"reason"?: str}}: {problem}; run {run_id!r} keeps waiting'
        )
    key = approval_key(call.signal, call.path)
    return await store.put_signal(run_id, SignalRecord(name=key, payload=payload))


def refuse_early(record: RunRecord, name: str) -> None:
    """SignalRefused (409) when ``name`` is an approval of the run's chain and no call of the
    run waits for it now; else nothing."""
    if name in set(_approval_names(record.spec)):
        raise SignalRefused(
            f"no call of run {record.run_id!r} waits for approval {name!r} now (run status: "
            f"{record.status}); an approval goes to a call the run is waiting on",
            conflict=True,
        )


def approval_detail(record: RunRecord, steps: Mapping[str, StepRecord]) -> dict[str, Any] | None:
    """What a run parked at an approval waits for, for people (as ``parked_detail``), plus the
    tool and the arguments of the call to approve; None when it is not parked at one."""
    if record.status != "waiting":
        return None
    for call in parked_calls(steps):
        wait = call.wait
        return {
            "signal": call.signal,
            "step": call.path,
            "schema": wait.payload_schema(),
            "example": {"approve": True, "reason": "..."},
            "since": call.since,
            "until": None,
            "on_timeout": wait.on_timeout,
            "tool": call.tool,
            "arguments": call.arguments,
        }
    return None


def _has_approvals(spec: Mapping[str, Any]) -> bool:
    return next(_approval_names(spec), None) is not None


def _approval_names(spec: Mapping[str, Any]) -> Iterator[str]:
    """The approval names of the agents of a stored (normalised) spec, at any depth."""
    for step, _ in data_steps(spec.get("steps")):
        agent = step.get("agent")
        if isinstance(agent, Mapping):
            for tool in agent.get("tools") or ():
                if isinstance(tool, Mapping) and isinstance(tool.get("approval"), str):
                    yield tool["approval"]
