"""The Redis limiter on a real local Redis Cluster: the conformance suite, one slot per key,
wake-ups across instances (pub/sub over the cluster bus)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from chainrt.concurrency import KeyRequest, Limiter, RedisLimiter, open_limiter
from chainrt.redis.keys import key_names
from chainrt.testing.limiter_conformance import Leftovers, LimiterConformance
from chainrt.testing.redis_cluster import LocalCluster

pytestmark = [pytest.mark.redis, pytest.mark.cluster]


async def _slot_keys(url: str) -> list[str]:
    """Keys holding slots or tickets, on every master of the cluster."""
    client = RedisCluster.from_url(url, decode_responses=True)
    try:
        found = [k async for k in client.scan_iter(match="chainrt:ck:*")]
        return sorted(k for k in found if k.endswith((":holders", ":queue", ":tickets")))
    finally:
        await client.aclose()


class TestRedisClusterLimiter(LimiterConformance):
    """Every conformance test, on a RedisLimiter over the session's Redis Cluster."""

    stress_ops = 1000

    @pytest.fixture
    async def limiter(self, cluster_url: str) -> AsyncIterator[Limiter]:
        lim = RedisLimiter.from_url(cluster_url, lease_ttl_s=5.0)
        yield lim
        await lim.close()

    @pytest.fixture
    def leftovers(self, cluster_url: str) -> Leftovers:
        async def scan() -> list[str]:
            return await _slot_keys(cluster_url)

        return scan


async def test_keys_spread_over_the_masters_each_in_one_slot(
    redis_cluster: LocalCluster, cluster_url: str
) -> None:
    limiter = open_limiter(cluster_url + "/0?wait_replicas=1")  # the store's options are ignored
    assert isinstance(limiter, RedisLimiter)
    keys = [f"user:{i}" for i in range(30)]
    held = [await limiter.acquire([KeyRequest(k, 1)], timeout_s=1, holder="h") for k in keys]
    masters = set()
    for key in keys:
        names = key_names("chainrt:ck", key)
        assert len({key_slot(n.encode()) for n in names}) == 1
        masters.add(redis_cluster.master_of(names.holders))
    assert masters == set(redis_cluster.masters())
    snapshot = await limiter.snapshot("user:7")
    assert len(snapshot.holders) == 1
    for holding in held:
        await holding.release()
    assert await _slot_keys(cluster_url) == []
    await limiter.close()


async def test_a_release_wakes_a_waiter_of_another_instance(cluster_url: str) -> None:
    # TTL 60 s: a waiter would look again on its own only after 20 s; getting the key within
    # 3 s proves the releaser's PUBLISH (on the key's master) reached the waiter's subscription
    # (on whichever node its cluster client chose) over the cluster bus.
    first = RedisLimiter.from_url(cluster_url, lease_ttl_s=60)
    second = RedisLimiter.from_url(cluster_url, lease_ttl_s=60)
    held = await first.acquire([KeyRequest("k", 1)], timeout_s=1, holder="a")

    async def release_later() -> None:
        await asyncio.sleep(0.3)
        await held.release()

    releaser = asyncio.create_task(release_later())
    got = await second.acquire([KeyRequest("k", 1)], timeout_s=3, holder="b")
    await releaser
    assert got.waits_ms["k"] >= 250
    await got.release()
    await first.close()
    await second.close()
