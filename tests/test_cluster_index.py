"""The run index on a real local Redis Cluster: a run's creation writes the run and its index
entry at once (two masters), and a run whose index entry a crash lost is listed again
(``chainrt/store/_cluster_index.py``)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from chainrt.store import RedisStore, RunProgress
from chainrt.testing.redis_cluster import LocalCluster
from chainrt.testing.store_conformance import make_run, make_step

pytestmark = [pytest.mark.redis, pytest.mark.cluster, pytest.mark.slow]

_RUNNING = RunProgress(status="running", budget_used_ms=1.0)


@pytest.fixture
async def raw(cluster_url: str) -> AsyncIterator[RedisCluster]:
    client = RedisCluster.from_url(cluster_url)
    yield client
    await client.aclose()
    await client.nodes_manager.aclose("startup_nodes")  # aclose leaves these open


def _off_the_index(redis_cluster: LocalCluster, store: RedisStore, prefix: str) -> str:
    """A run id whose master is not the index's: its two writes go to two masters."""
    index_master = redis_cluster.master_of(store.keys.index)
    for i in range(100):
        run_id = f"{prefix}-{i}"
        if redis_cluster.master_of(store.keys.run(run_id)) != index_master:
            return run_id
    raise AssertionError("every run id fell on the index's master")


async def test_a_run_whose_index_entry_a_crash_lost_is_listed_again(
    redis_cluster: LocalCluster, cluster_url: str, raw: RedisCluster
) -> None:
    """What a process killed between the two writes leaves: the run, in its slot's `unindexed`
    set, and no index entry. A fresh store's listing puts it back and lists it."""
    store = RedisStore(cluster_url)
    lost = _off_the_index(redis_cluster, store, "lost")
    kept = _off_the_index(redis_cluster, store, "kept")
    await store.create_run(make_run(kept, created_at=1.0))
    await store.commit(kept, 1, _RUNNING, make_step("a"))  # the first commit empties the set
    await store.create_run(make_run(lost, created_at=2.0))
    unindexed = store.keys.unindexed(key_slot(store.keys.run(lost).encode()))
    assert key_slot(unindexed.encode()) == key_slot(store.keys.run(lost).encode())
    assert await raw.smembers(unindexed) == {lost.encode()}
    assert await raw.zscore(store.keys.index, lost) == 2.0  # both writes acknowledged
    await store.close()
    # The index's write lost (the crash): the run and its set entry stay.
    await raw.zrem(store.keys.index, lost)
    assert await raw.exists(store.keys.run(lost)) == 1

    fresh = RedisStore(cluster_url)
    listed = [r.run_id for r in await fresh.list_runs()]
    assert listed == [lost, kept]  # newest first, by the creation time put back
    assert await raw.zscore(store.keys.index, lost) == 2.0
    assert await raw.smembers(unindexed) == set()  # repaired once, not again
    assert (await fresh.get_run(lost)).run_id == lost
    await fresh.close()


async def test_the_first_commit_empties_the_set_and_a_young_orphan_entry_is_kept(
    redis_cluster: LocalCluster, cluster_url: str, raw: RedisCluster
) -> None:
    """Runs created and committed leave no `unindexed` entry. An index entry whose run is not
    there yet (its ZADD beat its script) is skipped while young, dropped once a minute old."""
    store = RedisStore(cluster_url)
    ids = [f"ok-{i}" for i in range(12)]
    for run_id in ids:
        await store.create_run(make_run(run_id))
        await store.commit(run_id, 1, _RUNNING, make_step("a"))
        await store.commit(run_id, 1, _RUNNING, make_step("b"))
    for run_id in ids:
        key = store.keys.unindexed(key_slot(store.keys.run(run_id).encode()))
        assert await raw.exists(key) == 0
    await raw.zadd(store.keys.index, {"young": time.time(), "old": time.time() - 120})
    listed = {r.run_id for r in await store.list_runs()}
    assert listed == set(ids)
    assert await raw.zscore(store.keys.index, "young") is not None
    assert await raw.zscore(store.keys.index, "old") is None
    await store.close()


async def test_a_queued_run_leaves_no_unindexed_entry_and_an_owned_one_waits_for_its_commit(
    redis_cluster: LocalCluster, cluster_url: str, raw: RedisCluster
) -> None:
    """A run created without an owner (queued for a runner elsewhere, as `chainrt serve` creates
    them) is taken out of its slot's set at once: no commit of the creating process will come, and
    a long-lived API process must not remember every run it ever queued. An owned run stays in the
    set (and in the store's memory) until its first commit."""
    store = RedisStore(cluster_url)
    queued = _off_the_index(redis_cluster, store, "queued")
    owned = _off_the_index(redis_cluster, store, "owned")
    await store.create_run(make_run(queued, owner=None, status="queued", token=0))
    await store.create_run(make_run(owned))

    def unindexed(run_id: str) -> str:
        return store.keys.unindexed(key_slot(store.keys.run(run_id).encode()))

    assert await raw.sismember(unindexed(queued), queued) == 0
    assert await raw.sismember(unindexed(owned), owned) == 1
    assert list(store._first_commit) == [owned]
    await store.commit(owned, 1, _RUNNING, make_step("a"))
    assert await raw.sismember(unindexed(owned), owned) == 0
    assert not store._first_commit
    assert {r.run_id for r in await store.list_runs()} == {queued, owned}
    await store.close()


async def test_the_runs_awaiting_their_first_commit_are_bounded_and_the_repair_takes_the_rest(
    redis_cluster: LocalCluster,
    cluster_url: str,
    raw: RedisCluster,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A store remembers at most FIRST_COMMIT_MAX runs it created and has not committed; the
    oldest it forgot stay in their slots' sets until a listing's repair empties them (their
    index entries are there, so nothing is added)."""
    monkeypatch.setattr("chainrt.store._redis.FIRST_COMMIT_MAX", 3)
    store = RedisStore(cluster_url)
    ids = [f"never-committed-{i}" for i in range(5)]
    for i, run_id in enumerate(ids):
        await store.create_run(make_run(run_id, created_at=10.0 + i))
    assert list(store._first_commit) == ids[2:]
    sets = {store.keys.unindexed(key_slot(store.keys.run(r).encode())) for r in ids}
    assert {m for key in sets for m in await raw.smembers(key)} == {r.encode() for r in ids}
    await store.close()

    fresh = RedisStore(cluster_url)
    assert [r.run_id for r in await fresh.list_runs()] == ids[::-1]
    assert {m for key in sets for m in await raw.smembers(key)} == set()
    await fresh.close()


async def test_the_repair_puts_back_every_lost_entry_and_skips_runs_that_are_gone(
    redis_cluster: LocalCluster, cluster_url: str, raw: RedisCluster
) -> None:
    """Several runs lost their index entries (their creation times are read in one pipeline);
    one of them was deleted since, and gets no entry back."""
    store = RedisStore(cluster_url)
    ids = [_off_the_index(redis_cluster, store, f"lost{i}") for i in range(4)]
    for i, run_id in enumerate(ids):
        await store.create_run(make_run(run_id, created_at=100.0 + i))
    await store.close()
    for run_id in ids:
        await raw.zrem(store.keys.index, run_id)
    await raw.delete(store.keys.run(ids[0]), store.keys.steps(ids[0]))

    fresh = RedisStore(cluster_url)
    assert [r.run_id for r in await fresh.list_runs()] == ids[:0:-1]
    scores = [await raw.zscore(store.keys.index, r) for r in ids]
    assert scores == [None, 101.0, 102.0, 103.0]
    await fresh.close()


async def test_a_status_change_whose_lists_move_a_crash_cut_short_is_listed_by_the_repair(
    redis_cluster: LocalCluster, cluster_url: str, raw: RedisCluster
) -> None:
    """A commit to another status writes the run and marks it in its slot's `unindexed` set in
    one script; the sets' move goes to the index's master next. What a process killed between
    the two leaves (the commit script alone, sent here as the store sends it): a fresh store's
    repair moves the run into the sets of its new status, and empties the set."""
    store = RedisStore(cluster_url)
    run_id = _off_the_index(redis_cluster, store, "cut")
    done = _off_the_index(redis_cluster, store, "done")
    for rid, at in ((run_id, 1.0), (done, 2.0)):
        await store.create_run(make_run(rid, chain="alpha", created_at=at))
        await store.commit(rid, 1, _RUNNING, make_step("a"))
    await store.commit(done, 1, RunProgress(status="failed", budget_used_ms=2.0))
    unindexed = store.keys.unindexed(key_slot(store.keys.run(run_id).encode()))
    assert await raw.smembers(unindexed) == set()  # each move acknowledged: taken out again
    failed = store.keys.by_chain_status("alpha", "failed")
    assert await raw.zrange(failed, 0, -1) == [done.encode()]

    final = RunProgress(status="failed", budget_used_ms=3.0, release_owner=True)
    args: list[str | bytes] = ["1", "failed", final.model_dump_json(), repr(time.time())]
    args += ["", b"", "1", "0", "", b"", "0", run_id]
    keys = [store.keys.run(run_id), store.keys.steps(run_id), unindexed]
    assert await store._script("commit_marked", keys, args) == 0  # and then the crash
    await store.close()
    assert await raw.smembers(unindexed) == {run_id.encode()}
    assert await raw.zrange(failed, 0, -1) == [done.encode()]  # not moved

    fresh = RedisStore(cluster_url)
    listed = await fresh.list_runs("failed", chain="alpha")  # its first call repairs
    assert [r.run_id for r in listed] == [done, run_id]
    assert [r.run_id for r in await fresh.list_runs("failed")] == [done, run_id]
    assert await raw.smembers(unindexed) == set()
    assert await fresh.list_runs("running", chain="alpha") == []  # the old entry is skipped
    await fresh.close()
