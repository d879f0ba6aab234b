"""The service queue's Redis client opens at most ``CHAINRT_REDIS_MAX_CONNECTIONS``
connections: a burst of submits waits for one instead of opening one each (real Redis)."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from chainrt.serve._queue import Entry, RedisQueue

pytestmark = pytest.mark.redis


async def _connections(raw: aioredis.Redis) -> int:
    return len(await raw.client_list())


@pytest.mark.parametrize("bound", [2, 64])
async def test_a_burst_of_puts_opens_at_most_the_bound(
    redis_url: str, bound: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHAINRT_REDIS_MAX_CONNECTIONS", str(bound))
    raw = aioredis.Redis.from_url(redis_url)
    before = await _connections(raw)
    queue = RedisQueue(redis_url, "burst")
    try:
        await queue.put(Entry("first"), "normal")  # groups made, the cluster question asked
        await asyncio.gather(*(queue.put(Entry(f"r{i}"), "normal") for i in range(50)))
        piped = await _connections(raw) - before
        # Through the client (what a put falls back to when the pipe fails): pool-bound.
        stream = queue.keys.stream("normal")
        await asyncio.gather(*(queue._client.xadd(stream, {"run_id": f"c{i}"}) for i in range(50)))
        opened = await _connections(raw) - before
        assert sum(d.waiting for d in await queue.depth()) == 101
    finally:
        await queue.close()
        await raw.aclose()
    # On one node the puts share one pipe: a connection for them, one for the client's first
    # commands (the groups), whatever the bound.
    assert piped <= 2
    # 50 commands at once through the client: as many connections as the bound lets them have
    # (all of them at 64).
    assert opened <= bound + 1  # (+ the pipe's)
    assert opened > 3 or bound == 2
