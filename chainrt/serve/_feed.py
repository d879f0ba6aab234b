"""``GET /v1/events/runs``: the runs list, live (Server-Sent Events).

One :class:`RunsFeed` per ``chainrt serve`` process, shared by every client of the stream. It
learns that a run changed from three sources and reads the run's row from the store to tell it:

- this process: a submit, a cancel, and the ``run_started`` / ``run_finished`` events of the runs
  it executes (the runtime's event sinks);
- other processes on the same Redis: each runner publishes the same notices on the pub/sub
  channel ``chainrt:run-changes`` (``{"run_id", "status"}``), which the feed subscribes to;
- a bounded poll of the store: every ``poll_s`` the newest ``window`` runs are read and compared
  with what the feed knows. It catches runs made without a runner (``chainrt run`` on the same
  store) and notices lost while pub/sub was down. A run outside that window whose change nobody
  announced is not told (the list's next full read shows it).

A change is told once per (run, status): ``created`` the first time the feed sees a run (after
the baseline it reads when it starts), ``status`` when its status differs from the last told.

Events get ids ``<generation>-<seq>``; the last :data:`KEEP` are kept, so a client that
reconnects with ``Last-Event-ID`` gets what it missed. An id of another generation (the feed was
restarted, or the client now talks to another runner) or one too old gets a ``reload`` event
instead: the client reads the list again. The feed runs while some client listens, and
``linger_s`` after the last one left (so that a reconnect can catch up).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from .._errors import ChainRTError, RunNotFound
from .._events import RunEvent
from .._records import RunRecord
from ._supervise import LoopHealth, supervise

__all__ = ["KEEP", "RunsFeed", "parse_notice", "row"]

log = logging.getLogger("chainrt.serve")

KEEP = 1000
"""Events kept for clients that reconnect with ``Last-Event-ID``."""
_KNOWN = 20_000
"""Runs whose last told status the feed remembers (oldest forgotten first)."""
_FINAL = frozenset({"completed", "partial", "rejected", "failed", "cancelled"})

Item = tuple[int, str, dict[str, Any]]
"""One SSE event: sequence number (its id is ``<generation>-<seq>``), event type, data."""


def row(run: RunRecord, status: str | None = None) -> dict[str, Any]:
    """The fields of a runs-list row (those of ``GET /v1/runs``; its ``reason`` is the run's
    error here: why a queued run waits is worked out by ``GET /v1/runs`` only)."""
    return {
        "run_id": run.run_id,
        "chain": run.chain,
        "status": status or run.status,
        "budget": {"total_ms": run.budget_total_ms, "used_ms": run.budget_used_ms},
        "created_at": run.created_at,
        "updated_at": run.updated_at,
        "reason": run.error,
    }


class RunsFeed:
    """The shared source of the runs-list stream (see the module docstring).

    ``store`` is the runtime's store; ``bus_url`` the Redis URL whose ``chainrt:run-changes``
    channel is heard (None on SQLite)."""

    def __init__(
        self,
        store: Any,
        *,
        bus_url: str | None = None,
        poll_s: float = 2.0,
        window: int = 100,
        heartbeat_s: float = 15.0,
        linger_s: float = 60.0,
    ) -> None:
        self.store = store
        self.bus_url = bus_url
        self.poll_s = poll_s
        self.window = window
        self.heartbeat_s = heartbeat_s
        self.linger_s = linger_s
        self.generation = ""
        self._seq = 0
        self._kept: collections.deque[Item] = collections.deque(maxlen=KEEP)
        self._known: collections.OrderedDict[str, tuple[str, float]] = collections.OrderedDict()
        self._clients: set[asyncio.Queue[Item | None]] = set()
        self._notices: asyncio.Queue[tuple[str, str | None]] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self.health = LoopHealth("feed")
        """The feed's loops, supervised: any exception starts them again (``_supervise``)."""
        self._ready: asyncio.Event | None = None
        self._stopper: asyncio.Task[None] | None = None
        self._closed = False

    # ------------------------------------------------------------------ notices

    def notify(self, run_id: str, status: str | None = None) -> None:
        """``run_id`` changed (``status``: its new status when the caller knows it). Never
        blocks; ignored while no client listens."""
        if self._tasks:
            self._notices.put_nowait((run_id, status))

    def observe(self, event: RunEvent) -> None:
        """A runtime event sink: ``run_started`` and ``run_finished`` become notices."""
        if event.type == "run_started":
            self.notify(event.run_id, "running")
        elif event.type == "run_finished":
            status = event.data.get("status")
            self.notify(event.run_id, status if isinstance(status, str) else None)

    @property
    def running(self) -> bool:
        """True while the feed's tasks run (some client listens)."""
        return bool(self._tasks)

    # ------------------------------------------------------------------ clients

    async def stream(self, last_event_id: str | None) -> AsyncIterator[bytes]:
        """One client's SSE body: what it missed (or ``reload``), then live events, with a
        comment as heartbeat every ``heartbeat_s``. Ends when the feed closes."""
        if self._closed:
            return
        queue: asyncio.Queue[Item | None] = asyncio.Queue()
        self._clients.add(queue)
        try:
            await self._start()
            first = self._catch_up(last_event_id)
            sent = first[-1][0] if first else self._seq  # what the queue repeats is skipped
            yield b"retry: 2000\n\n"
            for told in first:
                yield self._frame(told)
            while True:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow the cancel of a
                # client that left or of a server that stops, and the task would never end.
                try:
                    async with asyncio.timeout(self.heartbeat_s):
                        item = await queue.get()
                except TimeoutError:
                    yield b": keep-alive\n\n"
                    continue
                if item is None:
                    return
                if item[0] > sent:
                    sent = item[0]
                    yield self._frame(item)
        finally:
            self._clients.discard(queue)
            if not self._clients and self._tasks and not self._closed:
                self._stopper = asyncio.ensure_future(self._stop_later())

    def _catch_up(self, last_event_id: str | None) -> list[Item]:
        """The events after ``last_event_id`` if they are all kept, else one ``reload``."""
        generation, _, seq = (last_event_id or "").partition("-")
        if last_event_id and generation == self.generation and seq.isdigit():
            after = int(seq)
            oldest = self._kept[0][0] if self._kept else self._seq + 1
            if oldest - 1 <= after <= self._seq:
                return [item for item in self._kept if item[0] > after]
        why = "the events since Last-Event-ID are not kept here" if last_event_id else "new"
        return [(self._seq, "reload", {"reason": why})]

    def _frame(self, item: Item) -> bytes:
        seq, kind, data = item
        body = json.dumps(data, ensure_ascii=False)
        return f"id: {self.generation}-{seq}\nevent: {kind}\ndata: {body}\n\n".encode()

    def _tell(self, kind: str, data: dict[str, Any]) -> None:
        self._seq += 1
        item = (self._seq, kind, data)
        self._kept.append(item)
        for client in list(self._clients):
            if client.qsize() >= KEEP:  # a client that does not read: its stream ends; it
                self._clients.discard(client)  # reconnects and catches up (or reloads)
                client.put_nowait(None)
            else:
                client.put_nowait(item)

    # ------------------------------------------------------------------ lifetime

    async def _stop_later(self) -> None:
        """The last client left: keep the feed (and its kept events) ``linger_s`` for a
        reconnect, then stop."""
        await asyncio.sleep(self.linger_s)
        if not self._clients:
            self._stopper = None
            await self._stop()

    async def _start(self) -> None:
        if self._stopper is not None:
            self._stopper.cancel()
            self._stopper = None
        if self._tasks:
            if self._ready is not None:
                await self._ready.wait()
            return
        self.generation = uuid.uuid4().hex[:8]
        self._seq = 0
        self._kept.clear()
        self._known.clear()
        self._notices = asyncio.Queue()
        self._ready = ready = asyncio.Event()
        self._tasks = [asyncio.ensure_future(supervise(self.health, lambda: self._work(ready)))]
        if self.bus_url is not None:
            url = self.bus_url
            self._tasks.append(
                asyncio.ensure_future(supervise(self.health, lambda: self._hear(url)))
            )
        await ready.wait()

    async def _stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task

    async def close(self) -> None:
        """End every client's stream and stop (the server shuts down)."""
        self._closed = True
        for client in self._clients:
            client.put_nowait(None)
        if self._stopper is not None:
            self._stopper.cancel()
            with contextlib.suppress(BaseException):
                await self._stopper
            self._stopper = None
        await self._stop()

    # ------------------------------------------------------------------ the feed's work

    async def _work(self, ready: asyncio.Event) -> None:
        try:
            await self._poll(baseline=True)
        except (ChainRTError, OSError) as exc:
            log.warning("runs feed: the first read of the store failed (%s)", exc)
        ready.set()
        next_poll = time.monotonic() + self.poll_s
        while True:
            notice: tuple[str, str | None] | None = None
            if not self._notices.empty():
                notice = self._notices.get_nowait()  # notices first, in the order told
            elif (wait := next_poll - time.monotonic()) > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):  # not wait_for: see stream()
                        notice = await self._notices.get()
            try:
                if notice is None:
                    next_poll = time.monotonic() + self.poll_s
                    await self._poll(baseline=False)
                else:
                    await self._look(*notice)
                self.health.ok()
            except (ChainRTError, OSError) as exc:
                # One line per outage, not per poll; /health/ready names the feed meanwhile.
                if self.health.failed(exc).log:
                    log.warning(
                        "runs feed: reading the store failed (%s); again every %gs until it works",
                        exc,
                        self.poll_s,
                    )

    async def _poll(self, *, baseline: bool) -> None:
        runs: list[RunRecord] = await self.store.list_runs(limit=self.window)
        for run in reversed(runs):  # oldest first: "created" events in creation order
            if baseline:
                self._remember(run.run_id, run.status, run.updated_at)
            else:
                self._compare(run, None)

    async def _look(self, run_id: str, status: str | None) -> None:
        try:
            run = await self.store.get_run(run_id)
        except RunNotFound:
            return
        self._compare(run, status)

    def _compare(self, run: RunRecord, status: str | None) -> None:
        """Tell ``run`` if its status (``status``, or the record's) was not told yet."""
        now = status or run.status
        known = self._known.get(run.run_id)
        if known is None:
            self._remember(run.run_id, now, run.updated_at)
            self._tell("run", {"change": "created", **row(run, now)})
            return
        told, told_at = known
        if now == told:
            return
        if status is None and run.updated_at < told_at:
            return  # a read older than what was told already
        if status == "queued" and told != "queued":
            return  # a late "created" notice: the run has moved on
        if status == "running" and told in _FINAL and run.status in _FINAL:
            return  # a late "started" notice (or a resume that has ended again): not running
        self._remember(run.run_id, now, max(run.updated_at, told_at))
        self._tell("run", {"change": "status", **row(run, now)})

    def _remember(self, run_id: str, status: str, updated_at: float) -> None:
        self._known[run_id] = (status, updated_at)
        self._known.move_to_end(run_id)
        while len(self._known) > _KNOWN:
            self._known.popitem(last=False)

    async def _hear(self, url: str) -> None:
        from .._bus import runs_channel, subscribe

        async for data in subscribe(url, runs_channel()):
            notice = parse_notice(data)
            if notice is not None:
                self._notices.put_nowait(notice)


def parse_notice(data: bytes) -> tuple[str, str | None] | None:
    """A ``chainrt:run-changes`` message as ``(run_id, status)``; None (logged) if it is not."""
    try:
        raw = json.loads(data)
    except ValueError:
        raw = None
    if isinstance(raw, dict) and isinstance(raw.get("run_id"), str):
        status = raw.get("status")
        return raw["run_id"], status if isinstance(status, str) else None
    log.warning("runs feed: skipping a malformed notice %r", data[:80])
    return None
