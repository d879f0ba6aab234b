"""The Redis store on a real local Redis Cluster (3 masters, 3 replicas): the conformance suite,
the key layout across slots, and the ``wait_replicas`` option. Failover: test_cluster_failover."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import MaxConnectionsError

from chainrt._errors import CheckpointError, StoreUnavailable
from chainrt.redis import close_client, cluster_client
from chainrt.store import DEFAULT_MAX_RECORD_BYTES, CheckpointStore, RedisStore, RunProgress
from chainrt.testing.redis_cluster import LocalCluster
from chainrt.testing.store_conformance import StoreConformance, StoreFactory, make_run, make_step

pytestmark = [pytest.mark.redis, pytest.mark.cluster]

_RUNNING = RunProgress(status="running", budget_used_ms=1.0)


class TestRedisClusterStore(StoreConformance):
    """Every conformance test, on the session's Redis Cluster (every master flushed per test)."""

    @pytest.fixture
    def make_store(self, cluster_url: str) -> StoreFactory:
        async def make(
            *, record_ttl_s: float | None = None, max_record_bytes: int | None = None
        ) -> CheckpointStore:
            return RedisStore(
                cluster_url,
                record_ttl_s=record_ttl_s,
                max_record_bytes=max_record_bytes or DEFAULT_MAX_RECORD_BYTES,
            )

        return make

    async def corrupt(
        self, store: CheckpointStore, run_id: str, payload: str, *, step_id: str | None = None
    ) -> None:
        assert isinstance(store, RedisStore)
        client = RedisCluster.from_url(store.raw_url)
        if step_id is None:
            await client.hset(store.keys.run(run_id), "record", payload)
        else:
            await client.hset(store.keys.steps(run_id), step_id, payload)
        await client.aclose()


@pytest.fixture
async def raw(cluster_url: str) -> AsyncIterator[RedisCluster]:
    client = RedisCluster.from_url(cluster_url, decode_responses=True)
    yield client
    await client.aclose()


async def test_the_store_finds_the_cluster_from_one_node(
    redis_cluster: LocalCluster, cluster_url: str, raw: RedisCluster
) -> None:
    """Runs land on every master; a run's keys share one slot; the index sits in its own."""
    # Every node of the cluster works as the URL, whichever it is (a replica included).
    stores = [RedisStore(f"redis://127.0.0.1:{port}/0") for port in redis_cluster.live_ports()]
    ids = [f"spread-{i}" for i in range(60)]
    for i, run_id in enumerate(ids):
        store = stores[i % len(stores)]
        await store.create_run(make_run(run_id, created_at=float(i)))
        await store.commit(run_id, 1, _RUNNING, make_step("a"))
    assert all(store.cluster is True for store in stores)
    listed = [r.run_id for r in await stores[0].list_runs(limit=100)]
    assert listed == ids[::-1]
    masters = set()
    for run_id in ids:
        run_key, steps_key = stores[0].keys.run(run_id), stores[0].keys.steps(run_id)
        assert key_slot(run_key.encode()) == key_slot(steps_key.encode())
        assert await raw.hget(run_key, "status") == "running"
        masters.add(redis_cluster.master_of(run_key))
    assert masters == set(redis_cluster.masters())  # 60 runs spread over all 3 masters
    assert await raw.zcard("chainrt:runs") == len(ids)
    for store in stores:
        await store.close()


async def test_a_url_with_another_database_is_refused(cluster_url: str) -> None:
    store = RedisStore(cluster_url + "/2")
    with pytest.raises(CheckpointError, match="only database 0") as caught:
        await store.get_run("x")
    assert "\n" not in str(caught.value)
    await store.close()


async def test_wait_replicas_waits_for_a_replica(
    redis_cluster: LocalCluster, cluster_url: str, raw: RedisCluster
) -> None:
    store = RedisStore(cluster_url + "/0?wait_replicas=1")
    assert store.wait_replicas == 1
    await store.create_run(make_run())
    master = redis_cluster.master_of(store.keys.run("run-1"))
    await raw.initialize()  # the slot map, to address one node
    node = raw.get_node(host="127.0.0.1", port=master)
    assert node is not None
    before = (await raw.info("commandstats", target_nodes=node)).get("cmdstat_wait", {})
    for i in range(5):
        await store.commit("run-1", 1, _RUNNING, make_step(f"s{i}"))
    after = (await raw.info("commandstats", target_nodes=node))["cmdstat_wait"]
    assert after["calls"] - before.get("calls", 0) == 5  # one WAIT per commit, on that master
    assert len(await store.get_steps("run-1")) == 5
    await store.close()


async def test_too_few_replicas_is_one_clear_line(cluster_url: str) -> None:
    """Each master has one replica: waiting for two can never succeed, and says so."""
    store = RedisStore(cluster_url + "?wait_replicas=2&wait_timeout_ms=50", retry_for_s=0.3)
    with pytest.raises(StoreUnavailable, match="reached 1 of 2 replicas") as caught:
        await store.create_run(make_run())
    assert "\n" not in str(caught.value)
    await store.close()


@pytest.mark.parametrize(
    "query", ["wait_replicas=x", "wait_replicas=99", "wait_timeout_ms=0", "wait_replicas=-1"]
)
def test_bad_wait_options_are_refused(query: str) -> None:
    with pytest.raises(CheckpointError, match="wait_"):
        RedisStore(f"redis://127.0.0.1:1/0?{query}")


async def test_concurrent_creates_on_one_store(cluster_url: str) -> None:
    """One store, many runs at once over all masters (the cluster client is shared)."""
    store = RedisStore(cluster_url)
    await asyncio.gather(*(store.create_run(make_run(f"c{i}")) for i in range(30)))
    assert len(await store.list_runs(limit=50)) == 30
    await store.close()


async def test_the_cluster_client_bounds_its_connections_and_callers_wait_for_one(
    cluster_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """40 blocking commands and 10 pipelines at once on one node through a client of 2
    connections per node: all answered, by turns. redis-py's own client, bounded the same,
    fails the burst at once (MaxConnectionsError): the bound is real and callers wait."""
    monkeypatch.setenv("CHAINRT_REDIS_MAX_CONNECTIONS", "2")
    key = "{bound}:empty"  # one slot: every call goes to one node

    async def burst(client: RedisCluster) -> list[object]:
        async def piped() -> object:
            async with client.pipeline(transaction=False) as pipe:
                pipe.blpop([key], timeout=0.05)
                return (await pipe.execute())[0]

        calls = [client.blpop([key], timeout=0.05) for _ in range(40)]
        return list(await asyncio.gather(*calls, *(piped() for _ in range(10))))

    bounded = cluster_client(cluster_url)
    try:
        assert await burst(bounded) == [None] * 50
        node = bounded.get_node_from_key(key)
        assert node is not None
        assert node.max_connections == 2
    finally:
        await close_client(bounded)
    plain = RedisCluster.from_url(cluster_url, max_connections=2)
    try:
        with pytest.raises(MaxConnectionsError):
            await burst(plain)
    finally:
        await close_client(plain)
