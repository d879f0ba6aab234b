"""A fleet of real ``chainrt serve`` processes against real Redis faults: a dropped connection
(``CLIENT KILL``), Redis restarted on the same port (empty, and with its append-only file) in the
middle of a burst, and Redis paused (SIGSTOP) past every timeout. After each, the runners take
runs again by themselves; while a loop is down ``/health/ready`` answers 503 naming it."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from chainrt.testing.redis_server import RedisServer
from chainrt.testing.serve_process import ServeProcess

CHAINS = Path(__file__).parent / "data" / "serve"

pytestmark = pytest.mark.redis


def runner(url: str, **kw: object) -> ServeProcess:
    return ServeProcess(store=url, chains=CHAINS, env={"CHAINRT_LEASE_TTL_S": "3"}, **kw)  # type: ignore[arg-type]


def submit(r: ServeProcess, run_id: str, seconds: float = 0.01) -> None:
    body = {"chain": "nap", "input": {"seconds": seconds, "label": run_id}, "run_id": run_id}
    answer = r.post("/v1/runs", json=body)
    assert answer.status_code == 202, answer.text


def submit_retrying(r: ServeProcess, run_id: str, timeout_s: float = 30) -> None:
    """Submit while Redis may still be coming back (a 503 is an answer to try again)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            answer = r.post(
                "/v1/runs",
                json={
                    "chain": "nap",
                    "input": {"seconds": 0.01, "label": run_id},
                    "run_id": run_id,
                },
            )
            if answer.status_code in (200, 202):
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"submit of {run_id} never accepted"
        time.sleep(0.2)


def final(r: ServeProcess, run_id: str, timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    status = "?"
    while time.monotonic() < deadline:
        try:
            status = str(r.get(f"/v1/runs/{run_id}", params={"wait": "5s"}).json()["status"])
        except (httpx.HTTPError, KeyError, ValueError):
            time.sleep(0.2)
            continue
        if status not in ("queued", "running"):
            return status
    raise AssertionError(f"run {run_id} still {status} after {timeout_s}s\n{r.log()}")


def ready_reason_while(r: ServeProcess, want: str, timeout_s: float) -> str:
    """Poll /health/ready until it answers 503 with ``want`` in its reason; that reason."""
    deadline = time.monotonic() + timeout_s
    seen = ""
    while time.monotonic() < deadline:
        try:
            answer = r.get("/health/ready", timeout=15)
        except httpx.HTTPError:
            continue
        seen = f"{answer.status_code} {answer.text}"
        if answer.status_code == 503 and want in answer.json()["reason"]:
            return str(answer.json()["reason"])
        time.sleep(0.1)
    raise AssertionError(f"/health/ready never said {want!r} in {timeout_s}s (last: {seen})")


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def test_a_runner_takes_runs_again_after_its_connections_are_killed(redis_url: str) -> None:
    with runner(redis_url) as r:
        submit(r, "before")
        assert final(r, "before") == "completed"
        client = redis.Redis.from_url(redis_url)
        killed = client.client_kill_filter(_type="normal", skipme=True)
        client.close()
        assert killed >= 2  # at least the runner's two queue connections
        submit_retrying(r, "after")
        assert final(r, "after", timeout_s=30) == "completed"  # it stayed queued before the fix
        assert r.get("/health/ready").status_code == 200


@pytest.mark.slow
def test_redis_restarted_empty_mid_burst_groups_are_created_again(
    own_redis: RedisServer,
) -> None:
    fleet = [runner(own_redis.url, max_runs=4).start() for _ in range(2)]
    try:
        for i in range(10):
            submit(fleet[i % 2], f"burst-{i}", seconds=0.3)
        own_redis.stop()
        reason = ready_reason_while(fleet[0], "loop down", timeout_s=20)
        assert "take loop" in reason or "orphans loop" in reason or "maintenance loop" in reason
        own_redis.start()  # same port, no persistence: records, streams and groups are gone
        for i in range(10):
            submit_retrying(fleet[i % 2], f"after-{i}")
        for i in range(10):
            assert final(fleet[i % 2], f"after-{i}") == "completed"
        deadline = time.monotonic() + 30  # a loop that runs every few seconds retries later
        logs = []
        for n, r in enumerate(fleet):
            while r.get("/health/ready").status_code != 200:
                assert time.monotonic() < deadline, r.log()
                time.sleep(0.2)
            metrics = r.get("/metrics").text
            assert 'chainrt_serve_loop_up{loop="take"} 1.0' in metrics
            restarts = [
                float(line.rsplit(" ", 1)[1])
                for line in metrics.splitlines()
                if line.startswith("chainrt_serve_loop_restarts_total{")
            ]
            assert restarts
            if n == 0:
                # The runner whose readiness named a loop down counted that loop's restart.
                # Which loop met the outage depends on timing (a take loop waiting on a full
                # runner touches Redis only after it is back, and finds its group gone).
                assert sum(restarts) >= 1, metrics
            log = r.log()
            logs.append(log)
            # Once per loop and outage, not per retry: six supervised loops (take, orphans,
            # maintenance, waits, and the feed's two), each failing at most at the stop and
            # again on the emptied server; a line per retry would be dozens.
            assert log.count("loop failed") <= 12, log
        assert "loop failed" in logs[0], logs[0]
    finally:
        for r in fleet:
            r.stop()


@pytest.mark.slow
def test_redis_restarted_with_its_aof_mid_burst_every_run_completes() -> None:
    with RedisServer(durable=True) as server:
        fleet = [runner(server.url, max_runs=4).start() for _ in range(2)]
        try:
            ids = [f"aof-{i}" for i in range(24)]
            for n, run_id in enumerate(ids):
                submit(fleet[n % 2], run_id, seconds=0.2)
            time.sleep(0.3)
            server.kill()  # kill -9 mid-burst
            time.sleep(1.0)
            server.start()  # replays its append-only file: runs and entries come back
            statuses = [final(fleet[n % 2], run_id, timeout_s=90) for n, run_id in enumerate(ids)]
            assert statuses == ["completed"] * len(ids)
            # Every loop is back by itself; one that runs every few seconds (the waits loop)
            # may not have tried Redis again yet when the last run completes.
            deadline = time.monotonic() + 30
            for r in fleet:
                while r.get("/health/ready").status_code != 200:
                    assert time.monotonic() < deadline, r.log()
                    time.sleep(0.2)
        finally:
            for r in fleet:
                r.stop()


@pytest.mark.slow
def test_redis_paused_past_every_timeout_then_the_runner_takes_runs_again(
    own_redis: RedisServer,
) -> None:
    with runner(own_redis.url) as r:
        submit(r, "before")
        assert final(r, "before") == "completed"
        assert own_redis.process is not None
        os.kill(own_redis.process.pid, signal.SIGSTOP)
        try:
            # Every Redis call of the loops now hangs until its socket timeout (10 s).
            reason = ready_reason_while(r, "loop down", timeout_s=40)
            assert "Timeout" in reason or "timeout" in reason
        finally:
            os.kill(own_redis.process.pid, signal.SIGCONT)
        submit_retrying(r, "after")
        assert final(r, "after", timeout_s=60) == "completed"
        deadline = time.monotonic() + 30
        while r.get("/health/ready").status_code != 200:
            assert time.monotonic() < deadline, r.log()
            time.sleep(0.2)
