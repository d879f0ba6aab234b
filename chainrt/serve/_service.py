"""One ``chainrt serve`` process: a Runtime, the chains it serves, and its share of the queue.

The HTTP handlers only write: a submit creates the run record (status ``queued``) and adds a
queue entry; the runner's take loop starts runs from the queue, at most ``max_runs`` at once, and
acknowledges an entry when its run is final. A maintenance loop touches the entries of the runs
in flight and claims orphans (entries whose runner stopped touching them). On SIGTERM the runner
drains: it takes nothing more, each run stops at its next step boundary (or is stopped when the
drain time is up), gives its lease back and its entry is handed back for another runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from .._chain import Chain
from .._durations import parse_duration_ms
from .._errors import (
    ChainRTError,
    CheckpointError,
    FencedOut,
    InputError,
    RunLocked,
    RunNotFound,
    SpecError,
    StoreUnavailable,
)
from .._events import RunEvent
from .._lease import owner_state, this_host
from .._result import RunResult
from .._run import RunInterceptor, StepCall, StepStart
from .._runner import check_inputs
from .._runtime import Runtime
from ..spec import load_spec
from ..spec._dump import spec_dump, spec_json
from ..store._records import RunRecord, StepRecord
from ._feed import RunsFeed
from ._models import ServeConfig, SubmitRequest
from ._queue import Delivery, Entry, LocalQueue, RedisQueue, RunQueue
from ._watch import run_events

__all__ = ["Draining", "Service", "SubmitOutcome", "UnknownChain"]

log = logging.getLogger("chainrt.serve")


class Draining(ChainRTError):
    """This runner is shutting down: the run stops at a step boundary and is handed over."""


class UnknownChain(ChainRTError):
    """No chain of that name is served here."""


class SubmitOutcome:
    """What a submit did: ``created`` (202), ``existing`` (200, same body) or conflict (409)."""

    def __init__(self, kind: str, run: RunRecord) -> None:
        self.kind = kind
        self.run = run


class _DrainInterceptor(RunInterceptor):
    """Refuses to start a step once the runner drains: the run stops between two steps."""

    def __init__(self, service: Service) -> None:
        self._service = service

    async def execute_step(self, step: StepStart, call_next: StepCall) -> StepRecord:
        if self._service.draining:
            raise Draining(f"runner draining: run {step.run_id} stops before step {step.step.id}")
        return await call_next(step)


class Service:
    """A runner process's state: see the module docstring."""

    def __init__(self, config: ServeConfig, *, runtime: Runtime | None = None) -> None:
        self.config = config
        self.consumer = f"{this_host()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.runtime = runtime or Runtime(
            config.store, config.pool, interceptors=[_DrainInterceptor(self)]
        )
        self.chains: dict[str, Chain] = {}
        self.chain_errors: list[str] = []
        self.queue: RunQueue = LocalQueue()
        self.draining = False
        self._inflight: dict[str, tuple[Delivery, asyncio.Task[None]]] = {}
        self._slot_freed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._publisher: Any = None
        self.feed = RunsFeed(None)  # the runs list, live (its store is set in start())
        self.started_at = time.time()

    # ------------------------------------------------------------------ lifetime

    async def start(self) -> None:
        """Open the runtime, load the chains, pick the queue, start the loops."""
        await self.runtime.open()
        self.load_chains()
        if self.redis:
            from .._bus import EventPublisher

            self.queue = RedisQueue(
                self.runtime.store.raw_url, self.consumer, orphan_idle_s=self.config.orphan_idle_s
            )
            self._publisher = EventPublisher(self.runtime.store.raw_url)
            self.runtime.event_sinks.append(self._publisher.publish)
            self.feed.bus_url = self.runtime.store.raw_url
        else:
            await self._recover_local()
        self.feed.store = self.runtime.store
        self.runtime.event_sinks.append(self.feed.observe)
        self._tasks = [
            asyncio.ensure_future(self._take_loop()),
            asyncio.ensure_future(self._maintenance_loop()),
        ]

    @property
    def redis(self) -> bool:
        """True when the store (and so the queue) is Redis."""
        return self.runtime.store.raw_url.split("://", 1)[0].lower() in ("redis", "rediss")

    async def stop(self, drain_s: float | None = None) -> None:
        """Drain (take nothing more; runs stop at a step boundary, or when ``drain_s`` is up),
        hand their entries back, close everything."""
        drain_s = self.config.drain_s if drain_s is None else drain_s
        self.draining = True
        await self.feed.close()  # runs-list streams end: their clients reconnect elsewhere
        await _end(self._tasks)
        running = [task for _, task in self._inflight.values()]
        if running:
            _, late = await asyncio.wait(running, timeout=drain_s)
            for task in late:
                task.cancel()
            for task in late:
                with contextlib.suppress(BaseException):
                    await task
        if self._publisher is not None:
            await self._publisher.close()
        with contextlib.suppress(Exception):
            await self.queue.close()
        await self.runtime.aclose()

    def load_chains(self) -> None:
        """Load every chain file under the chains directory (files that are no chain, such as a
        pool file, are skipped and named in ``chain_errors``)."""
        root = Path(self.config.chains)
        chains: dict[str, Chain] = {}
        errors: list[str] = []
        files = sorted([*root.glob("*.yaml"), *root.glob("*.yml")]) if root.is_dir() else []
        for path in files:
            try:
                loaded = load_spec(path)
            except SpecError as exc:
                errors.append(str(exc).splitlines()[0])
                continue
            chains[loaded.spec.name] = Chain(
                loaded.spec, source_dir=loaded.source_dir, path=loaded.path
            )
        self.chains, self.chain_errors = chains, errors
        log.info("serving chains %s from %s", ", ".join(sorted(chains)) or "(none)", root)

    async def ready(self) -> tuple[bool, str]:
        """Readiness: the store answers and chains are loaded."""
        if self.draining:
            return False, "draining"
        if not self.chains:
            return False, f"no chains loaded from {self.config.chains}"
        try:
            await self.runtime.store.list_runs(limit=1)
        except ChainRTError as exc:
            return False, f"store: {exc.message}"
        return True, f"{len(self.chains)} chains, store {self.runtime.store.url}"

    # ------------------------------------------------------------------ API operations

    def chain(self, name: str) -> Chain:
        """The served chain ``name``; UnknownChain naming the known ones."""
        chain = self.chains.get(name)
        if chain is None:
            known = ", ".join(sorted(self.chains)) or "none"
            raise UnknownChain(f"no chain named {name!r} is served here (known: {known})")
        return chain

    async def submit(self, request: SubmitRequest) -> SubmitOutcome:
        """Queue a run (see :class:`SubmitOutcome`); InputError for input the chain refuses."""
        chain = self.chain(request.chain)
        inputs = check_inputs(chain.spec, request.input)
        total = (
            chain.spec.budget
            if request.budget is None
            else parse_duration_ms(request.budget, what="budget")
        )
        record = RunRecord(
            run_id=request.run_id or uuid.uuid4().hex,
            chain=chain.name,
            spec=spec_dump(chain.spec),
            source=str(chain.source_dir) if chain.source_dir is not None else None,
            input=inputs,
            status="queued",
            budget_total_ms=total,
        )
        record = self.runtime.runner.trust.sign(record)  # CHAINRT_RECORD_KEY, docs/security.md
        record.attach_spec_json(spec_json(chain.spec))  # the store writes it without serialising
        store = self.runtime.store
        try:
            await store.create_run(record)
        except RunNotFound:
            raise
        except CheckpointError:
            if request.run_id is None:
                raise
            existing = await store.get_run(request.run_id)
            same = (existing.chain, existing.input, existing.budget_total_ms) == (
                record.chain,
                record.input,
                record.budget_total_ms,
            )
            if not same:
                return SubmitOutcome("conflict", existing)
            if existing.status == "queued":
                # The first submit may have died between the record and the entry: queue it
                # again (a second entry is harmless: only one claim of the run can succeed).
                await self.queue.put(Entry(existing.run_id), request.priority)
            return SubmitOutcome("existing", existing)
        await self.queue.put(Entry(record.run_id), request.priority)
        self._changed(record.run_id, "queued")
        return SubmitOutcome("created", record)

    async def result(self, run_id: str, wait_s: float = 0.0) -> RunResult:
        """The run as ``--json`` shows it; with ``wait_s``, once final or when the wait ends."""
        store = self.runtime.store
        deadline = time.monotonic() + wait_s
        pause = 0.02
        while True:
            record = await store.get_run(run_id)
            if record.finished or time.monotonic() >= deadline:
                return RunResult.from_records(record, await store.get_steps(run_id))
            await asyncio.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 2, 0.2)

    async def cancel(self, run_id: str) -> RunResult:
        """Cancel a run (queued: it never starts; running: it stops within a second)."""
        result = await self.runtime.cancel(run_id)
        self._changed(run_id, None)
        return result

    def _changed(self, run_id: str, status: str | None) -> None:
        """Tell the runs list here and (through Redis) on the other runners."""
        self.feed.notify(run_id, status)
        if self._publisher is not None:
            self._publisher.announce(run_id, status)

    async def resume(self, run_id: str, budget: str | float | None) -> RunRecord:
        """Queue a resume of a run that stopped (partial, failed, rejected, cancelled)."""
        record = await self.runtime.store.get_run(run_id)
        if record.status == "completed":
            raise CheckpointError(f"run {run_id} has completed; there is nothing to resume")
        budget_ms = None if budget is None else parse_duration_ms(budget, what="budget")
        await self.queue.put(Entry(run_id, "resume", budget_ms), "high")
        return record

    def events(self, run_id: str) -> AsyncIterator[RunEvent]:
        """The run's recorded history, then its live events, ending after ``run_finished``."""
        return run_events(self.runtime, run_id, redis=self.redis)

    # ------------------------------------------------------------------ the runner's loops

    def in_flight(self) -> int:
        """Runs this runner executes now."""
        return len(self._inflight)

    async def _take_loop(self) -> None:
        """Fill free slots: orphans first (once per touch interval), then the queue."""
        next_orphans = 0.0
        while not self.draining:  # (a second guard besides the cancel of stop())
            free = self.config.max_runs - len(self._inflight)
            if free <= 0:
                self._slot_freed.clear()
                await self._slot_freed.wait()
                continue
            try:
                if time.monotonic() >= next_orphans:
                    next_orphans = time.monotonic() + self.config.touch_every_s
                    for orphan in await self.queue.orphans(free):
                        self._spawn(orphan)
                    continue
                wait_s = max(0.05, next_orphans - time.monotonic())
                delivery = await self.queue.take(wait_s=wait_s)
            except (ChainRTError, OSError, ConnectionError) as exc:
                log.warning("queue read failed (%s); retrying", exc)
                await asyncio.sleep(0.5)
                continue
            if delivery is not None:
                self._spawn(delivery)

    def _spawn(self, delivery: Delivery) -> None:
        key = f"{delivery.priority}:{delivery.entry_id}"
        task = asyncio.ensure_future(self._handle(delivery))
        self._inflight[key] = (delivery, task)

        def done(_: asyncio.Task[None]) -> None:
            self._inflight.pop(key, None)
            self._slot_freed.set()

        task.add_done_callback(done)

    async def _maintenance_loop(self) -> None:
        """Touch the entries of the runs in flight, so that nobody takes them for orphans."""
        while not self.draining:
            await asyncio.sleep(self.config.touch_every_s)
            try:
                await self.queue.touch([d for d, _ in self._inflight.values()])
            except Exception as exc:  # Redis down a moment: the next round tries again
                log.warning("touching queue entries failed: %s: %s", type(exc).__name__, exc)

    async def _recover_local(self) -> None:
        """SQLite: the in-process queue died with the last process; queued runs and runs whose
        owner is gone are queued again from the store."""
        store = self.runtime.store
        for status in ("queued", "running"):
            for record in await store.list_runs(status=status, limit=100_000):
                if status == "running":
                    state = owner_state(record.owner, now=time.time(), host=this_host())
                    if not state.gone:
                        continue
                await self.queue.put(Entry(record.run_id), "normal")

    async def _handle(self, delivery: Delivery) -> None:
        """Start, take over or resume the entry's run; acknowledge the entry when it is final."""
        entry = delivery.entry
        if entry is None:
            log.warning("dropping a malformed queue entry %s", delivery.entry_id)
            await self.queue.ack(delivery)
            return
        store = self.runtime.store
        try:
            record = await store.get_run(entry.run_id)
        except RunNotFound:
            log.warning("queue entry for unknown run %s dropped", entry.run_id)
            await self.queue.ack(delivery)
            return
        resume = entry.op == "resume" and record.status != "completed"
        if record.finished and not resume:
            await self.queue.ack(delivery)  # done already (or cancelled while queued)
            return
        if record.status == "running":
            record = await self._outlive_lease(record)
            if record.finished and not resume:
                await self.queue.ack(delivery)  # it ended (or was cancelled) meanwhile
                return
            state = owner_state(record.owner, now=time.time(), host=this_host())
            if record.status == "running" and not state.gone:
                return  # its owner lives: leave the entry; it is looked at again if orphaned
        if entry.run_id in self.runtime.active():
            return
        try:
            await self.runtime.resume(entry.run_id, budget=entry.budget_ms, wait=False)
        except (Draining, asyncio.CancelledError):
            # Stopped at a step boundary (or cut when the drain ended): the runner gave the
            # lease back; the entry goes back for another runner.
            with contextlib.suppress(Exception):
                await asyncio.shield(self.queue.hand_back(delivery))
            return
        except (RunLocked, FencedOut):
            return  # someone else owns it now; their entry (or this one, later) finishes it
        except StoreUnavailable as exc:
            log.warning("run %s: store unavailable (%s); left for a takeover", entry.run_id, exc)
            return
        except (InputError, ChainRTError) as exc:
            log.warning("run %s could not run: %s", entry.run_id, exc)
        await self.queue.ack(delivery)

    async def _outlive_lease(self, record: RunRecord) -> RunRecord:
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
        if not 0 < left_s <= self.runtime.runner.lease_ttl_s or self.draining:
            return record
        await asyncio.sleep(left_s + 0.05)
        return await self.runtime.store.get_run(record.run_id)


async def _end(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel ``tasks`` and wait for them to end, cancelling again any that go on: a cancel
    that lands as an awaited call completes can be dropped (``asyncio.wait_for`` on Python
    3.11, also inside libraries), and a runner's loop that survives its one cancel never ends."""
    while pending := [task for task in tasks if not task.done()]:
        for task in pending:
            task.cancel()
        await asyncio.wait(pending, timeout=0.1)
    for task in tasks:
        if not task.cancelled():
            task.exception()  # retrieved: a loop that failed is not reported as never awaited
