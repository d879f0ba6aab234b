"""A run's events for ``GET /v1/runs/{id}/events``: its recorded history, the events of its step
in flight, then the live events of whichever runner executes it (in process on SQLite; Redis
pub/sub in a fleet), ending after ``run_finished``. Also what wakes ``GET /v1/runs/{id}?wait=``.

One :class:`Watchers` per ``chainrt serve`` process. On Redis every stream of the process hears
its run through one shared pub/sub connection (:class:`~chainrt._bus.SharedSubscriber`), so a
thousand open streams cost a thousand sockets to their clients and one to Redis.

A watcher never misses what happened before it connected:

1. it subscribes to the run's live events first (confirmed by Redis before going on);
2. it takes the events of the step in flight: from this process if it runs the run
   (:class:`~chainrt.serve._inflight.InFlight`), else from the run's owner, asked on
   ``chainrt:events-replay`` (it answers on the run's channel; :data:`REPLAY_WAIT_S` at most);
3. it reads the recorded history (the run and its step records).

A ``?wait=`` subscribes to nothing of its own: see :meth:`Watchers.wait_final`.

Everything heard twice (an event both replayed and live, a step both recorded and live) is told
once: a step whose record the history holds is told from the record; other events by identity.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from .._events import RunEvent, history
from .._records import RunRecord, StepRecord
from .._result import RunResult
from .._runtime import Runtime
from ._feed import parse_notice
from ._inflight import InFlight, event_key

__all__ = ["REPLAY_WAIT_S", "Told", "Watchers", "parse_replay"]

log = logging.getLogger("chainrt.serve")

_QUIET_S = 2.0
"""After this long without a live event, the store is asked whether the run ended."""
_WAIT_QUIET_S = 0.5
"""The same for ``?wait=`` without Redis (a run cancelled while queued ends with no event)."""
REPLAY_WAIT_S = 1.0
"""How long a watcher of a running run waits for its owner's in-flight events (an owner that
answers does so in one round trip; one that died does not answer)."""


def parse_replay(data: bytes) -> tuple[str, str] | None:
    """A replay request (``{"run_id", "id"}``) as ``(run_id, id)``; None if it is not one."""
    try:
        raw = json.loads(data)
    except ValueError:
        return None
    if (
        isinstance(raw, dict)
        and isinstance(raw.get("run_id"), str)
        and isinstance(raw.get("id"), str)
    ):
        return raw["run_id"], raw["id"]
    return None


class Watchers:
    """The event streams of one process: the in-flight events of its own runs, the shared
    subscription (Redis), and the replies to other processes' replay requests."""

    def __init__(self) -> None:
        self.inflight = InFlight()
        self.runtime: Runtime | None = None
        self._url: str | None = None
        self._subscriber: Any = None
        self._publisher: Any = None
        self._sending: set[asyncio.Task[None]] = set()
        self._waiters: dict[str, set[_Waiter]] = {}
        """The ``?wait=`` requests of each run, woken when it may have ended."""

    async def start(self, runtime: Runtime, redis_url: str | None) -> None:
        """Keep the in-flight events of ``runtime``'s runs; on Redis, answer replay requests."""
        self.runtime = runtime
        runtime.event_sinks.append(self.inflight.observe)
        if redis_url is None:
            return
        from .._bus import SharedSubscriber, cancel_channel, replay_channel, runs_channel

        self._url = redis_url
        self._subscriber = SharedSubscriber(redis_url)
        await self._subscriber.listen(replay_channel(), self._answer)
        # What wakes ?wait= for runs executed elsewhere (see wait_final): heard once per process.
        await self._subscriber.listen(runs_channel(), self._changed)
        await self._subscriber.listen(cancel_channel(), self._cancelled)

    async def close(self) -> None:
        """Close the shared subscription and the publishing connection."""
        if self._subscriber is not None:
            await self._subscriber.close()
        for task in list(self._sending):
            task.cancel()
        if self._publisher is not None:
            with contextlib.suppress(Exception):
                await self._publisher.aclose()

    @property
    def subscriptions(self) -> int:
        """Channels the shared connection hears now (0 without Redis)."""
        return 0 if self._subscriber is None else int(self._subscriber.channels)

    # ------------------------------------------------------------------ the owner's side

    def _answer(self, data: bytes) -> None:
        """A replay request: if this process runs the run, its in-flight events go to the
        run's channel (every watcher there drops what it has already)."""
        request = parse_replay(data)
        if request is None:
            return
        run_id, request_id = request
        events = self.inflight.events(run_id)
        if events is None:
            return
        body = json.dumps({"replay": request_id, "events": [e.to_dict() for e in events]})
        task = asyncio.ensure_future(self._publish(run_id, body))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _publish(self, run_id: str, body: str) -> None:
        from redis import exceptions as rx

        from .._bus import events_channel, publish_client

        if self._publisher is None:
            self._publisher = publish_client(str(self._url))
        try:
            await self._publisher.publish(events_channel(run_id), body)
        except (rx.RedisError, OSError) as exc:
            log.warning("in-flight events of %s not sent to a watcher (%s)", run_id, exc)

    async def _ask_owner(self, run_id: str, request_id: str) -> None:
        from redis import exceptions as rx

        from .._bus import publish_client, replay_channel

        if self._publisher is None:
            self._publisher = publish_client(str(self._url))
        body = json.dumps({"run_id": run_id, "id": request_id})
        try:
            await self._publisher.publish(replay_channel(), body)
        except (rx.RedisError, OSError) as exc:
            log.warning("in-flight events of %s not asked for (%s)", run_id, exc)

    def _changed(self, data: bytes) -> None:
        """A runs-list notice (``chainrt:run-changes``): the waiters of that run look again,
        unless it just became queued or running. Its owner sends it after the run's final
        write; a notice with no status (a cancel asked for) may come before it."""
        if not self._waiters:
            return
        notice = parse_notice(data)
        if notice is not None and notice[1] not in ("queued", "running"):
            self._wake(notice[0], ended=notice[1] is not None)

    def _cancelled(self, data: bytes) -> None:
        """A cancel announced on ``chainrt:cancel`` (its payload is the run id), before the
        run's owner has recorded it."""
        if self._waiters:
            self._wake(data.decode(errors="replace"), ended=False)

    def _wake(self, run_id: str, *, ended: bool) -> None:
        for waiter in self._waiters.get(run_id, ()):
            waiter.wake(ended)

    # ------------------------------------------------------------------ a watcher

    async def _hear(
        self, run_id: str, on_event: Callable[[RunEvent], None], on_replay: Callable[[Any], None]
    ) -> Callable[[], Awaitable[None]]:
        """Hear ``run_id``'s live events (subscribed, confirmed); returns the stop function."""
        runtime = self.runtime
        assert runtime is not None
        if self._subscriber is None:
            runtime.listen(run_id, on_event)

            async def stop_local() -> None:
                runtime.unlisten(run_id, on_event)

            return stop_local
        from .._bus import events_channel, parse_event

        channel = events_channel(run_id)

        def handler(data: bytes) -> None:
            if data.startswith(b'{"replay"'):
                with contextlib.suppress(ValueError):
                    on_replay(json.loads(data))
                return
            event = parse_event(data)
            if event is not None:
                on_event(event)

        if not await self._subscriber.listen(channel, handler):
            log.warning("events of %s: pub/sub not confirmed; the store is read instead", run_id)

        async def stop_remote() -> None:
            await self._subscriber.unlisten(channel, handler)

        return stop_remote

    async def run_events(self, run_id: str) -> AsyncIterator[RunEvent]:
        """The run's recorded history, its in-flight events, then its live events, ending
        after ``run_finished`` (see the module)."""
        runtime = self.runtime
        assert runtime is not None
        live: asyncio.Queue[RunEvent] = asyncio.Queue()
        request_id = uuid.uuid4().hex
        replayed: asyncio.Future[list[RunEvent]] = asyncio.get_running_loop().create_future()

        def on_replay(raw: Any) -> None:
            if isinstance(raw, dict) and raw.get("replay") == request_id and not replayed.done():
                found = raw.get("events")
                events = []
                for item in found if isinstance(found, list) else []:
                    with contextlib.suppress(ValueError, TypeError):
                        events.append(RunEvent.from_dict(item))
                replayed.set_result(events)

        stop = await self._hear(run_id, live.put_nowait, on_replay)
        try:
            early = self.inflight.events(run_id)  # this process runs it: taken at once
            store = runtime.store
            record = await store.get_run(run_id)
            past = history(record, await store.get_steps(run_id))
            if early is None and self._subscriber is not None and record.status == "running":
                await self._ask_owner(run_id, request_id)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(REPLAY_WAIT_S):
                        early = await asyncio.shield(replayed)
            fresh = _Dedupe(past)
            for event in past:
                yield event
            if past and past[-1].final:
                return
            for event in early or ():
                if fresh(event):
                    yield event
                    if event.final:
                        return
            while True:
                try:
                    # asyncio.timeout, not wait_for: on Python 3.11 wait_for can return an event
                    # that arrived in the same turn as a cancel and drop the cancel.
                    async with asyncio.timeout(_QUIET_S):
                        event = await live.get()
                except TimeoutError:
                    # No event for a while: the run may have ended where nobody published
                    # (its owner died and a cancel ended it): the store says.
                    record = await store.get_run(run_id)
                    if record.finished or record.status == "waiting":
                        steps = await store.get_steps(run_id)
                        yield history(record, steps)[-1]
                        return
                    continue
                if fresh(event):
                    yield event
                    if event.final:
                        return
        finally:
            await stop()

    async def wait_final(
        self, run_id: str, wait_s: float
    ) -> Told | tuple[RunRecord, dict[str, StepRecord] | None]:
        """Return the run's record once it is final or parked at a wait, or when ``wait_s`` has
        passed (the record as last read), with its steps when they were read with it: once told
        that the run ended, the record and the steps are read at once (one round trip's wait,
        not two; both are read after the final write, so they agree). A run this process
        executed tells its result itself (its ``run_finished`` carries the whole result as
        ``--json`` prints it, sent after the final write): that is returned (:class:`Told`),
        nothing is read.

        A run this process executes wakes its waiters in process (its ``run_finished``). On
        Redis, one executed or cancelled elsewhere wakes them through the notices every process
        hears on its shared subscription (``chainrt:run-changes``: a run ended; ``chainrt:cancel``):
        a waiter subscribes to nothing of its own, so it costs no round trip but its reads. The
        store is read again after each quiet :data:`_QUIET_S` on Redis (a notice lost while the
        connection was down), :data:`_WAIT_QUIET_S` without it (a run cancelled while queued
        ends with no event)."""
        runtime = self.runtime
        assert runtime is not None
        deadline = time.monotonic() + wait_s
        quiet_s = _WAIT_QUIET_S if self._subscriber is None else _QUIET_S
        woken = _Waiter()

        def on_event(event: RunEvent) -> None:
            if event.final:
                if event.type == "run_finished":
                    woken.told = event.data
                woken.wake(True)

        runtime.listen(run_id, on_event)
        self._waiters.setdefault(run_id, set()).add(woken)
        store = runtime.store
        try:
            while True:
                if woken.told is not None:
                    return Told(woken.told)
                ended, woken.ended = woken.ended, False
                woken.event.clear()  # before the read: a wake-up after it is not lost
                steps: dict[str, StepRecord] | None = None
                if ended:  # told after its final write: the record and the steps at once
                    record, steps = await asyncio.gather(
                        store.get_run(run_id), store.get_steps(run_id)
                    )
                else:
                    record = await store.get_run(run_id)
                left = deadline - time.monotonic()
                if record.status not in ("queued", "running") or left <= 0:
                    return record, steps
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(left, quiet_s)):
                        await woken.event.wait()
        finally:
            runtime.unlisten(run_id, on_event)
            waiters = self._waiters.get(run_id, set())
            waiters.discard(woken)
            if not waiters:
                self._waiters.pop(run_id, None)


@dataclasses.dataclass(frozen=True)
class Told:
    """A run's result as its ``run_finished`` in this process told it: ``data`` is
    ``RunResult.model_dump(mode="json")`` of the result the runtime returned (read-only)."""

    data: dict[str, Any]

    def result(self) -> RunResult:
        """The result as a :class:`~chainrt.RunResult`."""
        return RunResult.model_validate(self.data)


class _Waiter:
    """One ``?wait=``: woken when its run may have ended; ``ended`` once told so by something
    sent after the run's final write (its ``run_finished``, a notice with its final status)."""

    __slots__ = ("ended", "event", "told")

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.ended = False
        self.told: dict[str, Any] | None = None
        """The run's result, told by its ``run_finished`` in this process."""

    def wake(self, ended: bool) -> None:
        self.ended = self.ended or ended
        self.event.set()


class _Dedupe:
    """Tells whether an event heard after the history was read is new to the watcher."""

    def __init__(self, past: list[RunEvent]) -> None:
        self._started = bool(past)
        # A step whose record the history holds has been told in full (its ts, taken from the
        # record, can differ from the live event's, so the step's identity decides).
        self._told = {e.step_id for e in past if e.type == "step_finished"}
        self._seen: set[str] = set()

    def __call__(self, event: RunEvent) -> bool:
        key = event_key(event)
        if key in self._seen:
            return False  # replayed and heard live, or replayed twice
        self._seen.add(key)
        if event.type == "run_started":
            if not event.data.get("resumed") and self._started:
                return False  # the history began with it
            self._told.clear()  # a resumed execution may run a step again
            return True
        return event.step_id not in self._told
