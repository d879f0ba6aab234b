"""Signals: what continues a run parked at a ``wait`` step (docs/chain-format.md, Waits).

:func:`send_signal` checks a signal against the run's stored spec (a ``wait`` of that name, a
payload that fits its schema: else :class:`SignalRefused`, nothing kept) and keeps it in the
store, atomically with reading the run's status. The caller then continues the run when it was
``waiting`` (``Runtime.signal`` resumes it here; ``chainrt serve`` queues it for any runner).

A run and a signal may cross: the runner looks for the signal, finds none, and parks; the
signal is kept between the two. Both sides look again after their own write, so at least one
of them sees the other (each write is atomic in the store): the sender sees ``waiting``, or the
runner, after parking, finds the signal (:func:`continue_parked`) and continues the run itself.
When both do, the fencing token lets one of them take the run and the other stands back.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .._errors import CheckpointError, RunLocked, SignalRefused, StoreUnavailable
from .._records import RunRecord, StepRecord
from .._result import RunResult
from ..agent._approvals import approval_detail, keep_approval, parked_approval, refuse_early
from ..spec._flow_check import data_steps
from ..spec._wait import SIGNAL_NAME, WaitSpec, payload_problem
from ..store._protocol import CheckpointStore
from ..store._signals import SignalRecord, payload_json

_MAX_CONTINUES = 64  # waits one execution may pass in a row (a chain has fewer)

__all__ = [
    "SignalSent",
    "continue_parked",
    "example_payload",
    "parked_detail",
    "parked_wait",
    "send_signal",
    "stored_waits",
    "waits_on",
]


@dataclass(frozen=True, slots=True)
class SignalSent:
    """A signal kept for a run: the run's status when it was kept (``waiting``: the run must be
    continued), and whether this call kept it (False: the same signal was kept before)."""

    run_id: str
    name: str
    status: str
    stored: bool
    call: str | None = None
    """The tool call the signal was addressed to, when it is an approval (chainrt/agent/_approvals.py)."""

    @property
    def parked(self) -> bool:
        """True when the run was waiting when the signal was kept: it must be continued."""
        return self.status == "waiting"


def stored_waits(spec: Mapping[str, Any]) -> Iterator[tuple[str, WaitSpec]]:
    """Every ``wait`` step of a stored (normalised) spec at any depth: its id and its wait."""
    for step, _ in data_steps(spec.get("steps")):
        wait = step.get("wait")
        if isinstance(wait, Mapping):
            yield str(step.get("id")), WaitSpec.model_validate(dict(wait))


async def parked_wait(store: CheckpointStore, record: RunRecord) -> WaitSpec | None:
    """The wait a ``waiting`` run is parked at, else None: the step ``stopped_at`` names, or
    (parked inside a ``switch`` branch, where ``stopped_at`` names the group) the wait whose
    record says it is waiting."""
    if record.status != "waiting" or not record.stopped_at:
        return None
    waits = dict(stored_waits(record.spec))
    found = waits.get(record.stopped_at)
    if found is not None:
        return found
    for path, step in (await store.get_steps(record.run_id)).items():
        wait = waits.get(path.rsplit(".", 1)[-1])
        if wait is not None and step.status == "waiting":
            return wait
    call = await parked_approval(store, record)  # an agent's call waits for its approval
    return None if call is None else call.wait


async def send_signal(store: CheckpointStore, run_id: str, name: str, payload: Any) -> SignalSent:
    """Check signal ``name`` with ``payload`` against run ``run_id``'s waits and keep it.

    SignalRefused (nothing kept) when the run's chain has no wait for ``name``, the payload does
    not fit that wait's schema, or the run has ended; RunNotFound when there is no such run.
    """
    if not isinstance(name, str) or not SIGNAL_NAME.match(name):
        raise SignalRefused(f"a signal name must match [A-Za-z0-9_][A-Za-z0-9_.-]*, got {name!r}")
    payload = payload_json(payload)
    record = await store.get_run(run_id)
    call = await parked_approval(store, record, name)
    if call is not None:  # addressed to the call that waits for it (chainrt/agent/_approvals.py)
        kept = await keep_approval(store, run_id, call, payload)
        return SignalSent(run_id, name, kept.status, kept.stored, call.path)
    waits = [wait for _, wait in stored_waits(record.spec)]
    matching = [wait for wait in waits if wait.signal == name]
    if not matching:
        refuse_early(record, name)
        known = ", ".join(sorted({w.signal for w in waits})) or "none"
        raise SignalRefused(
            f"chain {record.chain!r} of run {run_id!r} has no wait for signal {name!r} "
            f"(its waits' signals: {known})",
            conflict=True,
        )
    for wait in matching:
        problem = payload_problem(wait, payload)
        if problem is not None:
            raise SignalRefused(
                f"the payload of signal {name!r} does not match the wait's schema: {problem}; "
                f"run {run_id!r} keeps waiting"
            )
    kept = await store.put_signal(run_id, SignalRecord(name=name, payload=payload))
    return SignalSent(run_id, name, kept.status, kept.stored)


async def continue_parked(
    store: CheckpointStore,
    result: RunResult,
    resume: Callable[[str], Awaitable[RunResult]],
) -> RunResult:
    """After a run parked: when its signal was kept meanwhile (the crossing in the module's
    docstring), continue it with ``resume`` at once; else return ``result`` as it is."""
    for _ in range(_MAX_CONTINUES):
        if result.status != "waiting":
            return result
        record = await store.get_run(result.run_id)
        wait = await parked_wait(store, record)
        if wait is None or await store.get_signal(result.run_id, wait.signal) is None:
            return result
        try:
            result = await resume(result.run_id)
        except StoreUnavailable:
            raise
        except (RunLocked, CheckpointError):
            # The sender's side took it first (claim is a compare-and-set): it continues it.
            record = await store.get_run(result.run_id)
            return RunResult.from_records(record, await store.get_steps(result.run_id))
    return result


async def waits_on(store: CheckpointStore, sent: SignalSent) -> RunRecord | None:
    """The run's record when ``sent`` found it parked at a wait for that very signal (it must be
    continued now), else None (running, queued, or parked at another wait: it finds the signal
    when it reaches that wait)."""
    if not sent.parked:
        return None
    record = await store.get_run(sent.run_id)
    if sent.call is not None:  # an approval: continue while that call still waits for it
        return record if await parked_approval(store, record, sent.name, sent.call) else None
    wait = await parked_wait(store, record)
    return record if wait is not None and wait.signal == sent.name else None


_EXAMPLE: dict[str, Any] = {
    "str": "...",
    "int": 0,
    "float": 0.0,
    "bool": True,
    "list": [],
    "dict": {},
    "any": None,
}


def example_payload(wait: WaitSpec) -> Any:
    """A payload of the right shape for ``wait`` (shown in the CLI's hint and the dashboard)."""
    if wait.payload is None:
        return {} if wait.json_schema is not None else None
    return {name.removesuffix("?"): _EXAMPLE[kind] for name, kind in wait.payload.items()}


def parked_detail(record: RunRecord, steps: Mapping[str, StepRecord]) -> dict[str, Any] | None:
    """What a ``waiting`` run waits for, for people: the signal, the step (its path), the
    payload's JSON Schema and an example, and when the wait began and times out (None when
    the run is not parked)."""
    if record.status != "waiting":
        return None
    approval = approval_detail(record, steps)
    if approval is not None:
        return approval
    waits = dict(stored_waits(record.spec))
    for path, step in steps.items():
        wait = waits.get(path.rsplit(".", 1)[-1])
        parked = step.output if isinstance(step.output, dict) else {}
        if wait is None or step.status != "waiting":
            continue
        return {
            "signal": wait.signal,
            "step": path,
            "schema": wait.payload_schema(),
            "example": example_payload(wait),
            "since": parked.get("since"),
            "until": parked.get("until"),
            "on_timeout": wait.on_timeout,
        }
    return None
