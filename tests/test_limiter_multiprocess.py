"""Concurrency keys across real OS processes sharing one Redis (tests/helpers/limiter_worker.py).

Limits are checked from the (enter, exit) timestamps the workers write, never from the limiter's
own counters; order from a Redis list the workers push onto while they hold the key.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
from limiter_workers import LimiterWorkers as Workers

from chainrt._errors import ConcurrencyRejected
from chainrt.concurrency import KeyRequest, RedisLimiter

pytestmark = [pytest.mark.redis, pytest.mark.slow]  # many processes: the slow tier

START_LIST = "test:limiter:start"


@pytest.fixture
def workers(redis_url: str) -> Iterator[Workers]:
    pool = Workers(redis_url)
    yield pool
    pool.close()


@pytest.fixture
async def limiter(redis_url: str) -> AsyncIterator[RedisLimiter]:
    """The test's own limiter (default 10 s TTL: these tests block their loop at times)."""
    lim = RedisLimiter.from_url(redis_url)
    yield lim
    await lim.close()


def _expect_line(proc: subprocess.Popen[str], text: str) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line == text, f"worker said {line!r}, expected {text!r} (exit code {proc.poll()})"


def _finish(procs: list[subprocess.Popen[str]], timeout_s: float = 60) -> None:
    for proc in procs:
        assert proc.wait(timeout=timeout_s) == 0


def _until(predicate: object, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def _max_overlap(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(t0, 1) for t0, _ in intervals] + [(t1, -1) for _, t1 in intervals])
    current = peak = 0
    for _, step in events:  # at equal times the exit (-1) sorts first
        current += step
        peak = max(peak, current)
    return peak


def test_four_processes_never_exceed_the_limit(
    workers: Workers, redis_url: str, tmp_path: Path
) -> None:
    outs = [tmp_path / f"w{i}.jsonl" for i in range(5)]
    procs = [
        workers.start("contend", "model:m", "--limit", "2", "--iterations", "12",
                      "--hold-ms", "15", "--name", f"w{i}", "--out", str(out))
        for i, out in enumerate(outs)
    ]  # fmt: skip
    for proc in procs:
        _expect_line(proc, "ready")
    client = redis.Redis.from_url(redis_url)
    client.rpush(START_LIST, *["go"] * len(procs))
    _finish(procs)
    intervals = []
    for out in outs:
        for line in out.read_text().splitlines():
            record = json.loads(line)
            intervals.append((record["enter"], record["exit"]))
    assert len(intervals) == 5 * 12
    assert _max_overlap(intervals) == 2  # the limit was reached, and never exceeded
    slots = (b":holders", b":queue", b":tickets")
    assert [k for k in client.scan_iter("chainrt:ck:*") if k.endswith(slots)] == []
    client.close()


async def test_limit_one_serves_processes_in_arrival_order(
    workers: Workers, redis_url: str, limiter: RedisLimiter
) -> None:
    key = KeyRequest("session:s1", 1)
    first = await limiter.acquire([key], timeout_s=1, holder="parent")
    names = [f"p{i}" for i in range(5)]
    procs = []
    for i, name in enumerate(names):
        procs.append(workers.start("wait", "session:s1", "--ttl", "2", "--name", name))
        _expect_line(procs[-1], "waiting")
        deadline = time.monotonic() + 20
        while len((await limiter.snapshot("session:s1")).waiting) < i + 1:
            assert time.monotonic() < deadline, "worker never queued"
            time.sleep(0.01)
    assert (await limiter.snapshot("session:s1")).waiting == tuple(f"{n}:run" for n in names)
    await first.release()
    _finish(procs)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    assert client.lrange("test:limiter:order", 0, -1) == names
    client.close()


async def test_killed_holder_frees_its_slot_within_the_lease_ttl(
    workers: Workers, redis_url: str, limiter: RedisLimiter
) -> None:
    ttl = 1.0
    proc = workers.start("hold", "gpu:0", "--ttl", str(ttl), "--name", "doomed")
    _expect_line(proc, "held")
    time.sleep(2.5 * ttl)  # well past one TTL: only renewal keeps the slot
    assert (await limiter.snapshot("gpu:0")).holders == ("doomed:run",)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed = time.monotonic()
    holding = await limiter.acquire([KeyRequest("gpu:0", 1)], timeout_s=5, holder="heir")
    freed_after = time.monotonic() - killed
    # Freed by lease expiry (the last renewal was at most TTL/3 before the kill), not at once,
    # and within the TTL (plus scheduling slack on a busy test machine).
    assert 0.2 < freed_after < ttl + 0.5, freed_after
    await holding.release()


async def test_killed_waiter_leaves_no_ticket_in_the_line(
    workers: Workers, redis_url: str, limiter: RedisLimiter
) -> None:
    ttl = 1.0
    key = KeyRequest("session:s2", 1)
    first = await limiter.acquire([key], timeout_s=1, holder="parent")
    proc = workers.start("wait", "session:s2", "--ttl", str(ttl), "--name", "doomed")
    _expect_line(proc, "waiting")
    deadline = time.monotonic() + 20
    while (await limiter.snapshot("session:s2")).waiting != ("doomed:run",):
        assert time.monotonic() < deadline, "worker never queued"
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed = time.monotonic()
    while (await limiter.snapshot("session:s2")).waiting:
        assert time.monotonic() - killed < ttl + 0.5, "dead ticket outlived its TTL"
        time.sleep(0.02)
    await first.release()
    second = await limiter.acquire([key], timeout_s=0, holder="next")  # not blocked by the dead
    await second.release()


@pytest.mark.slow
def test_rate_holds_within_ten_percent_across_processes(
    workers: Workers, redis_url: str, tmp_path: Path
) -> None:
    outs = [tmp_path / f"r{i}.jsonl" for i in range(4)]
    procs = [
        workers.start("rate", "api:shared", "--limit", "100", "--rate", "5", "--seconds", "6",
                      "--name", f"r{i}", "--out", str(out))
        for i, out in enumerate(outs)
    ]  # fmt: skip
    for proc in procs:
        _expect_line(proc, "ready")
    client = redis.Redis.from_url(redis_url)
    client.rpush(START_LIST, *["go"] * len(procs))
    client.close()
    _finish(procs)
    grants = sorted(
        json.loads(line)["grant"] for out in outs for line in out.read_text().splitlines()
    )
    per_process = [len(out.read_text().splitlines()) for out in outs]
    assert all(n > 0 for n in per_process), per_process  # every process got its turns
    in_window = sum(1 for t in grants if grants[0] <= t < grants[0] + 5.0)
    assert 22.5 <= in_window <= 27.5, in_window


async def test_a_stalled_waiter_keeps_its_turn(
    workers: Workers, redis_url: str, limiter: RedisLimiter
) -> None:
    """A slot freed for the first in line stays its own even while its process is frozen."""
    key = KeyRequest("model:m2", 2)
    held = [await limiter.acquire([key], timeout_s=1, holder=f"h{i}") for i in range(2)]
    proc = workers.start("wait", "model:m2", "--limit", "2", "--name", "frozen")
    _expect_line(proc, "waiting")
    deadline = time.monotonic() + 20
    while (await limiter.snapshot("model:m2")).waiting != ("frozen:run",):
        assert time.monotonic() < deadline, "worker never queued"
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        await held[0].release()
        with pytest.raises(ConcurrencyRejected):  # a newcomer does not jump the line
            await limiter.acquire([key], timeout_s=0.2, holder="newcomer")
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    _finish([proc])
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    assert client.lrange("test:limiter:order", 0, -1) == ["frozen"]
    client.close()
    await held[1].release()
