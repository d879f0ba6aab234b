"""Cancelling a run in the store, from any process (docs/serve.md).

A cancel takes the run over like a resume does — a claim with the next fencing token — and at
once writes status ``cancelled`` and lets go of it. From then on the old owner's writes (its
heartbeat, its next checkpoint) are refused, so nothing of the run is recorded after the cancel,
and a queued run that a runner is about to start fails its own claim and never starts. Telling
the owner to stop at once (instead of at its next write) is the runtime's job: it cancels its
own task, and on Redis it hears of other processes' cancels by pub/sub.

Since the owner can write nothing after the cancel, the canceller writes the figures the owner
would have: the budget used up to the cancel and the step that was in flight, recorded
``cancelled`` (:func:`cancelled_progress`), and when that step is a group, the steps running
inside it (:func:`cancelled_inner`).
"""

from __future__ import annotations

import time

from .._errors import ChainRTError, CheckpointError, FencedOut
from .._records import FINAL_STEP_STATUSES, RunProgress, RunRecord, StepRecord
from .._result_tree import is_group
from ..spec import render_value
from ..store._protocol import CheckpointStore
from ._cancel_inner import inner_in_flight
from ._lease import new_lease

__all__ = ["CANCEL_REASON", "cancel_in_store", "cancelled_inner", "cancelled_progress"]

CANCEL_REASON = "cancelled by request"
"""The ``error`` a cancelled run carries (and the step it stopped in flight)."""

_TRIES = 5


def _in_flight(before: RunRecord, steps: dict[str, StepRecord]) -> str | None:
    """The chain's step being run: the first one without a final record (the runner goes on
    only past ``completed`` and ``skipped`` steps); None when every step has one."""
    for spec_step in before.spec.get("steps", []):
        step_id = spec_step.get("id") if isinstance(spec_step, dict) else None
        if isinstance(step_id, str):
            record = steps.get(step_id)
            if record is None or record.status not in FINAL_STEP_STATUSES:
                return step_id
    return None


def cancelled_progress(
    before: RunRecord, steps: dict[str, StepRecord], now: float
) -> tuple[RunProgress, StepRecord | None]:
    """What a cancel at ``now`` (unix seconds) writes (pure): the run's progress and the record
    of the step it stopped in flight (None: no step was in flight).

    ``before`` is the run as read before the cancel's claim, ``steps`` its step records as read
    after it (no owner writes any more). A run executing under a live lease has used its
    ``budget_used_ms`` at its last write (``updated_at``: a checkpoint, or the claim that started
    the execution) plus the time since; its first step without a final record was in flight:
    it is recorded ``cancelled``, from the start of its ``running`` record (a tool that takes
    ``ctx``; its attempts kept, so a resume counts on) or else from that last write. A queued
    run, or one whose owner's lease ran out (it crashed), used nothing more and had nothing in
    flight.
    """
    owner = before.owner
    live = before.status == "running" and owner is not None and owner.expires_at > now
    used_ms = before.budget_used_ms
    stopped_at = before.stopped_at
    step: StepRecord | None = None
    if live:
        used_ms += max(0.0, now - before.updated_at) * 1000
        stopped_at = _in_flight(before, steps)
        if stopped_at is not None:
            step = _cancelled_step(stopped_at, steps.get(stopped_at), before.updated_at, now)
    progress = RunProgress(
        status="cancelled",
        budget_used_ms=used_ms,
        output=before.output,
        error=CANCEL_REASON,
        stopped_at=stopped_at,
        release_owner=True,
        waits_ms=before.waits_ms,
    )
    return progress, step


def _cancelled_step(
    step_id: str, record: StepRecord | None, last_write: float, now: float
) -> StepRecord:
    if record is not None and record.status == "running":
        started = record.started_at or last_write
        base = record
    else:  # not started yet as far as the store knows (or a record of an earlier execution)
        started = last_write
        base = StepRecord(step_id=step_id, status="cancelled")
    return base.model_copy(
        update={
            "status": "cancelled",
            "error": CANCEL_REASON,
            "started_at": started,
            "finished_at": now,
            "elapsed_ms": max(0.0, now - started) * 1000,
        }
    )


def cancelled_inner(
    before: RunRecord, steps: dict[str, StepRecord], group_id: str, now: float
) -> list[StepRecord]:
    """The records of the steps that were running inside the chain's step ``group_id`` (when
    it is a group, :mod:`chainrt.runs._cancel_inner`), each ``cancelled`` as the step itself is
    (pure). A top-level ``map``'s items are counted from its list, rendered against the run's
    input and recorded outputs (unknown when that fails: its items are those recorded)."""
    group = next(
        (
            s
            for s in before.spec.get("steps", [])
            if isinstance(s, dict) and s.get("id") == group_id
        ),
        None,
    )
    if group is None or not is_group(group):
        return []
    items: int | None = None
    if group.get("map"):
        scope = {
            "input": before.input,
            "steps": {k: {"output": r.output} for k, r in steps.items() if "." not in k},
            "run_id": before.run_id,
        }
        try:
            listed = render_value(group["map"], scope)
        except ChainRTError:
            listed = None
        items = len(listed) if isinstance(listed, list) else None
    return [
        _cancelled_step(path, steps.get(path), before.updated_at, now)
        for path in inner_in_flight(group, group_id, steps, items)
    ]


async def cancel_in_store(
    store: CheckpointStore, run_id: str, *, host: str, ttl_s: float
) -> tuple[RunRecord, bool]:
    """Mark ``run_id`` cancelled unless it already ended; return its record and whether this
    call cancelled it. RunNotFound if there is no such run."""
    for _ in range(_TRIES):
        record = await store.get_run(run_id)
        if record.finished:
            return record, False
        token = record.fencing_token + 1
        try:
            await store.claim(run_id, record.fencing_token, new_lease(host, token, ttl_s))
        except FencedOut:
            continue  # a runner claimed it in between: read again, claim after it
        except CheckpointError:
            return await store.get_run(run_id), False  # completed in between
        # Read after the claim: a step the owner wrote since the first read is not "in flight".
        steps = await store.get_steps(run_id) if record.status == "running" else {}
        now = time.time()
        progress, step = cancelled_progress(record, steps, now)
        inner = [] if step is None else cancelled_inner(record, steps, step.step_id, now)
        try:
            # A group in flight: its running inner steps first (the run still ``running``,
            # its lease the canceller's), then the group and the run's end in one commit.
            going = progress.model_copy(update={"status": "running", "release_owner": False})
            for inner_step in inner:
                await store.commit(run_id, token, going, inner_step)
            await store.commit(run_id, token, progress, step)
        except FencedOut:
            continue
        return await store.get_run(run_id), True
    raise CheckpointError(
        f"run {run_id} changed owner {_TRIES} times while it was being cancelled; try again"
    )
