"""The runs list's live feed (``chainrt/serve/_feed.py``) against real stores: what a client of
``GET /v1/events/runs`` receives — created and status events, the poll fallback, reconnects with
``Last-Event-ID``, heartbeats, a clean end — and notices from another process through Redis."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from chainrt._bus import EventPublisher, runs_channel
from chainrt._events import RunEvent
from chainrt._records import RunRecord
from chainrt.serve._feed import RunsFeed, parse_notice
from chainrt.store import open_store


def record(run_id: str, status: str = "queued", created_at: float = 1000.0) -> RunRecord:
    return RunRecord(
        run_id=run_id,
        chain="demo",
        spec={"name": "demo", "steps": []},
        input={},
        status=status,
        budget_total_ms=1000.0,
        created_at=created_at,
        updated_at=created_at,
    )


class Reader:
    """Reads one client's stream frame by frame (``next`` waits at most ``within_s``)."""

    def __init__(self, feed: RunsFeed, last_event_id: str | None = None) -> None:
        self.stream: AsyncIterator[bytes] = feed.stream(last_event_id)
        self.last_id: str | None = None

    async def next(self, within_s: float = 10.0) -> dict[str, Any]:
        """The next frame: ``{"comment": ...}`` or ``{"id", "event", "data"}``."""
        chunk = await asyncio.wait_for(self.stream.__anext__(), timeout=within_s)
        text = chunk.decode()
        assert text.endswith("\n\n"), text
        if text.startswith(":"):
            return {"comment": text[1:].strip()}
        fields = dict(line.split(": ", 1) for line in text.strip().splitlines())
        if "id" in fields:
            self.last_id = fields["id"]
        if "data" in fields:
            fields["data"] = json.loads(fields["data"])
        return fields

    async def event(self, within_s: float = 10.0) -> dict[str, Any]:
        """The next event (heartbeats and the retry hint skipped)."""
        while True:
            frame = await self.next(within_s)
            if "event" in frame:
                return frame

    async def close(self) -> None:
        await self.stream.aclose()  # type: ignore[attr-defined]


async def _until(probe: Callable[[], Awaitable[Any]], wanted: Any, within_s: float = 30) -> None:
    """Poll ``probe`` until it returns ``wanted`` (a wait, not a measurement: generous)."""
    deadline = time.monotonic() + within_s
    while (got := await probe()) != wanted:
        assert time.monotonic() < deadline, f"{got!r} after {within_s} s, not {wanted!r}"
        await asyncio.sleep(0.01)


async def _still_running(feed: RunsFeed) -> bool:
    return feed.running


async def _other_tasks() -> list[asyncio.Task[Any]]:
    """The event loop's tasks besides the test's own."""
    return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]


async def _subscribers(redis_url: str) -> int:
    """How many connections Redis counts as subscribed to the runs channel."""
    client = aioredis.Redis.from_url(redis_url)
    try:
        counts = await client.pubsub_numsub(runs_channel())
    finally:
        await client.aclose()
    return int(counts[0][1])


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[Any]:
    store = open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    yield store
    await store.close()


async def test_created_and_status_events_reconnect_and_close(sqlite_store: Any) -> None:
    await sqlite_store.create_run(record("old", "completed", created_at=900.0))
    feed = RunsFeed(sqlite_store, poll_s=3600, linger_s=3600)
    first = Reader(feed)
    assert await first.next() == {"retry": "2000"}  # how long a client waits to reconnect
    reload = await first.event()
    assert reload["event"] == "reload"  # a new stream starts by reading the list
    assert feed.running

    await sqlite_store.create_run(record("r1"))
    feed.notify("r1", "queued")
    created = await first.event()
    assert created["event"] == "run"
    assert created["data"] == {
        "change": "created",
        "run_id": "r1",
        "chain": "demo",
        "status": "queued",
        "budget": {"total_ms": 1000.0, "used_ms": 0.0},
        "created_at": 1000.0,
        "updated_at": 1000.0,
        "reason": None,  # the record's error (a GET /v1/runs row's reason, where it has one)
    }
    feed.observe(RunEvent("run_started", "r1", 1001.0, data={"chain": "demo"}))
    feed.notify("r1", "running")  # the same change twice (local and bus): told once
    feed.observe(RunEvent("run_finished", "r1", 1002.0, data={"status": "completed"}))
    running = await first.event()
    finished = await first.event()
    assert [running["data"]["status"], finished["data"]["status"]] == ["running", "completed"]
    assert running["data"]["change"] == finished["data"]["change"] == "status"
    feed.notify("old", "queued")  # a late "created" notice of a run the feed knows: nothing
    feed.notify("missing", None)  # a run that is not in the store: nothing
    await sqlite_store.create_run(record("r2"))
    feed.notify("r2", "queued")
    assert (await first.event())["data"]["run_id"] == "r2"  # nothing came in between
    seen = first.last_id
    await first.close()

    # The client reconnects after missing one change: it gets that change, not a reload.
    await sqlite_store.create_run(record("r3"))
    feed.notify("r3", "queued")
    await asyncio.sleep(0.2)  # the feed (lingering, no client) tells it meanwhile
    again = Reader(feed, last_event_id=seen)
    missed = await again.event()
    assert (missed["event"], missed["data"]["run_id"]) == ("run", "r3")
    # An id of another generation (a restarted feed, another runner): read the list again.
    other = Reader(feed, last_event_id="deadbeef-3")
    assert (await other.event())["event"] == "reload"

    # The server shuts down: every stream ends, the feed's tasks are gone.
    await feed.close()
    with pytest.raises(StopAsyncIteration):
        await again.event()
    with pytest.raises(StopAsyncIteration):
        await other.event()
    assert not feed.running
    leftovers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert leftovers == []


async def test_poll_finds_runs_nobody_announced_and_heartbeats(sqlite_store: Any) -> None:
    feed = RunsFeed(sqlite_store, poll_s=0.1, heartbeat_s=0.2, linger_s=0.1)
    reader = Reader(feed)
    assert (await reader.event())["event"] == "reload"
    # Written by another process (``chainrt run`` on the same file): no notice, the poll sees it.
    await sqlite_store.create_run(record("silent", "running", created_at=2000.0))
    found = await reader.event()
    assert (found["data"]["run_id"], found["data"]["change"]) == ("silent", "created")
    assert found["data"]["status"] == "running"
    frames = [await reader.next() for _ in range(2)]
    assert {"comment": "keep-alive"} in frames  # nothing happens: heartbeats only
    await reader.close()
    # linger_s is 0.1: the feed stops with no client left (waited for, not slept on: a busy
    # machine may run the linger timer and the stop late)
    await _until(lambda: _still_running(feed), False)
    assert not feed.running
    # The stop is under way once ``running`` is False: its cancelled tasks end within a few turns
    # of the loop, later on a busy machine. Waited for: a task that never ends still fails here.
    await _until(_other_tasks, [])


async def test_a_notice_from_another_process_arrives_through_redis(redis_url: str) -> None:
    store = open_store(redis_url)
    publisher = EventPublisher(redis_url)  # stands for another runner
    feed = RunsFeed(store, bus_url=redis_url, poll_s=3600)  # no poll: only the bus can tell
    listeners = await _subscribers(redis_url)
    try:
        reader = Reader(feed)
        assert (await reader.event())["event"] == "reload"
        # A notice published before the feed's SUBSCRIBE reached Redis is lost: wait for Redis
        # to count the subscription (a fixed sleep was a guess that a busy machine can outlast).
        await _until(lambda: _subscribers(redis_url), listeners + 1)
        await store.create_run(record("remote", created_at=3000.0))
        publisher.announce("remote", "queued")
        created = await reader.event()
        assert (created["data"]["run_id"], created["data"]["status"]) == ("remote", "queued")
        publisher.publish(RunEvent("run_started", "remote", 3001.0, data={"chain": "demo"}))
        publisher.publish(RunEvent("token", "remote", 3001.5, "s", {"text": "x"}))  # not a change
        publisher.publish(RunEvent("run_finished", "remote", 3002.0, data={"status": "failed"}))
        statuses = [(await reader.event())["data"]["status"] for _ in range(2)]
        assert statuses == ["running", "failed"]
        await reader.close()
    finally:
        await feed.close()
        await publisher.close()
        await store.close()


def test_notices_are_parsed_strictly() -> None:
    assert parse_notice(b'{"run_id": "a", "status": "queued"}') == ("a", "queued")
    assert parse_notice(b'{"run_id": "a", "status": 3}') == ("a", None)
    assert parse_notice(b'{"status": "queued"}') is None
    assert parse_notice(b"[1, 2]") is None
    assert parse_notice(b"\xff not json") is None


@pytest.mark.slow
@pytest.mark.redis
async def test_a_store_outage_is_one_line_and_names_the_feed_until_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from chainrt.testing.redis_server import RedisServer

    with RedisServer() as server:
        store = open_store(server.url)
        feed = RunsFeed(store, poll_s=0.05)
        try:
            reader = Reader(feed)
            assert (await reader.event())["event"] == "reload"
            server.stop()  # Redis away: every poll of the store fails
            await _until(lambda: _failures(feed), True)
            assert not feed.health.up
            assert feed.health.describe().startswith("feed loop down")
            server.start()
            await _until(lambda: _up(feed), True)
            await reader.close()
        finally:
            await feed.close()
            await store.close()
    # One line opens the outage, one closes it, whichever way the store's error came (the
    # feed's own catch or its supervisor's): not one per poll (there were at least 5).
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    about_feed = [m for m in said if "feed" in m]
    assert len(about_feed) == 2, said
    assert "working again" in about_feed[1], about_feed


async def _failures(feed: RunsFeed) -> bool:
    return feed.health.failures >= 5


async def _up(feed: RunsFeed) -> bool:
    return feed.health.up
