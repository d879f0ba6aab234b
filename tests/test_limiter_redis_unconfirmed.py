"""The Redis limiter's release not waited for (``Holding.release_unconfirmed``): it reaches Redis
ahead of whatever the same limiter sends next, and a release that fails or whose outcome is lost
with the connection is sent again until the key is free, without waiting for the lease to lapse."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import redis.asyncio as aredis

from chainrt.concurrency import KeyRequest, RedisLimiter
from chainrt.testing.redis_server import RedisServer

pytestmark = pytest.mark.redis

LONG_LEASE_S = 120.0
"""Far longer than any wait below: a key found free was given back, not lapsed."""


async def _until(check: Callable[[], Awaitable[bool]], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout_s:g}s")
        await asyncio.sleep(0.01)


@pytest.fixture
async def two(redis_url: str) -> AsyncIterator[tuple[RedisLimiter, RedisLimiter]]:
    """Two limiter instances on the test's Redis (one releases, the other looks)."""
    first = RedisLimiter.from_url(redis_url, lease_ttl_s=LONG_LEASE_S)
    second = RedisLimiter.from_url(redis_url, lease_ttl_s=LONG_LEASE_S)
    yield first, second
    await first.close()
    await second.close()


async def test_the_next_acquire_of_the_same_limiter_finds_the_key_free(
    two: tuple[RedisLimiter, RedisLimiter],
) -> None:
    limiter, other = two
    keys = [KeyRequest("a", 1), KeyRequest("b", 1)]
    for i in range(50):
        # Limit 1 and no time to wait: granted only if the release before it came first.
        held = await limiter.acquire(keys, timeout_s=0, holder=f"h{i}")
        await held.release_unconfirmed()
    assert (await limiter.snapshot("a")).holders == ()
    await _until(lambda: _free(other, "a", "b"))


async def test_close_waits_for_releases_not_waited_for(redis_url: str) -> None:
    limiter = RedisLimiter.from_url(redis_url, lease_ttl_s=LONG_LEASE_S)
    other = RedisLimiter.from_url(redis_url, lease_ttl_s=LONG_LEASE_S)
    try:
        held = [
            await limiter.acquire([KeyRequest(f"k{i}", 1)], timeout_s=1, holder=f"h{i}")
            for i in range(20)
        ]
        for holding in held:
            await holding.release_unconfirmed()
        await limiter.close()
        # Checked at once, from another instance: close() returned after every release landed.
        assert await _free(other, *(f"k{i}" for i in range(20)))
    finally:
        await limiter.close()
        await other.close()


async def test_a_release_refused_for_a_flushed_script_is_sent_again(
    two: tuple[RedisLimiter, RedisLimiter], redis_url: str
) -> None:
    limiter, other = two
    held = await limiter.acquire([KeyRequest("k", 1)], timeout_s=1, holder="h")
    raw = aredis.Redis.from_url(redis_url)
    try:
        await raw.script_flush()  # the FORGET sent next gets NOSCRIPT back
    finally:
        await raw.aclose()
    await held.release_unconfirmed()
    await _until(lambda: _free(other, "k"))
    again = await other.acquire([KeyRequest("k", 1)], timeout_s=0, holder="next")
    await again.release()


async def test_a_release_lost_with_its_connection_is_sent_again() -> None:
    """The FORGET is on the wire when Redis is killed before it runs it (stopped first); the slot
    survives the restart (AOF, fsync always, a lease far longer than the test) and is free soon
    after: only the limiter sending the FORGET again can have freed it."""
    with RedisServer(durable=True) as server:
        limiter = RedisLimiter.from_url(server.url, lease_ttl_s=LONG_LEASE_S)
        other = RedisLimiter.from_url(server.url, lease_ttl_s=LONG_LEASE_S)
        try:
            held = await limiter.acquire([KeyRequest("k", 1)], timeout_s=1, holder="h")
            assert server.process is not None
            os.kill(server.process.pid, signal.SIGSTOP)  # the FORGET is read by nobody
            await held.release_unconfirmed()
            await asyncio.sleep(0.05)
            server.kill()
            # start() blocks the loop until Redis answers again: the limiter learns that its
            # connection is gone only now, and sends the FORGET again to a running server.
            server.start()
            await _until(lambda: _free(other, "k"), timeout_s=20)
        finally:
            await limiter.close()
            await other.close()


async def _free(limiter: RedisLimiter, *keys: str) -> bool:
    for key in keys:
        if (await limiter.snapshot(key)).holders:
            return False
    return True
