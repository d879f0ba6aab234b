"""One ``chainrt serve`` process: a Runtime, the chains it serves, and its share of the queue.

The HTTP handlers only write: a submit creates the run record (status ``queued``) and adds a
queue entry; the runner's take loop starts runs from the queue, at most ``max_runs`` at once, and
acknowledges an entry when its run is final (``_handling`` handles one entry). The orphan loop
claims entries whose runner stopped touching them; the maintenance loop touches the entries of
the runs in flight and tells the fleet which chains this runner serves. Each loop is supervised
(``_supervise``): any exception starts it again with backoff, and ``/health/ready`` names a loop
while it is down. On SIGTERM the runner
drains: it takes nothing more, each run stops at its next step boundary (or is stopped when the
drain time is up), gives its lease back and its entry is handed back for another runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
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
    RunNotFound,
    StoreUnavailable,
)
from .._events import RunEvent
from .._records import RunRecord, StepRecord
from .._result import RunResult
from .._run import RunInterceptor, StepCall, StepStart
from .._runner import check_inputs
from .._runtime import Runtime
from ..runs._lease import owner_state, this_host
from ..spec._dump import spec_dump, spec_json
from ._chains import load_chain_dir
from ._feed import RunsFeed
from ._handling import Draining, EntryHandler
from ._models import ServeConfig, SubmitRequest
from ._queue import Delivery, Entry, LocalQueue, RedisQueue, RunQueue
from ._queue_dead import dead_letter_book
from ._signal_api import waits_loop
from ._streams import StreamSlots
from ._submitted import JustSubmitted
from ._supervise import LoopHealth, supervise
from ._tool_fence import ToolFence
from ._watch import Told, Watchers

__all__ = ["LOOPS", "Draining", "Service", "SubmitOutcome", "UnknownChain"]

log = logging.getLogger("chainrt.serve")

LOOPS = ("take", "orphans", "maintenance")
"""The runner's supervised background loops (named in ``/health/ready`` and ``/metrics``)."""
_SERVED_CACHE_S = 1.0


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
        self._reserved = 0  # slots the take loop holds while it reads (the orphan loop waits)
        self.loops = {name: LoopHealth(name) for name in LOOPS}
        self.dead_lettered = 0
        """Entries this runner moved to the dead letters."""
        self._served: tuple[float, set[str] | None] = (float("-inf"), None)
        self._handler = EntryHandler(self)
        self.submitted = JustSubmitted()
        """Records of runs submitted here, for this server's taker (not read back)."""
        self._publisher: Any = None
        self.tool_fence: ToolFence | None = None
        """On Redis: the fleet-wide fence of cancelled runs' abandoned sync tools."""
        self.feed = RunsFeed(None)  # the runs list, live (its store is set in start())
        self.loops["feed"] = self.feed.health  # supervised too, named in /health/ready
        self.loops["waits"] = LoopHealth("waits")  # waiting runs whose timeout passed (_signal_api)
        self.watchers = Watchers()  # runs' event streams and ?wait= (started in start())
        self.streams = StreamSlots(config.max_streams)  # the cap on open event streams
        self.started_at = time.time()

    # ------------------------------------------------------------------ lifetime

    async def start(self) -> None:
        """Open the runtime, load the chains, pick the queue, start the loops."""
        await self.runtime.open()
        self.load_chains()
        if self.redis:
            from .._bus import EventPublisher

            self.queue = RedisQueue(
                self.runtime.store.raw_url,
                self.consumer,
                orphan_idle_s=self.config.orphan_idle_s,
                chains=sorted(self.chains),
                max_deliveries=self.config.max_deliveries,
            )
            self._publisher = EventPublisher(self.runtime.store.raw_url)
            self.tool_fence = ToolFence(self.runtime.store.raw_url, self.runtime.runner.lease_ttl_s)
            self.runtime.event_sinks.append(self._publisher.publish)
            self.feed.bus_url = self.runtime.store.raw_url
        else:
            # Dead letters in the SQLite file: a restarted runner still shows them.
            letters = dead_letter_book(self.runtime.store.raw_url)
            self.queue = LocalQueue(retry_after_s=self.config.orphan_idle_s, letters=letters)
            self.queue.max_deliveries = self.config.max_deliveries
            await self._recover_local()
        self.feed.store = self.runtime.store
        self.runtime.event_sinks.append(self.feed.observe)
        await self.watchers.start(self.runtime, self.runtime.store.raw_url if self.redis else None)
        bodies = {
            "take": self._take_loop,
            "orphans": self._orphan_loop,
            "maintenance": self._maintenance_loop,
        }
        self._tasks = [
            asyncio.ensure_future(supervise(self.loops[name], body))
            for name, body in bodies.items()
        ]
        waits = functools.partial(waits_loop, self)
        self._tasks.append(asyncio.ensure_future(supervise(self.loops["waits"], waits)))

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
        if self.tool_fence is not None:
            await self.tool_fence.close()
        await self.watchers.close()
        with contextlib.suppress(Exception):
            await self.queue.close()
        await self.runtime.aclose()

    def load_chains(self) -> None:
        """Load every chain file under the chains directory. Files that are no chain (such as a
        pool file) are skipped, logged and named in ``chain_errors``; two files with the same
        chain name are refused (SpecError naming both)."""
        root = Path(self.config.chains)
        self.chains, self.chain_errors = load_chain_dir(root)
        for error in self.chain_errors:
            log.warning("chain file skipped: %s", error)

    async def ready(self) -> tuple[bool, str]:
        """Readiness: the store answers and chains are loaded."""
        if self.draining:
            return False, "draining"
        if not self.chains:
            return False, f"no chains loaded from {self.config.chains}"
        down = [health.describe() for health in self.loops.values() if not health.up]
        if down:
            return False, "; ".join(down)
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
                await self.queue.put(Entry(existing.run_id, chain=chain.name), request.priority)
            return SubmitOutcome("existing", existing)
        self.submitted.keep(record)  # before the entry: the taker may run before put returns
        try:
            await self._queue_new(record, request)
        except BaseException:
            self.submitted.forget(record.run_id)
            raise
        self._changed(record.run_id, "queued")
        return SubmitOutcome("created", record)

    async def _queue_new(self, record: RunRecord, request: SubmitRequest) -> None:
        """Add the entry of a run just recorded. When Redis refuses (a dropped connection), it
        is sent again once; when that fails too, the run is marked failed (not left ``queued``
        with no entry) and StoreUnavailable says so (a 503)."""
        entry = Entry(record.run_id, chain=record.chain)
        try:
            await self.queue.put(entry, request.priority)
            return
        except Exception as exc:
            first = exc
        await asyncio.sleep(0.1)
        try:
            await self.queue.put(entry, request.priority)
            return
        except Exception as exc:
            first = exc
        reason = f"the run was recorded but could not be queued ({type(first).__name__}: {first})"
        with contextlib.suppress(Exception):
            await self._handler.mark_failed(record.run_id, reason)
        raise StoreUnavailable(f"{reason}; it was marked failed: submit it again") from None

    async def result(self, run_id: str, wait_s: float = 0.0) -> RunResult:
        """The run as ``--json`` shows it; with ``wait_s``, once final or when the wait ends
        (woken by the run's final event, not by polling)."""
        found = await self._result(run_id, wait_s)
        return found.result() if isinstance(found, Told) else found

    async def result_json(self, run_id: str, wait_s: float = 0.0) -> dict[str, Any]:
        """:meth:`result` as JSON data (``model_dump(mode="json")``); a result its run told
        this process is handed on as it came, not validated and dumped again."""
        found = await self._result(run_id, wait_s)
        return dict(found.data) if isinstance(found, Told) else found.model_dump(mode="json")

    async def _result(self, run_id: str, wait_s: float) -> RunResult | Told:
        store = self.runtime.store
        steps = None
        if wait_s > 0:
            waited = await self.watchers.wait_final(run_id, wait_s)
            if isinstance(waited, Told):  # told by its run_finished here: nothing read
                return waited
            record, steps = waited
        else:
            record = await store.get_run(run_id)
        if steps is None:
            steps = await store.get_steps(run_id)
        return RunResult.from_records(record, steps)

    async def cancel(self, run_id: str) -> RunResult:
        """Cancel a run (queued: it never starts; running: it stops within a second). A run
        with an owner is fenced first (``_tool_fence``): its resume waits for the tools its
        owner abandons."""
        if self.tool_fence is not None:
            record = await self.runtime.store.get_run(run_id)
            if record.status == "running" and record.owner is not None:
                await self.tool_fence.pending(run_id)
        result = await self.runtime.cancel(run_id)
        self._changed(run_id, None)
        return result

    async def served_chains(self) -> set[str] | None:
        """The chains some live runner of the fleet serves (read at most once a second);
        None with the in-process queue (this runner is the fleet)."""
        at, served = self._served
        if time.monotonic() - at >= _SERVED_CACHE_S:
            served = await self.queue.served()
            self._served = (time.monotonic(), served)
        return served

    async def waiting_reason(self, chain: str) -> str | None:
        """Why a queued run of ``chain`` may wait for ever: no live runner serves its chain
        (None when some does, or when that cannot be known now)."""
        try:
            served = await self.served_chains()
        except Exception:
            return None
        if served is None or chain in served:
            return None
        return f"no live runner serves chain {chain!r}"

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
        await self.queue.put(Entry(run_id, "resume", budget_ms, record.chain), "high")
        return record

    def events(self, run_id: str) -> AsyncIterator[RunEvent]:
        """The run's recorded history, the events of its step in flight, then its live events,
        ending after ``run_finished``."""
        return self.watchers.run_events(run_id)

    # ------------------------------------------------------------------ the runner's loops

    def in_flight(self) -> int:
        """Runs this runner executes now."""
        return len(self._inflight)

    def _free(self) -> int:
        return self.config.max_runs - len(self._inflight) - self._reserved

    async def _take_loop(self) -> None:
        """Fill free slots from the queue (critical first). Supervised: see ``_supervise``."""
        health = self.loops["take"]
        while not self.draining:  # (a second guard besides the cancel of stop())
            if self._free() <= 0:
                self._slot_freed.clear()
                await self._slot_freed.wait()
                continue
            self._reserved += 1  # the orphan loop leaves this slot to the read under way
            try:
                delivery = await self.queue.take(wait_s=self.config.touch_every_s)
            finally:
                self._reserved -= 1
            health.ok()
            if delivery is not None:
                self._spawn(delivery)

    async def _orphan_loop(self) -> None:
        """Claim orphaned entries into free slots, once per touch interval."""
        health = self.loops["orphans"]
        while not self.draining:
            free = self._free()
            if free > 0:
                for orphan in await self.queue.orphans(free):
                    self._spawn(orphan)
            health.ok()
            await asyncio.sleep(self.config.touch_every_s)

    def _spawn(self, delivery: Delivery) -> None:
        key = f"{delivery.stream}:{delivery.priority}:{delivery.entry_id}"
        if key in self._inflight:
            return  # claimed again while this runner still works on it
        task = asyncio.ensure_future(self._handler.handle(delivery))
        self._inflight[key] = (delivery, task)

        def done(_: asyncio.Task[None]) -> None:
            self._inflight.pop(key, None)
            self._slot_freed.set()

        task.add_done_callback(done)

    async def _maintenance_loop(self) -> None:
        """Touch the entries of the runs in flight, so that nobody takes them for orphans, and
        tell the fleet which chains this runner serves."""
        health = self.loops["maintenance"]
        ttl_s = max(5.0, 5 * self.config.touch_every_s)
        while not self.draining:
            await self.queue.touch([d for d, _ in self._inflight.values()])
            await self.queue.announce(sorted(self.chains), ttl_s)
            health.ok()
            await asyncio.sleep(self.config.touch_every_s)

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
                await self.queue.put(Entry(record.run_id, chain=record.chain), "normal")


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
