"""Group commit: concurrent runs' checkpoint writes share round trips and transactions, each
still fenced and atomic on its own, a lone commit is not held back, one run's order is kept."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from chainrt._errors import FencedOut
from chainrt.store import CheckpointStore, RedisStore, RunProgress, SQLiteStore
from chainrt.testing.store_conformance import make_run, make_step

RUNS = 64
STEPS = 10


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[CheckpointStore]:
    if request.param == "sqlite":
        opened: CheckpointStore = SQLiteStore(tmp_path / "x.db")
    else:
        opened = RedisStore(request.getfixturevalue("redis_url"))
    yield opened
    await opened.close()


async def _create(store: CheckpointStore, count: int) -> list[str]:
    ids = [f"run-{i}" for i in range(count)]
    for run_id in ids:
        await store.create_run(make_run(run_id))
    return ids


async def _drive(store: CheckpointStore, run_id: str) -> None:
    """One run's steps, each committed before the next starts (as the runner does)."""
    for k in range(STEPS):
        progress = RunProgress(status="running", budget_used_ms=float(k))
        await store.commit(run_id, 1, progress, make_step(f"s{k}"))


async def test_many_runs_each_keep_every_step_in_order(store: CheckpointStore) -> None:
    ids = await _create(store, RUNS)
    await asyncio.gather(*(_drive(store, run_id) for run_id in ids))
    for run_id in ids:
        assert sorted(await store.get_steps(run_id)) == sorted(f"s{k}" for k in range(STEPS))
        # The last commit of each run is the one that stayed: its writes were not reordered.
        assert (await store.get_run(run_id)).budget_used_ms == STEPS - 1


async def test_a_fenced_commit_in_a_batch_fails_alone(store: CheckpointStore) -> None:
    ids = await _create(store, 9)
    stale = ids[4]
    await store.claim(stale, 1, make_run(stale).owner.model_copy())  # type: ignore[union-attr]
    progress = RunProgress(status="running", budget_used_ms=5.0)
    # The first commit finds the store idle and goes alone; the other eight queue behind it
    # and go together, the stale one among them.
    outcomes = await asyncio.gather(
        *(store.commit(run_id, 1, progress, make_step("one")) for run_id in ids),
        return_exceptions=True,
    )
    for run_id, outcome in zip(ids, outcomes, strict=True):
        if run_id == stale:
            assert isinstance(outcome, FencedOut)
            assert await store.get_steps(run_id) == {}  # nothing of the fenced commit landed
        else:
            assert outcome is None
            assert set(await store.get_steps(run_id)) == {"one"}


async def test_a_cancelled_waiter_leaves_the_batch_whole(store: CheckpointStore) -> None:
    ids = await _create(store, 6)
    progress = RunProgress(status="running", budget_used_ms=1.0)
    tasks = [asyncio.create_task(store.commit(r, 1, progress, make_step("x"))) for r in ids]
    await asyncio.sleep(0)  # every commit has started: the first is out, the rest are queued
    tasks[3].cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[3], asyncio.CancelledError)
    for run_id, result in zip(ids, results, strict=True):
        if run_id != ids[3]:
            assert result is None
            assert set(await store.get_steps(run_id)) == {"x"}


async def test_sqlite_concurrent_commits_share_transactions(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "x.db")
    ids = await _create(store, RUNS)
    commits: list[str] = []
    assert store._conn is not None
    store._conn.set_trace_callback(lambda sql: commits.append(sql) if sql == "COMMIT" else None)
    progress = RunProgress(status="running", budget_used_ms=1.0)
    await asyncio.gather(*(store.commit(r, 1, progress, make_step("x")) for r in ids))
    store._conn.set_trace_callback(None)
    # The first commit of the loop iteration alone, the 63 others in one transaction.
    assert len(commits) == 2
    for run_id in ids:
        assert set(await store.get_steps(run_id)) == {"x"}
    await store.close()


async def test_sqlite_lone_commit_is_written_at_once(tmp_path: Path) -> None:
    """A lone commit is written inside the call: not one loop iteration passes before it is."""
    store = SQLiteStore(tmp_path / "x.db")
    (run_id,) = await _create(store, 1)
    for k in range(3):
        ticks: list[int] = []
        asyncio.get_running_loop().call_soon(ticks.append, 1)
        await store.commit(run_id, 1, RunProgress(status="running", budget_used_ms=k), make_step())
        assert ticks == []  # the loop never ran: the commit did not wait for a batch
        await asyncio.sleep(0)
    with sqlite3.connect(tmp_path / "x.db") as raw:
        assert raw.execute("SELECT count(*) FROM steps").fetchone() == (1,)
    await store.close()


@pytest.mark.redis
async def test_redis_concurrent_commits_share_one_connection(redis_url: str) -> None:
    """64 runs committing at once: without the pipe each would hold a connection of its own for
    its round trip; on it, every commit goes on the one connection the runs' creation opened."""
    store = RedisStore(redis_url)
    ids = await _create(store, RUNS)
    pipe = store._fast._pipe
    assert pipe is not None
    probe = aioredis.Redis.from_url(redis_url)
    before = int((await probe.info("clients"))["connected_clients"])
    await asyncio.gather(*(_drive(store, run_id) for run_id in ids))
    opened = int((await probe.info("clients"))["connected_clients"]) - before
    await probe.aclose()
    assert opened == 0, opened
    assert store._fast._pipe is pipe
    for run_id in ids:
        assert len(await store.get_steps(run_id)) == STEPS
    await store.close()


class _CountedWrites:
    """A pipe's writer that records, for each write, how many commits it carries and how many
    were already in flight (written, their replies not read yet) when it went out."""

    def __init__(self, pipe: Any) -> None:
        self._pipe = pipe
        self._writer = pipe._writer
        self.writes: list[tuple[int, int]] = []

    def write(self, data: bytes) -> None:
        carried = data.count(b"$7\r\nEVALSHA\r\n")
        self.writes.append((carried, len(self._pipe._waiting) - carried))
        self._writer.write(data)


@pytest.mark.redis
async def test_redis_commits_of_one_loop_turn_go_in_one_write_without_waiting(
    redis_url: str,
) -> None:
    """The runs that one read of replies wakes commit their next steps in the same loop turn:
    those commits go out in one write, and they go while other commits are still in flight (a
    commit never waits for another's round trip to end). Each run's steps land in order."""
    store = RedisStore(redis_url)
    ids = await _create(store, RUNS)
    await store.commit(ids[0], 1, RunProgress(status="running", budget_used_ms=0.0))  # the pipe
    pipe = store._fast._pipe
    counted = _CountedWrites(pipe)
    pipe._writer = counted  # type: ignore[union-attr]
    await asyncio.gather(*(_drive(store, run_id) for run_id in ids))
    carried = [n for n, _ in counted.writes]
    assert sum(carried) == RUNS * STEPS
    # One write per commit without grouping; grouped, most commits share their write with
    # others (how the replies arrive in reads decides the exact split).
    in_shared_writes = sum(n for n in carried if n >= 8)
    assert in_shared_writes >= RUNS * STEPS // 2, carried
    assert any(in_flight > 0 for _, in_flight in counted.writes), counted.writes
    for run_id in ids:
        assert sorted(await store.get_steps(run_id)) == sorted(f"s{k}" for k in range(STEPS))
        assert (await store.get_run(run_id)).budget_used_ms == STEPS - 1
    await store.close()
