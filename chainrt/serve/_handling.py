"""Handling one queue entry of ``chainrt serve``: start, take over or resume its run, and
sort what goes wrong.

A failure that may pass by itself (the store or Redis away) leaves the entry pending: it is
claimed again as an orphan. A failure that will not change (the entry is no entry, the record
cannot be read, a bug) is counted; once the entry has been delivered ``max_deliveries`` times it
goes to the dead letters with the reason and its run is marked ``failed``. A run this runner's
trust rules refuse is marked ``failed`` with the reason at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import timedelta
from typing import TYPE_CHECKING

from .._errors import (
    ChainRTError,
    FencedOut,
    RunLocked,
    RunNotFound,
    StoreUnavailable,
    UntrustedRecord,
)
from .._records import RunRecord
from .._run._tool import sync_tools_running
from ..runs._lease import owner_state, this_host
from ._fail import fail_in_store
from ._queue import Delivery, Entry

if TYPE_CHECKING:
    from ._service import Service

__all__ = ["Draining", "EntryHandler", "PoisonEntry", "passing"]

log = logging.getLogger("chainrt.serve")


class Draining(ChainRTError):
    """This runner is shutting down: the run stops at a step boundary and is handed over."""


class PoisonEntry(ChainRTError):
    """A queue entry that can never be handled (its fields are no entry)."""


class EntryHandler:
    """Handles the entries a :class:`~chainrt.serve.Service` takes (see the module docstring)."""

    def __init__(self, service: Service) -> None:
        self._service = service

    async def handle(self, delivery: Delivery) -> None:
        """Run the entry (:meth:`_run_entry`). A failure that may pass (the store away) leaves
        the entry pending for a later claim; any other goes towards the dead letters."""
        run_id = delivery.entry.run_id if delivery.entry is not None else "?"
        try:
            await self.run_entry(delivery)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if passing(exc):
                log.warning(
                    "run %s: %s: %s; its entry is left for a later claim",
                    run_id,
                    type(exc).__name__,
                    exc,
                )
                return
            await self.failed_for_good(delivery, f"{type(exc).__name__}: {exc}")

    async def failed_for_good(self, delivery: Delivery, reason: str) -> None:
        """Handling failed for a reason that will not change: count the delivery; at the
        limit the entry goes to the dead letters and its run is marked failed."""
        run_id = delivery.entry.run_id if delivery.entry is not None else "?"
        try:
            letter = await self._service.queue.fail(delivery, reason)
        except Exception as exc:
            log.warning("run %s: %s; recording the failure failed too (%s)", run_id, reason, exc)
            return
        if letter is None:
            log.warning(
                "run %s: %s (entry %s left for another try)", run_id, reason, delivery.entry_id
            )
            return
        self._service.dead_lettered += 1
        log.error(
            "run %s: entry %s dead-lettered after %d deliveries: %s",
            run_id,
            delivery.entry_id,
            letter.deliveries,
            reason,
        )
        if delivery.entry is not None:
            with contextlib.suppress(Exception):  # an unreadable record cannot be marked
                await self.mark_failed(run_id, f"dead-lettered: {reason}")

    async def mark_failed(self, run_id: str, reason: str) -> None:
        if await fail_in_store(
            self._service.runtime.store,
            run_id,
            reason,
            host=this_host(),
            ttl_s=self._service.runtime.runner.lease_ttl_s,
        ):
            self._service._changed(run_id, "failed")

    async def run_entry(self, delivery: Delivery) -> None:
        """Start, take over or resume the entry's run; acknowledge the entry when it is final."""
        entry = delivery.entry
        if entry is None:
            fields = ", ".join(f"{k}={v[:40]!r}" for k, v in delivery.raw) or "none"
            raise PoisonEntry(f"the queue entry's fields are no run entry ({fields})")
        # A run submitted here a moment ago starts from the record the submit wrote
        # (_submitted.py). If it changed since (a cancel claimed it), the claim is fenced out:
        # the entry is then handled from the store's record, as any other.
        kept = self._service.submitted.take(entry.run_id)
        if kept is not None and await self._run(delivery, entry, kept):
            return
        await self._run(delivery, entry, None)

    async def _run(self, delivery: Delivery, entry: Entry, record: RunRecord | None) -> bool:
        """:meth:`run_entry` with the run's ``record`` (None: read from the store). False (and
        nothing done) when the record given was stale: its claim was fenced out."""
        store = self._service.runtime.store
        given = record is not None
        try:
            if record is None:
                record = await store.get_run(entry.run_id)
        except RunNotFound:
            log.warning("queue entry for unknown run %s dropped", entry.run_id)
            await self._service.queue.ack(delivery)
            return True
        resume = entry.op == "resume" and record.status != "completed"
        if record.finished and not resume:
            await self._service.queue.ack(delivery)  # done already (or cancelled while queued)
            return True
        if record.status == "running":
            record = await self.outlive_lease(record)
            if record.finished and not resume:
                await self._service.queue.ack(delivery)  # it ended (or was cancelled) meanwhile
                return True
            state = owner_state(record.owner, now=time.time(), host=this_host())
            if record.status == "running" and not state.gone:
                return True  # its owner lives: leave the entry; it is looked at again if orphaned
        if entry.run_id in self._service.runtime.active():
            return True
        await self._fence_tools(entry.run_id, cancelled=record.status == "cancelled")
        stopped = True  # by a cancel or a fence, unless it ends otherwise
        try:
            # The entry holds milliseconds: a timedelta, so nothing reads them as seconds.
            more = None if entry.budget_ms is None else timedelta(milliseconds=entry.budget_ms)
            # A queued run (its first start: nothing to fence) starts from the record just
            # read, not read again; a stale one fails the claim.
            fresh = record if record.status == "queued" else None
            result = await self._service.runtime.resume(
                entry.run_id, budget=more, wait=False, record=fresh
            )
            stopped = result.status == "cancelled"
        except (Draining, asyncio.CancelledError):
            # Stopped at a step boundary (or cut when the drain ended): the runner gave the
            # lease back; the entry goes back for another runner.
            with contextlib.suppress(Exception):
                await asyncio.shield(self._service.queue.hand_back(delivery))
            return True
        except RunLocked:
            stopped = False  # it never ran here: the fence, if any, is not this runner's
            return True  # someone else owns it now; their entry (or this one, later) finishes it
        except FencedOut:
            # Someone else owns it now; their entry (or this one, later) finishes it. Or the
            # record given was stale (a cancel claimed the run): handled again from the store.
            return not given
        except UntrustedRecord as exc:
            # Refused by this runner's trust rules: that will not change by trying again.
            log.warning("run %s refused: %s", entry.run_id, exc)
            await self.mark_failed(entry.run_id, f"refused: {exc.message}")
        finally:
            if self._service.tool_fence is not None:
                self._service.tool_fence.after_run(entry.run_id, stopped=stopped)
        await self._service.queue.ack(delivery)
        return True

    async def _fence_tools(self, run_id: str, *, cancelled: bool) -> None:
        """Wait while a sync tool of the run still runs in this process (abandoned by a cancel
        or a deadline: Python cannot stop a thread), so that a resume never runs the same tool
        twice at once; after a cancel, also while its owner on another runner still runs one
        (``_tool_fence``). The entry stays in flight meanwhile (touched: nobody else takes it)."""
        if cancelled and self._service.tool_fence is not None:
            await self._service.tool_fence.wait_clear(run_id)
        if not sync_tools_running(run_id):
            return
        log.warning("run %s: waiting for its abandoned sync tool to end before resuming", run_id)
        while sync_tools_running(run_id):  # noqa: ASYNC110 -- tool threads change the count
            await asyncio.sleep(0.05)

    async def outlive_lease(self, record: RunRecord) -> RunRecord:
        """Wait out the lease of a running run's owner on another host, if it ends within one
        lease TTL, and return the run's record read again.

        Such an owner's pid cannot be checked, so its run is taken over only once its lease
        expires; leaving the entry until the next orphan scan (``orphan_idle_s`` later, as the
        take reset its idle time) would add up to that much to the takeover. The entry is in
        flight meanwhile, so this runner touches it and no other takes it."""
        owner = record.owner
        if owner is None or owner.host == this_host():
            return record  # no owner, or one whose pid this host can check
        left_s = owner.expires_at - time.time()
        if not 0 < left_s <= self._service.runtime.runner.lease_ttl_s or self._service.draining:
            return record
        await asyncio.sleep(left_s + 0.05)
        return await self._service.runtime.store.get_run(record.run_id)


def passing(exc: BaseException) -> bool:
    """True for a failure that may pass by itself: the store or Redis away for a while."""
    if isinstance(exc, (StoreUnavailable, OSError, TimeoutError)):
        return True
    try:
        from redis import exceptions as rx
    except ImportError:  # pragma: no cover - redis is there whenever the queue is
        return False
    return isinstance(exc, (rx.ConnectionError, rx.TimeoutError, rx.BusyLoadingError))
