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
from chainrt.store._group import COMMIT_EXTRA, COMMIT_SPLIT
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
async def test_redis_concurrent_commits_share_round_trips(redis_url: str) -> None:
    """64 runs committing at once: without grouping each would hold a connection of its own
    for its round trip; grouped, the batches go on the group's own connection and at most
    COMMIT_EXTRA more (full batches sent while it is busy), with one spare for the turnover."""
    store = RedisStore(redis_url)
    ids = await _create(store, RUNS)
    probe = aioredis.Redis.from_url(redis_url)
    before = int((await probe.info("clients"))["connected_clients"])
    await asyncio.gather(*(_drive(store, run_id) for run_id in ids))
    opened = int((await probe.info("clients"))["connected_clients"]) - before
    await probe.aclose()
    assert opened <= 2 + COMMIT_EXTRA, opened
    for run_id in ids:
        assert len(await store.get_steps(run_id)) == STEPS
    await store.close()


@pytest.mark.redis
async def test_redis_runs_woken_by_a_batch_commit_again_in_one_batch(redis_url: str) -> None:
    """The runs a batch's replies wake commit their next steps in the same loop turn: those
    commits go out together, not the first alone and the rest in a second round trip."""
    store = RedisStore(redis_url)
    ids = await _create(store, RUNS)
    sizes: list[int] = []
    group = store._commits
    send = group._send

    async def counted(items: list[Any]) -> list[BaseException | None]:
        sizes.append(len(items))
        return await send(items)

    group._send = counted
    await asyncio.gather(*(_drive(store, run_id) for run_id in ids))
    # The first commit finds the store idle and goes alone, the other 63 queue behind it; from
    # then on each round of RUNS commits goes in batches: full ones of COMMIT_SPLIT sent while
    # the store is busy, and what is left in one more (one commit at a time, the first alone and
    # the rest behind it, before).
    assert sum(sizes) == RUNS * STEPS
    assert len(sizes) <= STEPS * (RUNS // COMMIT_SPLIT + 2), sizes
    in_full_batches = sum(n for n in sizes if n >= COMMIT_SPLIT)
    assert in_full_batches >= RUNS * STEPS // 2, sizes
    await store.close()


@pytest.mark.redis
async def test_redis_full_batches_go_out_while_the_store_is_busy(redis_url: str) -> None:
    """A batch that fills up behind a round trip on the wire goes out at once, in a round trip
    of its own (the store works on it while the runs behind it compute); never more than
    COMMIT_EXTRA of them at a time, and each run's steps still land in order."""
    store = RedisStore(redis_url)
    ids = await _create(store, RUNS)
    group = store._commits
    send = group._send
    on_wire = 0
    most = 0
    sizes: list[int] = []

    async def counted(items: list[Any]) -> list[BaseException | None]:
        nonlocal on_wire, most
        on_wire += 1
        most = max(most, on_wire)
        sizes.append(len(items))
        try:
            return await send(items)
        finally:
            on_wire -= 1

    group._send = counted
    await asyncio.gather(*(_drive(store, run_id) for run_id in ids))
    assert 2 <= most <= 1 + COMMIT_EXTRA, most
    assert COMMIT_SPLIT in sizes, sizes
    for run_id in ids:
        assert sorted(await store.get_steps(run_id)) == sorted(f"s{k}" for k in range(STEPS))
        assert (await store.get_run(run_id)).budget_used_ms == STEPS - 1
    await store.close()
