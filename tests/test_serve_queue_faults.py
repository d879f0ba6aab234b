"""The run queue against poison and lost state, on a real Redis (and the in-process queue):
the orphan scan keeps its cursor, lost consumer groups come back, entries that keep failing go
to the dead letters (and can be retried or dropped), routing by chain."""

from __future__ import annotations

import asyncio

import pytest
import redis

from chainrt.serve._queue import Entry, LocalQueue, RedisQueue, stream_key

pytestmark = pytest.mark.redis


async def test_the_orphan_scan_goes_on_past_entries_that_keep_coming_back(redis_url: str) -> None:
    # Thirty old entries a crashed runner held, then one newer orphan. Claimed entries become
    # idle again quickly (as poison does: every runner claims it and never acks it).
    dead = RedisQueue(redis_url, "dead-runner")
    for i in range(30):
        await dead.put(Entry(f"poison-{i}"), "normal")
    await dead.put(Entry("newer"), "normal")
    taken = [await dead.take(0.1) for _ in range(31)]
    assert [d.entry.run_id for d in taken if d and d.entry][-1] == "newer"
    live = RedisQueue(redis_url, "live-runner", orphan_idle_s=0.05)
    try:
        seen: list[str] = []
        for _ in range(10):  # 31 entries, 5 a scan: the cursor reaches the newer one in 7
            await asyncio.sleep(0.1)
            seen += [d.entry.run_id for d in await live.orphans(5) if d.entry]
            live._backlog.clear()
            if "newer" in seen:
                break
        assert "newer" in seen  # from 0-0 every time, the first five came back for ever
    finally:
        await dead.close()
        await live.close()


async def test_consumer_groups_lost_with_the_data_are_created_again(redis_url: str) -> None:
    queue = RedisQueue(redis_url, "runner", chains=["nap"])
    try:
        await queue.put(Entry("before", chain="nap"), "high")
        first = await queue.take(0.2)
        assert first is not None
        assert first.entry == Entry("before", chain="nap")
        client = redis.Redis.from_url(redis_url)
        client.flushall()  # what a restart without persistence leaves
        client.close()
        await queue.put(Entry("after", chain="nap"), "high")  # XADD makes a stream, no group
        again = await queue.take(0.2)  # NOGROUP: created again, then read
        assert again is not None
        assert again.entry == Entry("after", chain="nap")
        await queue.touch([again])
        await queue.ack(again)
    finally:
        await queue.close()


async def test_an_entry_failing_for_good_is_dead_lettered_at_the_third_delivery(
    redis_url: str,
) -> None:
    queue = RedisQueue(redis_url, "runner", orphan_idle_s=0.05, chains=["nap"])
    try:
        await queue.put(Entry("poison", chain="nap"), "critical")
        delivery = await queue.take(0.2)
        assert delivery is not None
        assert await queue.fail(delivery, "CorruptRecord: unreadable") is None  # delivery 1
        letter = None
        for _ in range(2):  # claimed again as an orphan: deliveries 2 and 3
            await asyncio.sleep(0.1)
            claimed = await queue.orphans(1)
            assert [d.entry_id for d in claimed] == [delivery.entry_id]
            letter = await queue.fail(claimed[0], "CorruptRecord: unreadable")
        assert letter is not None
        assert (letter.run_id, letter.chain, letter.priority) == ("poison", "nap", "critical")
        assert letter.deliveries == 3
        assert letter.reason == "CorruptRecord: unreadable"
        assert [d.id for d in await queue.dead_letters()] == [letter.id]
        assert await queue.dead_count() == 1
        client = redis.Redis.from_url(redis_url)
        assert client.xlen(stream_key("critical", chain="nap")) == 0  # acked and deleted
        client.close()
        assert await queue.retry_dead(letter.id) == letter
        retried = await queue.take(0.2)
        assert retried is not None
        assert retried.entry == Entry("poison", "resume", None, "nap")
        assert await queue.dead_letters() == []
        assert await queue.drop_dead(letter.id) is None
    finally:
        await queue.close()


async def test_a_runner_reads_only_the_chains_it_serves(redis_url: str) -> None:
    mine = RedisQueue(redis_url, "a", chains=["nap"])
    theirs = RedisQueue(redis_url, "b", chains=["other"])
    try:
        await theirs.put(Entry("x", chain="other"), "normal")
        assert await mine.take(0.2) is None
        got = await theirs.take(0.2)
        assert got is not None
        assert got.entry == Entry("x", chain="other")
        await mine.announce(["nap"], ttl_s=5)
        await theirs.announce(["other"], ttl_s=-1)  # expired: as a runner killed long ago
        assert await mine.served() == {"nap"}
        depth = {(d.priority, d.chain): d.waiting for d in await mine.depth()}
        assert depth[("normal", "other")] == 0  # its chain's streams are counted too
    finally:
        await mine.close()
        await theirs.close()


async def test_the_local_queue_puts_a_failed_entry_back_then_dead_letters_it() -> None:
    queue = LocalQueue(retry_after_s=0.01)
    await queue.put(Entry("poison"), "low")
    for delivery_number in (1, 2):
        delivery = await queue.take(1.0)
        assert delivery is not None
        assert delivery.entry == Entry("poison")
        assert await queue.fail(delivery, "boom") is None, delivery_number
    last = await queue.take(1.0)
    assert last is not None
    letter = await queue.fail(last, "boom")
    assert letter is not None
    assert letter.deliveries == 3
    assert await queue.take(0.05) is None
    assert await queue.retry_dead(letter.id) == letter
    back = await queue.take(1.0)
    assert back is not None
    assert back.entry == Entry("poison", "resume")
    await queue.close()


@pytest.mark.parametrize("protocol", [2, 3])
async def test_a_blocked_take_wakes_on_the_entry_and_survives_lost_groups(
    redis_url: str, protocol: int
) -> None:
    url = f"{redis_url}{'&' if '?' in redis_url else '?'}protocol={protocol}"
    queue = RedisQueue(url, "runner", chains=["nap"])
    putter = RedisQueue(url, "putter", chains=["nap"])
    try:
        assert await queue.take(0.05) is None  # nothing: the blocking read timed out empty
        taking = asyncio.ensure_future(queue.take(5.0))
        await asyncio.sleep(0.2)  # blocked in XREADGROUP by now
        await putter.put(Entry("woken", chain="nap"), "low")
        got = await asyncio.wait_for(taking, 10)
        assert got is not None
        assert (got.entry, got.priority) == (Entry("woken", chain="nap"), "low")
        await queue.ack(got)
        client = redis.Redis.from_url(redis_url)
        client.flushall()  # the groups are gone: the blocking read gets NOGROUP
        client.close()
        taking = asyncio.ensure_future(queue.take(5.0))
        await asyncio.sleep(0.2)
        await putter.put(Entry("after", chain="nap"), "high")
        got = await asyncio.wait_for(taking, 10)
        assert got is not None
        assert got.entry == Entry("after", chain="nap")
        cancelled = asyncio.ensure_future(queue.take(5.0))
        await asyncio.sleep(0.2)
        cancelled.cancel()  # a draining runner stops its take: its connection is dropped
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        await putter.put(Entry("next", chain="nap"), "normal")
        got = await queue.take(2.0)
        assert got is not None
        assert got.entry == Entry("next", chain="nap")
    finally:
        await queue.close()
        await putter.close()
