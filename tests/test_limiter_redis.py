"""The Redis limiter against the shared conformance suite, plus what only Redis has: leases,
wake-ups across limiter instances, hash tags, self-cleaning keys, and Redis faults."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio as aredis

from chainrt._errors import ConcurrencyError, ConcurrencyRejected, StoreUnavailable
from chainrt.concurrency import KeyRequest, Limiter, LocalLimiter, RedisLimiter, open_limiter
from chainrt.redis.keys import key_names
from chainrt.testing.limiter_conformance import Leftovers, LimiterConformance
from chainrt.testing.redis_server import RedisServer

pytestmark = pytest.mark.redis


async def _slot_keys(url: str) -> list[str]:
    """Redis keys that hold slots or tickets (rate state and undo marks outlive them by design:
    they hold nothing and lapse by themselves)."""
    client = aredis.Redis.from_url(url, decode_responses=True)
    try:
        found = [k async for k in client.scan_iter(match="chainrt:ck:*")]
        return sorted(k for k in found if k.endswith((":holders", ":queue", ":tickets")))
    finally:
        await client.aclose()


class TestRedisLimiter(LimiterConformance):
    """Every conformance test, on a RedisLimiter over the test session's redis-server."""

    stress_ops = 2500

    @pytest.fixture
    async def limiter(self, redis_url: str) -> AsyncIterator[Limiter]:
        lim = RedisLimiter.from_url(redis_url, lease_ttl_s=5.0)
        yield lim
        await lim.close()

    @pytest.fixture
    def leftovers(self, redis_url: str) -> Leftovers:
        async def scan() -> list[str]:
            return await _slot_keys(redis_url)

        return scan


MakeLimiter = Callable[..., RedisLimiter]


@pytest.fixture
async def make_limiter(redis_url: str) -> AsyncIterator[MakeLimiter]:
    """Builds RedisLimiters on the test's Redis (``lease_ttl_s=...``) and closes them all."""
    made: list[RedisLimiter] = []

    def make(lease_ttl_s: float = 10.0, url: str = redis_url) -> RedisLimiter:
        made.append(RedisLimiter.from_url(url, lease_ttl_s=lease_ttl_s))
        return made[-1]

    yield make
    for limiter in made:
        await limiter.close()


@pytest.fixture
async def raw(redis_url: str) -> AsyncIterator[aredis.Redis]:
    """A plain client to look at what the limiter stored."""
    client = aredis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    await client.aclose()


async def test_open_limiter_picks_the_backend_from_the_store_url(redis_url: str) -> None:
    local = open_limiter("sqlite:///:memory:")
    assert isinstance(local, LocalLimiter)
    assert open_limiter("sqlite:///:memory:") is local  # one process-wide instance
    remote = open_limiter(redis_url, lease_ttl_s=3.0)
    assert isinstance(remote, RedisLimiter)
    assert remote.lease_ttl_s == 3.0
    await remote.close()
    with pytest.raises(ConcurrencyError, match="lease_ttl_s"):
        RedisLimiter.from_url(redis_url, lease_ttl_s=0)


def _hash_tag(name: str) -> str:
    """The part of a Redis key that Redis Cluster hashes (its rule, spelled out)."""
    start = name.find("{")
    end = name.find("}", start + 1)
    return name[start + 1 : end] if start != -1 and end > start + 1 else name


async def test_all_keys_of_a_concurrency_key_share_one_hash_tag(
    make_limiter: MakeLimiter, raw: aredis.Redis
) -> None:
    limiter = make_limiter()
    for key in ("user:u1", "odd}key{name"):
        rated = KeyRequest(key, 1, rate_per_s=0.5)  # the rate key lives 2 s
        held = await limiter.acquire([rated], timeout_s=1, holder="a")
        waiter = asyncio.create_task(limiter.acquire([KeyRequest(key, 1)], timeout_s=5, holder="b"))
        while not (await limiter.snapshot(key)).waiting:
            await asyncio.sleep(0.005)
        names = key_names("chainrt:ck", key)
        assert [n for n in names if await raw.exists(n)] == list(names[:4])  # all in use but undo
        assert len({_hash_tag(n) for n in names}) == 1
        await held.release()
        await (await waiter).release()


async def test_every_key_expires_with_its_last_lease_or_ticket(
    make_limiter: MakeLimiter, raw: aredis.Redis
) -> None:
    limiter = make_limiter(2.0)
    held = await limiter.acquire([KeyRequest("k", 1)], timeout_s=1, holder="a")
    waiter = asyncio.create_task(limiter.acquire([KeyRequest("k", 1)], timeout_s=5, holder="b"))
    while not (await limiter.snapshot("k")).waiting:
        await asyncio.sleep(0.005)
    for name in key_names("chainrt:ck", "k")[:3]:
        assert 0 < await raw.pttl(name) <= 2001, name  # an abandoned key cleans itself up
    await held.release()
    await (await waiter).release()


async def test_leases_are_renewed_while_held(make_limiter: MakeLimiter) -> None:
    holder, other = make_limiter(0.6), make_limiter(0.6)
    held = await holder.acquire([KeyRequest("k", 1)], timeout_s=1, holder="a")
    await asyncio.sleep(1.5)  # 2.5 TTLs
    with pytest.raises(ConcurrencyRejected):
        await other.acquire([KeyRequest("k", 1)], timeout_s=0.05, holder="b")
    await held.release()
    again = await other.acquire([KeyRequest("k", 1)], timeout_s=0, holder="b")
    await again.release()


async def test_a_release_wakes_a_waiter_of_another_instance(make_limiter: MakeLimiter) -> None:
    # TTL 60 s: a waiter would look again on its own only after 20 s (or the holder's lease
    # expiry, 60 s); getting the key within 3 s proves the releaser's wake-up reached it.
    first, second = make_limiter(60), make_limiter(60)
    held = await first.acquire([KeyRequest("k", 1)], timeout_s=1, holder="a")

    async def release_later() -> None:
        await asyncio.sleep(0.3)
        await held.release()

    releaser = asyncio.create_task(release_later())
    got = await second.acquire([KeyRequest("k", 1)], timeout_s=3, holder="b")
    await releaser
    assert got.waits_ms["k"] >= 250
    await got.release()


async def test_a_waiter_does_not_poll_redis_while_it_waits(
    make_limiter: MakeLimiter, raw: aredis.Redis
) -> None:
    limiter = make_limiter(3.0)  # a waiter looks again every 1 s at most
    held = await limiter.acquire([KeyRequest("k", 1)], timeout_s=1, holder="a")
    await raw.config_resetstat()
    with pytest.raises(ConcurrencyRejected):
        await limiter.acquire([KeyRequest("k", 1)], timeout_s=2.0, holder="b")
    calls = (await raw.info("commandstats"))["cmdstat_evalsha"]["calls"]
    # 2 tries up front (the second right after subscribing), 1 per second of waiting, the undo,
    # and the holder's 2 lease renewals: a polling waiter would make hundreds.
    assert calls <= 8, calls
    await held.release()


async def test_cancel_during_a_script_call_in_flight_leaves_nothing(
    make_limiter: MakeLimiter, redis_url: str, redis_server: RedisServer
) -> None:
    limiter = make_limiter()
    await (await limiter.acquire([KeyRequest("k", 1)], timeout_s=1, holder="warm")).release()
    assert redis_server.process is not None
    pid = redis_server.process.pid
    os.kill(pid, signal.SIGSTOP)  # the acquire's EVALSHA reaches Redis but gets no answer yet
    try:
        task = asyncio.create_task(limiter.acquire([KeyRequest("k", 1)], timeout_s=5, holder="v"))
        await asyncio.sleep(0.1)
        task.cancel()
        await asyncio.sleep(0.1)
    finally:
        os.kill(pid, signal.SIGCONT)
    with pytest.raises(asyncio.CancelledError):
        await task
    state = await limiter.snapshot("k")
    assert state.holders == ()  # the grant that landed after the cancel was undone
    assert state.waiting == ()
    assert await _slot_keys(redis_url) == []


async def test_scripts_are_reloaded_after_redis_restarts(
    make_limiter: MakeLimiter, redis_server: RedisServer
) -> None:
    limiter = make_limiter()
    await (await limiter.acquire([KeyRequest("k", 1)], timeout_s=1, holder="a")).release()
    redis_server.restart()  # forgets the loaded scripts (and all data)
    held = await limiter.acquire([KeyRequest("k", 1)], timeout_s=5, holder="b")
    assert (await limiter.snapshot("k")).holders == ("b",)
    await held.release()


async def test_unreachable_redis_is_reported_without_the_password(
    make_limiter: MakeLimiter,
) -> None:
    with RedisServer() as server:
        url = f"redis://:s3cret@127.0.0.1:{server.port}/0"
    limiter = make_limiter(url=url)  # the server is gone now
    with pytest.raises(StoreUnavailable) as info:
        await limiter.acquire([KeyRequest("k", 1)], timeout_s=1, holder="a")
    assert "127.0.0.1" in str(info.value)
    assert "s3cret" not in str(info.value)


async def test_close_gives_back_what_is_still_held(
    make_limiter: MakeLimiter, redis_url: str
) -> None:
    first, second = make_limiter(), make_limiter()
    await first.acquire([KeyRequest("a", 1), KeyRequest("b", 1)], timeout_s=1, holder="x")
    await first.close()
    held = await second.acquire([KeyRequest("a", 1), KeyRequest("b", 1)], timeout_s=0, holder="y")
    await held.release()
    with pytest.raises(ConcurrencyError, match="closed"):
        await first.acquire([KeyRequest("a", 1)], timeout_s=1, holder="z")
    assert await _slot_keys(redis_url) == []


async def test_a_cancel_while_connecting_is_never_swallowed(
    make_limiter: MakeLimiter, redis_url: str
) -> None:
    """redis-py opens connections under asyncio.wait_for, which on Python 3.11 may swallow a
    cancellation; the limiter must still end the acquisition and leave nothing held."""
    for steps in range(16):
        limiter = make_limiter()  # a fresh pool: the first call opens a connection
        task = asyncio.create_task(limiter.acquire([KeyRequest("k", 1)], timeout_s=5, holder="v"))
        for _ in range(steps):
            await asyncio.sleep(0)
        if task.done():
            await (await task).release()
            continue
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await limiter.snapshot("k")).holders == (), steps
    assert await _slot_keys(redis_url) == []
