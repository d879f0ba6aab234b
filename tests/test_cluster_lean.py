"""The bare-connection hot path on a Redis Cluster (chainrt.redis._cluster_lean): commits and
limiter scripts go to the master of their slot, and a moved slot, a slot mid-migration or a lost
connection sends the call through the cluster client, which follows it. A real local cluster."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from redis.crc import key_slot

from chainrt.concurrency import KeyRequest, RedisLimiter
from chainrt.redis.keys import LIMITER_PREFIX, key_names
from chainrt.store import RedisStore, RunProgress
from chainrt.testing.redis_cluster import LocalCluster
from chainrt.testing.reshard import migrate_slot
from chainrt.testing.store_conformance import make_run, make_step

pytestmark = [pytest.mark.redis, pytest.mark.cluster]

_RUNNING = RunProgress(status="running", budget_used_ms=1.0)


def _errors(port: int, name: str) -> int:
    node = redis.Redis(host="127.0.0.1", port=port)
    try:
        stats = node.info("errorstats")
    finally:
        node.close()
    return int(stats.get(f"errorstat_{name}", {}).get("count", 0))


def _other_master(cluster: LocalCluster, port: int) -> int:
    return next(p for p in cluster.masters() if p != port)


@pytest.fixture
def moved_back(redis_cluster: LocalCluster) -> Iterator[list[tuple[int, int]]]:
    """Slots a test moved, ``(slot, original master)``: put back afterwards, so that the
    session's cluster keeps its layout for the next tests."""
    moved: list[tuple[int, int]] = []
    yield moved
    for slot, port in reversed(moved):
        migrate_slot(redis_cluster, slot, port, pause_s=0)


async def _commit(store: RedisStore, run_id: str, step_id: str) -> None:
    await store.commit(run_id, 1, _RUNNING, make_step(step_id))


async def test_commits_go_to_each_runs_master_on_bare_connections(
    redis_cluster: LocalCluster, cluster_url: str
) -> None:
    store = RedisStore(cluster_url)
    try:
        run_ids = [f"lean-{i}" for i in range(12)]
        for run_id in run_ids:
            await store.create_run(make_run(run_id))
        for run_id in run_ids:
            await _commit(store, run_id, "s1")
        for run_id in run_ids:
            assert list(await store.get_steps(run_id)) == ["s1"]
        masters = redis_cluster.masters()
        used = {redis_cluster.master_of(store.keys.run(r), masters) for r in run_ids}
        assert store._masters is not None
        assert {int(name.rsplit(":", 1)[1]) for name in store._masters._nodes} == used
    finally:
        await store.close()


async def test_a_moved_slot_is_followed_then_its_new_master_is_used(
    redis_cluster: LocalCluster, cluster_url: str, moved_back: list[tuple[int, int]]
) -> None:
    store = RedisStore(cluster_url)
    try:
        await store.create_run(make_run("mover"))
        await _commit(store, "mover", "s1")  # the map now routes the run to its master
        key = store.keys.run("mover")
        source = redis_cluster.master_of(key)
        target = _other_master(redis_cluster, source)
        slot = key_slot(key.encode())
        migrate_slot(redis_cluster, slot, target, pause_s=0)
        moved_back.append((slot, source))
        before = _errors(source, "MOVED")
        # The old master answers MOVED (to the bare call, then to the cluster client, whose map
        # is as old): the client follows it and patches its map.
        await _commit(store, "mover", "s2")
        after = _errors(source, "MOVED")
        assert after > before
        await _commit(store, "mover", "s3")  # routed by the patched map: the new master
        assert _errors(source, "MOVED") == after
        assert sorted(await store.get_steps("mover")) == ["s1", "s2", "s3"]
    finally:
        await store.close()


async def test_a_slot_mid_migration_is_followed_with_asking(
    redis_cluster: LocalCluster, cluster_url: str, moved_back: list[tuple[int, int]]
) -> None:
    store = RedisStore(cluster_url)
    key = store.keys.run("asked")
    source = redis_cluster.master_of(key)
    target = _other_master(redis_cluster, source)
    slot = key_slot(key.encode())
    src = redis.Redis(host="127.0.0.1", port=source)
    dst = redis.Redis(host="127.0.0.1", port=target)
    try:
        await store.create_run(make_run("asked"))
        await _commit(store, "asked", "s1")
        src_id = src.execute_command("CLUSTER", "MYID").decode()  # type: ignore[no-untyped-call]
        dst_id = dst.execute_command("CLUSTER", "MYID").decode()  # type: ignore[no-untyped-call]
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)  # type: ignore[no-untyped-call]
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)  # type: ignore[no-untyped-call]
        moved_back.append((slot, source))
        for name in (store.keys.run("asked"), store.keys.steps("asked")):
            src.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", name)  # type: ignore[no-untyped-call]
        before = _errors(source, "ASK")
        await _commit(store, "asked", "s2")  # source: ASK; the cluster client sends ASKING first
        assert _errors(source, "ASK") > before
        # Reads follow the migration too: inspect and resume read a run while its slot moves.
        assert sorted(await store.get_steps("asked")) == ["s1", "s2"]
        assert (await store.get_run("asked")).run_id == "asked"
        for port in redis_cluster.masters():
            node = redis.Redis(host="127.0.0.1", port=port)
            node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)  # type: ignore[no-untyped-call]
            node.close()
        assert sorted(await store.get_steps("asked")) == ["s1", "s2"]
    finally:
        src.close()
        dst.close()
        await store.close()


async def test_a_lost_connection_sends_the_commit_through_the_cluster_client(
    redis_cluster: LocalCluster, cluster_url: str
) -> None:
    store = RedisStore(cluster_url)
    try:
        await store.create_run(make_run("cut"))
        await _commit(store, "cut", "s1")
        port = redis_cluster.master_of(store.keys.run("cut"))
        node = redis.Redis(host="127.0.0.1", port=port)
        try:
            node.client_kill_filter(_type="normal", skipme=True)  # every client's connection
        finally:
            node.close()
        await _commit(store, "cut", "s2")  # the bare connection is dead: sent again, written
        await _commit(store, "cut", "s3")  # a new bare connection
        assert sorted(await store.get_steps("cut")) == ["s1", "s2", "s3"]
    finally:
        await store.close()


async def test_the_limiter_follows_a_moved_key(
    redis_cluster: LocalCluster, cluster_url: str, moved_back: list[tuple[int, int]]
) -> None:
    limiter = RedisLimiter.from_url(cluster_url, lease_ttl_s=5.0)
    try:
        held = await limiter.acquire([KeyRequest("moving", 1)], timeout_s=2, holder="a")
        await held.release()
        holders = key_names(LIMITER_PREFIX, "moving")[0]
        source = redis_cluster.master_of(holders)
        target = _other_master(redis_cluster, source)
        slot = key_slot(holders.encode())
        migrate_slot(redis_cluster, slot, target, pause_s=0)
        moved_back.append((slot, source))
        # The old master answers MOVED to the bare call: sent again through the cluster client.
        held = await limiter.acquire([KeyRequest("moving", 1)], timeout_s=5, holder="b")
        assert (await limiter.snapshot("moving")).holders == ("b",)
        await held.release()
        assert (await limiter.snapshot("moving")).holders == ()
    finally:
        await limiter.close()
