"""A key already moved during a slot migration is reachable through chainrt's cluster client.

The source master answers ``ASK`` for it; the client must send ``ASKING`` and the command on one
connection to the target. redis-py alone sends them on two connections once the target's pool
holds two idle ones, and the call ends in ``TTL exhausted`` (``chainrt/redis/_cluster_asking.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis
from redis.crc import key_slot

from chainrt.redis import close_client, cluster_client
from chainrt.testing.redis_cluster import LocalCluster

pytestmark = [pytest.mark.redis, pytest.mark.cluster]


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """A cluster of this module's own (a slot is left migrating): 3 masters, no replicas."""
    with LocalCluster(replicas=0) as cluster:
        yield cluster


def _cmd(node: redis.Redis, *args: str | int) -> object:
    return node.execute_command(*args)  # type: ignore[no-untyped-call]


def _myid(node: redis.Redis) -> str:
    """The node's cluster id (``CLUSTER MYID`` answers bytes)."""
    answer = _cmd(node, "CLUSTER", "MYID")
    assert isinstance(answer, bytes), answer
    return answer.decode("ascii")


async def test_a_moved_key_is_read_through_ask_with_a_pool_of_idle_connections(
    cluster: LocalCluster,
) -> None:
    key = "chainrt:{asking}:run"
    slot = key_slot(key.encode())
    masters = cluster.masters()
    source = cluster.master_of(key, masters)
    target = next(port for port in masters if port != source)
    on_target = [f"k{i}" for i in range(200) if cluster.master_of(f"k{i}", masters) == target][:16]
    src, dst = redis.Redis(port=source), redis.Redis(port=target)
    try:
        src.set(key, "moved")
        _cmd(dst, "CLUSTER", "SETSLOT", slot, "IMPORTING", _myid(src))
        _cmd(src, "CLUSTER", "SETSLOT", slot, "MIGRATING", _myid(dst))
        _cmd(src, "MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", key)
        with pytest.raises(redis.exceptions.AskError):
            redis.Redis(port=source).get(key)  # the source now redirects: the case under test

        client = cluster_client(cluster.url)
        try:
            await client.initialize()  # as the store and the limiter do before any command
            # Concurrent commands to the target leave several idle connections in its pool.
            await asyncio.gather(*(client.get(k) for k in on_target))
            assert int(dst.info("clients")["connected_clients"]) >= 3  # ours: 1 + the pool's
            for _ in range(3):
                assert await client.get(key) == b"moved"
        finally:
            await close_client(client)
    finally:
        for node in (dst, src):  # end the migration: the slot goes to the target
            _cmd(node, "CLUSTER", "SETSLOT", slot, "NODE", _myid(dst))
        src.close()
        dst.close()
