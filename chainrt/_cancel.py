"""Cancelling a run in the store, from any process (DESIGN §12).

A cancel takes the run over like a resume does — a claim with the next fencing token — and at
once writes status ``cancelled`` and lets go of it. From then on the old owner's writes (its
heartbeat, its next checkpoint) are refused, so nothing of the run is recorded after the cancel,
and a queued run that a runner is about to start fails its own claim and never starts. Telling
the owner to stop at once (instead of at its next write) is the runtime's job: it cancels its
own task, and on Redis it hears of other processes' cancels by pub/sub.
"""

from __future__ import annotations

from ._errors import CheckpointError, FencedOut
from ._lease import new_lease
from .store._protocol import CheckpointStore
from .store._records import RunProgress, RunRecord

__all__ = ["CANCEL_REASON", "cancel_in_store"]

CANCEL_REASON = "cancelled by request"
"""The ``error`` a cancelled run carries."""

_TRIES = 5


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
        progress = RunProgress(
            status="cancelled",
            budget_used_ms=record.budget_used_ms,
            output=record.output,
            error=CANCEL_REASON,
            stopped_at=record.stopped_at,
            release_owner=True,
            waits_ms=record.waits_ms,
        )
        try:
            await store.commit(run_id, token, progress)
        except FencedOut:
            continue
        return await store.get_run(run_id), True
    raise CheckpointError(
        f"run {run_id} changed owner {_TRIES} times while it was being cancelled; try again"
    )
