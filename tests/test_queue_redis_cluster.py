"""The ``chainrt serve`` run queue (Redis Streams) on one Redis server and on a Redis Cluster:
priorities, acknowledgement, hand-back and orphan claims work the same on both."""

from __future__ import annotations

import asyncio

import pytest

from chainrt.serve._queue import Entry, RedisQueue

pytestmark = pytest.mark.redis


@pytest.fixture(params=["redis", pytest.param("cluster", marks=pytest.mark.cluster)])
def backend(request: pytest.FixtureRequest) -> tuple[str, bool]:
    """The session's single Redis, then the session's Redis Cluster (both flushed)."""
    on_cluster = request.param == "cluster"
    url: str = request.getfixturevalue("cluster_url" if on_cluster else "redis_url")
    return url, on_cluster


async def test_priorities_ack_hand_back_and_orphans(backend: tuple[str, bool]) -> None:
    queue_url, on_cluster = backend
    first = RedisQueue(queue_url + "?wait_replicas=0", "runner-a", orphan_idle_s=0.2)
    second = RedisQueue(queue_url, "runner-b", orphan_idle_s=0.2)
    await first.put(Entry("low-1"), "low")
    await first.put(Entry("normal-1", budget_ms=500.0), "normal")
    await first.put(Entry("critical-1", op="resume"), "critical")
    assert first.cluster is on_cluster  # the store's URL options were taken off, too
    taken = [await first.take(0.5) for _ in range(3)]
    assert [d.entry.run_id for d in taken if d and d.entry] == ["critical-1", "normal-1", "low-1"]
    assert taken[0] is not None
    assert taken[0].entry == Entry("critical-1", op="resume")
    assert await first.take(0.05) is None  # nothing left, the blocking read timed out
    await first.ack(taken[0])
    assert taken[1] is not None
    await first.hand_back(taken[1])  # readable by another runner at once
    again = await second.take(0.5)
    assert again is not None
    assert again.entry == Entry("normal-1", budget_ms=500.0)
    await asyncio.sleep(0.3)  # "low-1" (taken by first, never acked) is idle past 0.2 s now
    await second.touch([again])  # "normal-1" is second's, alive: its idle time restarts
    orphans = await second.orphans(10)
    assert [d.entry.run_id for d in orphans if d.entry] == ["low-1"]
    depth = {d.priority: d.waiting for d in await second.depth()}
    assert depth == {"critical": 0, "high": 0, "normal": 0, "low": 0}
    await first.close()
    await second.close()
