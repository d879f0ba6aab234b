"""The ``chainrt serve`` run queue while its ``{queue}`` slot moves between masters.

Producers put entries and consumers take and acknowledge them while the slot of the four streams
(with their consumer group and pending entries) migrates key by key, three times; every entry put
is delivered exactly once, and the masters answered the migration's redirections meanwhile.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Iterator

import pytest
from redis.crc import key_slot

from chainrt.serve._queue import PRIORITIES, Entry, RedisQueue, stream_key
from chainrt.testing.redis_cluster import LocalCluster
from chainrt.testing.reshard import error_counts, migrate_slot

pytestmark = [pytest.mark.redis, pytest.mark.cluster, pytest.mark.slow]


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    """A cluster of this test's own (its slot map changes): 3 masters, no replicas."""
    with LocalCluster(replicas=0, node_timeout_ms=15_000) as cluster:
        yield cluster


async def test_every_entry_is_delivered_once_while_the_queue_slot_moves(
    cluster: LocalCluster,
) -> None:
    slot = key_slot(stream_key("normal").encode())
    assert {key_slot(stream_key(p).encode()) for p in PRIORITIES} == {slot}
    producer = RedisQueue(cluster.url, "producer")
    consumers = [RedisQueue(cluster.url, f"consumer-{i}", orphan_idle_s=60) for i in range(2)]
    await producer.put(Entry("warm-up"), "normal")
    put: list[str] = ["warm-up"]
    got: list[str] = []
    moving = threading.Event()
    moving.set()

    async def produce(n: int) -> None:
        i = 0
        while moving.is_set():
            run_id = f"p{n}-{i}"
            await producer.put(Entry(run_id), PRIORITIES[i % len(PRIORITIES)])
            put.append(run_id)
            i += 1
            await asyncio.sleep(0.002)

    async def consume(queue: RedisQueue) -> None:
        while moving.is_set() or len(got) < len(put):
            delivery = await queue.take(0.1)
            if delivery is None:
                if not moving.is_set():
                    return
                continue
            assert delivery.entry is not None
            got.append(delivery.entry.run_id)
            await queue.ack(delivery)

    def move() -> None:
        try:
            ports = sorted(cluster.masters())
            for turn in range(3):
                migrate_slot(cluster, slot, ports[(ports.index(_owner()) + 1) % 3], pause_s=0.2)
                threading.Event().wait(0.2)
        finally:
            moving.clear()

    def _owner() -> int:
        return cluster.master_of(stream_key("normal"))

    before = error_counts(cluster)
    tasks = [asyncio.create_task(produce(n)) for n in range(4)]
    tasks += [asyncio.create_task(consume(q)) for q in consumers]
    await asyncio.to_thread(move)
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)
    after = error_counts(cluster)
    for queue in (producer, *consumers):
        await queue.close()
    twice = [run_id for run_id, n in Counter(got).items() if n > 1]
    assert twice == []
    assert sorted(got) == sorted(put)
    assert len(put) > 100
    met = {name: after[name] - before[name] for name in after}
    assert met["ASK"] + met["TRYAGAIN"] > 0, met  # the clients met the migrations
