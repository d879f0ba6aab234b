"""Randomised stress beyond the conformance suite's: more seeds, rates in the mix, and several
Redis limiter instances (standing in for processes) sharing one Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aredis

from chainrt.concurrency import LocalLimiter, RedisLimiter
from chainrt.testing.limiter_conformance import run_stress

LIMITS = {"s:1": 1, "s:2": 2, "s:3": 3, "s:4": 1}
RATES = {"s:3": 2000.0, "s:4": 500.0}


@pytest.fixture
async def redis_limiters(redis_url: str) -> AsyncIterator[list[RedisLimiter]]:
    limiters = [RedisLimiter.from_url(redis_url, lease_ttl_s=5.0) for _ in range(3)]
    yield limiters
    for limiter in limiters:
        await limiter.close()


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_local_limiter_under_random_operations(seed: int) -> None:
    limiter = LocalLimiter()
    report = await run_stress(limiter, LIMITS, ops=3000, seed=seed, rates=RATES)
    assert report.granted > 150
    assert report.rejected > 0
    assert report.cancelled > 0
    assert all(0 < report.peak[k] <= LIMITS[k] for k in LIMITS), report.peak
    assert limiter._keys == {} or all(not s.holders and not s.queue for s in limiter._keys.values())


@pytest.mark.redis
@pytest.mark.slow  # 5,000 operations over Redis: half a minute on 2 cores
async def test_redis_instances_sharing_one_redis_under_random_operations(
    redis_limiters: list[RedisLimiter], redis_url: str
) -> None:
    report = await run_stress(
        redis_limiters[0], LIMITS, ops=5000, seed=99, rates=RATES, via=redis_limiters
    )
    assert report.granted > 100
    assert report.rejected > 0
    assert report.cancelled > 0
    assert all(0 < report.peak[k] <= LIMITS[k] for k in LIMITS), report.peak
    client = aredis.Redis.from_url(redis_url, decode_responses=True)
    slots = (":holders", ":queue", ":tickets")
    left = [k async for k in client.scan_iter(match="chainrt:ck:*") if k.endswith(slots)]
    await client.aclose()
    assert left == []
