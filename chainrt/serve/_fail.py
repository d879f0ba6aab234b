"""Marking a run ``failed`` with a reason, from a runner that never ran it (a run refused or
dead-lettered): the same claim-then-commit as a cancel (``chainrt.runs._cancel``), so a runner that
owns the run meanwhile keeps it (the fencing token decides)."""

from __future__ import annotations

from .._errors import CheckpointError, FencedOut
from .._records import RunProgress, RunRecord
from ..runs._lease import new_lease
from ..store._protocol import CheckpointStore

__all__ = ["fail_in_store"]

_TRIES = 3


async def fail_in_store(
    store: CheckpointStore, run_id: str, reason: str, *, host: str, ttl_s: float
) -> RunRecord | None:
    """Mark ``run_id`` failed with ``reason`` unless it already ended or someone else claims it
    meanwhile; the record written, or None when it was left as it was. Store errors (the record
    unreadable, Redis away) are raised."""
    for _ in range(_TRIES):
        record = await store.get_run(run_id)
        if record.finished:
            return None
        token = record.fencing_token + 1
        try:
            await store.claim(run_id, record.fencing_token, new_lease(host, token, ttl_s))
        except FencedOut:
            continue
        except CheckpointError:
            return None  # ended in between
        progress = RunProgress(
            status="failed",
            budget_used_ms=record.budget_used_ms,
            output=record.output,
            error=reason,
            stopped_at=record.stopped_at,
            release_owner=True,
            waits_ms=record.waits_ms,
        )
        try:
            await store.commit(run_id, token, progress)
        except FencedOut:
            continue
        return await store.get_run(run_id)
    return None
