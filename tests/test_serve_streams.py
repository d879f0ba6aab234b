"""Event streams of ``chainrt serve`` (issue 36 and 41): one shared Redis subscription per
process, the ``--max-streams`` cap (429 past it), and a late watcher that still gets the step in
flight (subscribe first, then the in-flight events, then the history)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from chainrt._bus import SharedSubscriber
from chainrt._events import RunEvent
from chainrt.serve._inflight import InFlight
from chainrt.serve._streams import DEFAULT_MAX, StreamSlots, default_max_streams
from chainrt.serve._watch import _Dedupe, parse_replay
from chainrt.testing.serve_process import ServeProcess

CHAINS = Path(__file__).parent / "data" / "dashboard"


# ---------------------------------------------------------------------------- pure parts


@pytest.mark.parametrize(
    ("nofile", "expected"),
    [(1024, 512), (1, 1), (3, 1), (65536, DEFAULT_MAX), (-1, DEFAULT_MAX)],
)
def test_default_max_streams_is_half_the_open_files_limit(nofile: int, expected: int) -> None:
    assert default_max_streams(nofile) == expected


def test_stream_slots_refuse_past_the_limit_and_give_back_once() -> None:
    slots = StreamSlots(2)
    first, second = slots.take(), slots.take()
    assert first is not None
    assert second is not None
    assert slots.take() is None
    assert slots.refused == 1
    first()
    first()  # twice: still one slot
    assert slots.open == 1
    assert slots.take() is not None
    assert slots.take() is None


def _event(kind: str, step: str | None = None, ts: float = 1.0, **data: Any) -> RunEvent:
    return RunEvent(kind, "r", ts, step, data)


def test_in_flight_keeps_the_step_in_flight_and_forgets_the_run_at_its_end() -> None:
    kept = InFlight()
    kept.observe(_event("step_started", "a"))  # before run_started: not this process's run
    assert kept.events("r") is None
    kept.observe(_event("run_started", resumed=False))
    kept.observe(_event("step_started", "a", 2.0))
    kept.observe(_event("attempt", "a", 3.0, attempt=1))
    assert [e.type for e in kept.events("r") or []] == ["run_started", "step_started", "attempt"]
    kept.observe(_event("step_finished", "a", 4.0))
    kept.observe(_event("step_started", "b", 5.0))  # a is recorded by now: its events go
    assert [(e.type, e.step_id) for e in kept.events("r") or []] == [
        ("run_started", None),
        ("step_started", "b"),
    ]
    kept.observe(_event("run_finished", status="completed"))
    assert kept.events("r") is None


def test_dedupe_tells_each_event_once_and_recorded_steps_from_their_record() -> None:
    past = [_event("run_started", resumed=False), _event("step_started", "a", 1.5)]
    past += [_event("step_finished", "a", 2.0)]
    fresh = _Dedupe(past)
    assert not fresh(_event("run_started", ts=9.0, resumed=False))  # the history began with it
    assert not fresh(_event("attempt", "a", 1.7, attempt=1))  # step a is in the history
    started_b = _event("step_started", "b", 3.0)
    assert fresh(started_b)
    assert not fresh(_event("step_started", "b", 3.0))  # replayed and heard live
    assert fresh(_event("step_started", "b", 3.5))  # another event (another time)
    assert fresh(_event("run_started", ts=10.0, resumed=True))  # a resume runs a again
    assert fresh(_event("step_started", "a", 11.0))


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b'{"run_id": "r", "id": "x"}', ("r", "x")),
        (b'{"run_id": "r"}', None),
        (b'{"run_id": 1, "id": "x"}', None),
        (b"[1]", None),
        (b"\xff", None),
    ],
)
def test_parse_replay(data: bytes, expected: tuple[str, str] | None) -> None:
    assert parse_replay(data) == expected


# ---------------------------------------------------------------------------- shared subscriber


def _pubsub_clients(url: str) -> list[dict[str, Any]]:
    client = redis.Redis.from_url(url)
    try:
        return [c for c in client.client_list() if int(c.get("sub", 0)) > 0]
    finally:
        client.close()


async def test_one_connection_hears_many_channels_and_comes_back_after_a_kill(
    redis_url: str,
) -> None:
    subscriber = SharedSubscriber(redis_url)
    heard: dict[str, list[bytes]] = {}
    publisher = redis.asyncio.Redis.from_url(redis_url)
    try:
        for i in range(50):
            channel = f"test:ch{i}"
            handler = heard.setdefault(channel, []).append
            assert await subscriber.listen(channel, handler)
        clients = _pubsub_clients(redis_url)
        assert len(clients) == 1  # fifty channels, one connection
        assert int(clients[0]["sub"]) == 50
        # Confirmed means heard: a message published right after listen() returned arrives.
        await publisher.publish("test:ch7", b"hello")
        for _ in range(100):
            if heard["test:ch7"]:
                break
            await asyncio.sleep(0.01)
        assert heard["test:ch7"] == [b"hello"]
        await subscriber.unlisten("test:ch7", heard["test:ch7"].append)
        assert subscriber.channels == 49

        killer = redis.Redis.from_url(redis_url)
        killer.client_kill_filter(_type="pubsub")
        killer.close()
        # Back, every channel subscribed again (the handlers stay registered): a message
        # published while it reconnects is lost (pub/sub), so publish until one is heard.
        for _ in range(250):
            await publisher.publish("test:ch3", b"again")
            await asyncio.sleep(0.02)
            if heard["test:ch3"]:
                break
        clients = _pubsub_clients(redis_url)
        assert len(clients) == 1
        assert int(clients[0]["sub"]) == 49
        assert heard["test:ch3"][:1] == [b"again"]
    finally:
        await subscriber.close()
        await publisher.aclose()


# ---------------------------------------------------------------------------- chainrt serve


def _read_events(base: str, run_id: str, until_step: str, timeout: float = 60.0) -> list[Any]:
    """The events of one stream until ``until_step``'s ``step_finished`` (or the run's end)."""
    events: list[Any] = []
    with httpx.stream("GET", f"{base}/v1/runs/{run_id}/events", timeout=timeout) as stream:
        assert stream.status_code == 200
        for line in stream.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            events.append(event)
            done = event["type"] == "step_finished" and event.get("step_id") == until_step
            if done or event["type"] == "run_finished":
                break
    return events


def _wait_running(server: ServeProcess, run_id: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if server.get(f"/v1/runs/{run_id}").json()["status"] == "running":
            return
        time.sleep(0.02)
    raise AssertionError(f"{run_id} never started")


def _submit(server: ServeProcess, run_id: str, first_s: float) -> None:
    body = {"chain": "steps", "run_id": run_id, "input": {"a": first_s, "b": 0.0, "c": 0.0}}
    answer = server.post("/v1/runs", json=body)
    assert answer.status_code == 202, answer.text


@pytest.fixture
def redis_runner(redis_url: str) -> Iterator[ServeProcess]:
    with ServeProcess(store=redis_url, chains=CHAINS, drain="1s", args=["--max-streams", "6"]) as r:
        yield r


def test_streams_share_one_subscription_and_past_the_cap_get_429(
    redis_runner: ServeProcess, redis_url: str
) -> None:
    server = redis_runner
    _submit(server, "long", 30.0)
    _wait_running(server, "long")
    before = len(_pubsub_clients(redis_url))

    async def open_streams() -> tuple[list[int], int, int]:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            streams = [client.stream("GET", "/v1/runs/long/events") for _ in range(9)]
            opened = [await s.__aenter__() for s in streams]
            try:
                codes = [r.status_code for r in opened]
                during = len(_pubsub_clients(redis_url))
                ready = (await client.get("/health/ready")).status_code
                refused = next(r for r in opened if r.status_code == 429)
                body = json.loads(await refused.aread())
                assert body["error"]["type"] == "too_many_streams"
                assert refused.headers["retry-after"] == "5"
                return codes, during, ready
            finally:
                for s in streams:
                    await s.__aexit__(None, None, None)

    codes, during, ready = asyncio.run(open_streams())
    assert sorted(codes) == [200] * 6 + [429] * 3
    assert during == before  # six streams of one run: no new Redis connection
    assert ready == 200
    # The slots are given back when the streams end: six streams again.
    codes, _, _ = asyncio.run(open_streams())
    assert sorted(codes) == [200] * 6 + [429] * 3
    server.post("/v1/runs/long/cancel")


@pytest.mark.parametrize("store", ["sqlite", "redis"])
def test_a_late_watcher_gets_the_step_in_flight(
    store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = (
        f"sqlite:///{tmp_path / 'runs.db'}"
        if store == "sqlite"
        else request.getfixturevalue("redis_url")
    )
    with ServeProcess(store=url, chains=CHAINS, drain="1s") as server:
        _submit(server, "late", 1.5)
        _wait_running(server, "late")
        time.sleep(0.2)  # the first step is in flight, not recorded yet
        events = _read_events(server.url, "late", "first")
    kinds = [(e["type"], e.get("step_id")) for e in events]
    assert kinds[0] == ("run_started", None)
    assert ("step_started", "first") in kinds, kinds
    assert kinds.index(("step_started", "first")) < kinds.index(("step_finished", "first"))
    assert len(kinds) == len(set(map(json.dumps, events)))  # nothing twice


def test_a_late_watcher_on_another_runner_gets_the_step_in_flight_from_its_owner(
    redis_url: str,
) -> None:
    with ServeProcess(store=redis_url, chains=CHAINS, drain="1s") as owner:
        _submit(owner, "far", 12.0)
        _wait_running(owner, "far")
        # Started after the run: it cannot have taken it, and holds none of its events.
        with ServeProcess(store=redis_url, chains=CHAINS, drain="1s", max_runs=1) as other:
            events: list[Any] = []
            with httpx.stream("GET", f"{other.url}/v1/runs/far/events", timeout=60) as stream:
                for line in stream.iter_lines():
                    if line.startswith("data: "):
                        events.append(json.loads(line[6:]))
                        if len(events) == 2:
                            break
        owner.post("/v1/runs/far/cancel")
    assert [(e["type"], e.get("step_id")) for e in events] == [
        ("run_started", None),
        ("step_started", "first"),
    ]
