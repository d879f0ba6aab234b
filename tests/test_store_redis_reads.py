"""The Redis store's reads on the pipe (chainrt/store/_redis_client.py ``_read_fast`` and
``_transaction_fast``): a run's record and its steps are read raw off a bare connection, as
RESP2 and as RESP3 replies; a read whose pipe is cut goes again through the client; a key of
another type is a corrupt record, as it was through the client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
import test_store_redis
from redis.exceptions import ConnectionError as RedisConnectionError

from chainrt._errors import CorruptRecord, RunNotFound
from chainrt._records import RunProgress
from chainrt.redis import pack
from chainrt.store import DEFAULT_MAX_RECORD_BYTES, CheckpointStore, RedisStore
from chainrt.testing.store_conformance import StoreFactory, make_run, make_step

_RUNNING = RunProgress(status="running", budget_used_ms=1.0)


class TestRedisStoreResp3(test_store_redis.TestRedisStore):
    """Every conformance test with the store's connections speaking RESP3 (``protocol=3``):
    a hash read on the pipe is then a map, not a flat list."""

    @pytest.fixture
    def make_store(self, redis_url: str) -> StoreFactory:
        async def make(
            *, record_ttl_s: float | None = None, max_record_bytes: int | None = None
        ) -> CheckpointStore:
            return RedisStore(
                f"{redis_url}?protocol=3",
                record_ttl_s=record_ttl_s,
                max_record_bytes=max_record_bytes or DEFAULT_MAX_RECORD_BYTES,
            )

        return make


@pytest.fixture(params=["2", "3"])
async def rstore(redis_url: str, request: pytest.FixtureRequest) -> AsyncIterator[RedisStore]:
    store = RedisStore(f"{redis_url}?protocol={request.param}", record_ttl_s=60)
    yield store
    await store.close()


@pytest.fixture
async def raw(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    await client.aclose()


async def test_reads_go_on_the_pipe_the_commits_use(rstore: RedisStore) -> None:
    await rstore.create_run(make_run())
    await rstore.commit("run-1", 1, _RUNNING, make_step())
    pipe_id = await rstore._fast.pipelined(pack("CLIENT", "ID"))
    record, steps = await asyncio.gather(rstore.get_run("run-1"), rstore.get_steps("run-1"))
    assert (record.run_id, record.status, set(steps)) == ("run-1", "running", {"intent"})
    assert steps["intent"].output == make_step().output
    # The same connection served them: no other was opened for the reads.
    assert await rstore._fast.pipelined(pack("CLIENT", "ID")) == pipe_id


async def test_a_read_whose_pipe_was_cut_goes_again(
    rstore: RedisStore, raw: aioredis.Redis
) -> None:
    """The pipe's connection killed with reads in flight on it: they go again through the
    client and answer what the store holds."""
    await rstore.create_run(make_run())
    await rstore.commit("run-1", 1, _RUNNING, make_step())
    conn_id = await rstore._fast.pipelined(pack("CLIENT", "ID"))
    # A blocked command ahead of them: Redis leaves the reads unread until the kill drops them.
    held = asyncio.ensure_future(rstore._fast.pipelined(pack("BLPOP", "never", "0")))
    await asyncio.sleep(0.05)
    reading = asyncio.ensure_future(
        asyncio.gather(rstore.get_run("run-1"), rstore.get_steps("run-1"))
    )
    await asyncio.sleep(0.05)
    assert not reading.done()
    await raw.client_kill_filter(_id=conn_id)
    record, steps = await reading
    assert (record.status, set(steps)) == ("running", {"intent"})
    with pytest.raises(RedisConnectionError):
        await held


async def test_a_run_with_no_steps_and_a_missing_run(rstore: RedisStore) -> None:
    await rstore.create_run(make_run())
    await rstore.get_run("run-1")  # the pipe is open: the steps are read on it
    assert await rstore.get_steps("run-1") == {}
    with pytest.raises(RunNotFound):
        await rstore.get_steps("nope")
    with pytest.raises(RunNotFound):
        await rstore.get_run("nope")


async def test_keys_of_another_type_are_corrupt(rstore: RedisStore, raw: aioredis.Redis) -> None:
    await rstore.create_run(make_run())
    await rstore.get_run("run-1")  # the pipe is open
    await raw.delete("chainrt:{run-1}:steps")
    await raw.set("chainrt:{run-1}:steps", "a string, not a hash")
    with pytest.raises(CorruptRecord, match=r"chainrt:\{run-1\}:steps"):
        await rstore.get_steps("run-1")
    await raw.set("chainrt:{x}:run", "a string, not a hash")
    with pytest.raises(CorruptRecord, match=r"chainrt:\{x\}:run"):
        await rstore.get_run("x")
    # The pipe still works after the refusals.
    assert (await rstore.get_run("run-1")).run_id == "run-1"
