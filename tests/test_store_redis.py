"""The Redis checkpoint store: the shared conformance suite, plus the Redis layout contract."""

from __future__ import annotations

import asyncio
import gc
import shutil
import socket
import subprocess
import time
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError

from chainrt._errors import CheckpointError, CorruptRecord, StoreUnavailable
from chainrt.redis import pack
from chainrt.store import (
    DEFAULT_MAX_RECORD_BYTES,
    CheckpointStore,
    OwnerLease,
    RedisStore,
    RunProgress,
    SQLiteStore,
    open_store,
    redact_url,
)
from chainrt.testing.redis_server import RedisServer, free_port
from chainrt.testing.store_conformance import StoreConformance, StoreFactory, make_run, make_step

pytestmark = pytest.mark.redis

_RUNNING = RunProgress(status="running", budget_used_ms=1.0)
_DONE = RunProgress(status="completed", budget_used_ms=2.0, release_owner=True)


class TestRedisStore(StoreConformance):
    """Every conformance test, against the session's private redis-server (flushed per test)."""

    @pytest.fixture
    def make_store(self, redis_url: str) -> StoreFactory:
        async def make(
            *, record_ttl_s: float | None = None, max_record_bytes: int | None = None
        ) -> CheckpointStore:
            return RedisStore(
                redis_url,
                record_ttl_s=record_ttl_s,
                max_record_bytes=max_record_bytes or DEFAULT_MAX_RECORD_BYTES,
            )

        return make

    async def corrupt(
        self, store: CheckpointStore, run_id: str, payload: str, *, step_id: str | None = None
    ) -> None:
        assert isinstance(store, RedisStore)
        client = aioredis.Redis.from_url(store.raw_url)
        if step_id is None:
            await client.hset(store.keys.run(run_id), "record", payload)
        else:
            await client.hset(store.keys.steps(run_id), step_id, payload)
        await client.aclose()


@pytest.fixture
async def raw(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    await client.aclose()


@pytest.fixture
async def rstore(redis_url: str) -> AsyncIterator[RedisStore]:
    store = RedisStore(redis_url, record_ttl_s=60)
    yield store
    await store.close()


async def test_key_layout_and_one_cluster_slot(rstore: RedisStore, raw: aioredis.Redis) -> None:
    await rstore.create_run(make_run("r:1"))
    await rstore.commit("r:1", 1, _RUNNING, make_step("a"))
    lists = rstore.keys
    keys = ["chainrt:runs", "chainrt:{r:1}:run", "chainrt:{r:1}:steps"]
    keys += [lists.by_status("running"), lists.by_chain("support_agent"), lists.chains]
    keys.append(lists.by_chain_status("support_agent", "running"))
    assert sorted(await raw.keys("*")) == sorted(keys)
    fields = await raw.hgetall("chainrt:{r:1}:run")
    assert (fields["status"], fields["token"]) == ("running", "1")
    assert (fields["owner_host"], fields["owner_pid"]) == ("host-a", "4242")
    assert list(await raw.hkeys("chainrt:{r:1}:steps")) == ["a"]
    assert await raw.zscore("chainrt:runs", "r:1") == make_run().created_at
    assert key_slot(b"chainrt:{r:1}:run") == key_slot(b"chainrt:{r:1}:steps")


async def test_final_status_sets_ttl_on_every_key_of_the_run(
    rstore: RedisStore, raw: aioredis.Redis
) -> None:
    await rstore.create_run(make_run())
    await rstore.commit("run-1", 1, _RUNNING, make_step())
    assert await raw.pttl("chainrt:{run-1}:run") == -1  # running runs never expire
    await rstore.commit("run-1", 1, _DONE.model_copy(update={"status": "partial"}))
    for key in ("chainrt:{run-1}:run", "chainrt:{run-1}:steps"):
        assert 59_000 < await raw.pttl(key) <= 60_000
    lease = OwnerLease(host="b", pid=1, token=2, expires_at=time.time() + 10)
    await rstore.claim("run-1", 1, lease)  # resumed: it must not vanish while it runs again
    assert await raw.pttl("chainrt:{run-1}:run") == -1
    assert await raw.pttl("chainrt:{run-1}:steps") == -1


async def test_commit_is_one_round_trip(rstore: RedisStore, raw: aioredis.Redis) -> None:
    await rstore.create_run(make_run())
    await rstore.commit("run-1", 1, _RUNNING, make_step())  # loads the script
    await raw.config_resetstat()
    await rstore.commit("run-1", 1, _RUNNING, make_step("b"))
    stats = await raw.info("commandstats")  # counts the commands the script ran, too
    commands = {name for name in stats if not name.startswith("cmdstat_config")}
    assert commands == {"cmdstat_evalsha", "cmdstat_hmget", "cmdstat_hset"}
    assert stats["cmdstat_evalsha"]["calls"] == 1


async def test_script_cache_flushed_is_reloaded(rstore: RedisStore, raw: aioredis.Redis) -> None:
    await rstore.create_run(make_run())
    await raw.script_flush()  # what a restart or failover does to the script cache
    await rstore.commit("run-1", 1, _RUNNING, make_step())
    assert set(await rstore.get_steps("run-1")) == {"intent"}
    await raw.script_flush()
    await rstore.create_run(make_run("run-2"))
    assert (await rstore.get_run("run-2")).status == "running"


async def test_a_commit_whose_pipe_was_cut_goes_again(
    rstore: RedisStore, raw: aioredis.Redis
) -> None:
    """The pipe's connection killed with a commit in flight on it: the commit (its outcome
    unknown) goes again through the client, and the next one opens a new pipe."""
    await rstore.create_run(make_run())
    conn_id = await rstore._fast.pipelined(pack("CLIENT", "ID"))
    # A blocked command ahead of it: Redis leaves the commit unread until the kill drops it,
    # so only a commit sent again can land.
    held = asyncio.ensure_future(rstore._fast.pipelined(pack("BLPOP", "never", "0")))
    await asyncio.sleep(0.05)
    committing = asyncio.ensure_future(rstore.commit("run-1", 1, _RUNNING, make_step()))
    await asyncio.sleep(0.05)
    assert not committing.done()
    await raw.client_kill_filter(_id=conn_id)
    await committing
    with pytest.raises(RedisConnectionError):
        await held
    assert set(await rstore.get_steps("run-1")) == {"intent"}
    await rstore.commit("run-1", 1, _RUNNING, make_step("answer"))
    assert set(await rstore.get_steps("run-1")) == {"intent", "answer"}
    assert await rstore._fast.pipelined(pack("CLIENT", "ID")) != conn_id


async def test_retried_claim_succeeds(rstore: RedisStore) -> None:
    await rstore.create_run(make_run())
    lease = OwnerLease(host="b", pid=7, token=2, expires_at=time.time() + 10)
    assert await rstore.claim("run-1", 1, lease) == 2
    # The same claim sent again (its reply was lost) finds its own write.
    assert await rstore.claim("run-1", 1, lease.model_copy()) == 2
    assert (await rstore.get_run("run-1")).fencing_token == 2


async def test_wrong_type_key_is_corrupt(rstore: RedisStore, raw: aioredis.Redis) -> None:
    await raw.set("chainrt:{x}:run", "a string, not a hash")
    with pytest.raises(CorruptRecord, match=r"chainrt:\{x\}:run"):
        await rstore.get_run("x")


async def test_missing_fields_are_corrupt(rstore: RedisStore, raw: aioredis.Redis) -> None:
    await raw.hset("chainrt:{x}:run", mapping={"status": "running"})
    with pytest.raises(CorruptRecord, match=r"'x'.*missing"):
        await rstore.get_run("x")
    await rstore.create_run(make_run("y"))
    await raw.hset("chainrt:{y}:run", "status", "exploded")
    with pytest.raises(CorruptRecord, match="unknown status 'exploded'"):
        await rstore.get_run("y")


async def test_stale_index_entries_are_dropped(rstore: RedisStore, raw: aioredis.Redis) -> None:
    await rstore.create_run(make_run("a", created_at=1.0))
    await rstore.create_run(make_run("b", created_at=2.0))
    await raw.delete("chainrt:{b}:run")  # as if its TTL had passed
    assert [r.run_id for r in await rstore.list_runs()] == ["a"]
    assert await raw.zrange("chainrt:runs", 0, -1) == ["a"]


async def test_key_prefix(redis_url: str, raw: aioredis.Redis) -> None:
    store = RedisStore(redis_url, key_prefix="tenant7")
    await store.create_run(make_run())
    await store.close()
    lists = store.keys
    keys = ["tenant7:runs", "tenant7:{run-1}:run", lists.by_status("running"), lists.chains]
    keys += [lists.by_chain("support_agent"), lists.by_chain_status("support_agent", "running")]
    assert sorted(await raw.keys("*")) == sorted(keys)
    assert all(key.startswith("tenant7:") for key in keys)


@pytest.fixture(scope="module")
def secured() -> Iterator[RedisServer]:
    with RedisServer(password="s3cr3t-pw") as server:
        yield server


async def test_password_and_db_number(secured: RedisServer) -> None:
    url = f"redis://:s3cr3t-pw@127.0.0.1:{secured.port}/3"
    store = open_store(url)
    assert isinstance(store, RedisStore)
    assert store.url == f"redis://:***@127.0.0.1:{secured.port}/3"
    await store.create_run(make_run())
    await store.close()
    db3 = aioredis.Redis(port=secured.port, password="s3cr3t-pw", db=3)
    db0 = aioredis.Redis(port=secured.port, password="s3cr3t-pw", db=0)
    try:
        assert await db3.exists("chainrt:{run-1}:run") == 1
        assert await db0.dbsize() == 0
        await db3.flushdb()
    finally:
        await db3.aclose()
        await db0.aclose()


def test_open_store_picks_the_backend(tmp_path: object) -> None:
    assert isinstance(open_store("redis://127.0.0.1:1/0"), RedisStore)
    assert isinstance(open_store("sqlite:///:memory:"), SQLiteStore)
    with pytest.raises(CheckpointError, match=r"mysql://u:\*\*\*@h/db.*sqlite:///.*redis://"):
        open_store("mysql://u:pw@h/db")
    bad_urls = ("redis://h:1/notanumber", "redis://h:1/0?decode_responses=true", "redis://h/0?x=1")
    for bad in bad_urls:
        with pytest.raises(CheckpointError, match="invalid Redis store URL"):
            open_store(bad)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:pw@h:1/0", "redis://:***@h:1/0"),
        ("redis://user:pw@h:1/0", "redis://user:***@h:1/0"),
        ("rediss://default:p%40ss@h:6380/2", "rediss://default:***@h:6380/2"),
        (
            "redis://h:1/0?password=pw&socket_timeout=1",
            "redis://h:1/0?password=***&socket_timeout=1",
        ),
        ("redis://h:1/0", "redis://h:1/0"),
        ("sqlite:///a/b.db", "sqlite:///a/b.db"),
        ("redis://:pw@h:notaport/0", "***@h:notaport/0"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_one_store_across_event_loops(redis_url: str) -> None:
    # The sync API runs each call in its own asyncio.run: the store must follow the loop.
    store = RedisStore(redis_url)
    with warnings.catch_warnings():
        # A finished loop's sockets can only be reclaimed by the garbage collector.
        warnings.simplefilter("ignore", ResourceWarning)
        asyncio.run(store.create_run(make_run()))
        assert asyncio.run(store.get_run("run-1")).run_id == "run-1"
        asyncio.run(store.close())
        gc.collect()
    with pytest.raises(CheckpointError, match="closed"):
        asyncio.run(store.get_run("run-1"))


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    """A redis-server speaking only TLS (self-signed certificate), with a password."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    tmp = tmp_path_factory.mktemp("tls")
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    port = free_port()
    server = subprocess.Popen(
        ["redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-ca-cert-file", str(cert),
         "--tls-auth-clients", "no", "--requirepass", "tls-pw", "--save", "", "--appendonly", "no",
         "--dir", str(tmp)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2) as probe:
                    if probe.getsockname() == probe.getpeername():  # joined to itself: not up
                        raise ConnectionRefusedError
                break
            except OSError:
                assert time.monotonic() < deadline, "TLS redis-server did not start"
                time.sleep(0.02)
        yield port, cert
    finally:
        server.kill()
        server.wait()


async def test_rediss_url_speaks_tls(tls_redis: tuple[int, Path]) -> None:
    port, cert = tls_redis
    store = open_store(f"rediss://:tls-pw@127.0.0.1:{port}/0?ssl_ca_certs={cert}")
    assert store.url == f"rediss://:***@127.0.0.1:{port}/0?ssl_ca_certs={cert}"
    await store.create_run(make_run())
    assert (await store.get_run("run-1")).chain == "support_agent"
    await store.close()
    plain = RedisStore(f"redis://:tls-pw@127.0.0.1:{port}/0", retry_for_s=0.2)
    with pytest.raises(StoreUnavailable):  # a plain-text client cannot talk to it
        await plain.get_run("run-1")
    await plain.close()


async def test_runs_of_an_older_version_are_put_into_the_status_and_chain_lists(
    rstore: RedisStore, raw: aioredis.Redis
) -> None:
    # Runs written before the status and chain sets existed: the sets and the marker removed.
    for i in range(5):
        await rstore.create_run(make_run(f"old{i}", chain=f"c{i % 2}", created_at=100.0 + i))
    await rstore.commit("old3", 1, RunProgress(status="failed", budget_used_ms=1.0))
    keys = rstore.keys
    await raw.delete(*keys.status_sets(), keys.by_chain("c0"), keys.by_chain("c1"), keys.chains)
    await raw.delete(*keys.chain_status_sets("c0"), *keys.chain_status_sets("c1"))
    await raw.delete(keys.lists_marker)
    fresh = RedisStore(rstore.raw_url)
    try:
        # The first filtered page finds no marker and indexes every run once.
        assert [r.run_id for r in await fresh.list_runs(chain="c0")] == ["old4", "old2", "old0"]
        assert [r.run_id for r in await fresh.list_runs("failed")] == ["old3"]
        assert [r.run_id for r in await fresh.list_runs("running", chain="c1")] == ["old1"]
        assert await raw.exists(keys.lists_marker)
        assert await raw.zcard(keys.by_status("running")) == 4
        assert await raw.zrange(keys.by_chain_status("c1", "failed"), 0, -1) == ["old3"]
    finally:
        await fresh.close()


async def test_a_step_commit_leaves_the_lists_alone_and_a_final_one_moves_the_run(
    rstore: RedisStore, raw: aioredis.Redis
) -> None:
    # The step commit's script is the one it was: only a change of status touches the sets.
    await rstore.create_run(make_run("s1", chain="alpha"))
    keys = rstore.keys
    running = keys.by_status("running")
    assert await raw.zrange(running, 0, -1) == ["s1"]
    await raw.zrem(running, "s1")  # were a step commit to write the set, it would be back
    await rstore.commit("s1", 1, RunProgress(status="running", budget_used_ms=1.0), make_step())
    assert await raw.zrange(running, 0, -1) == []
    await raw.zadd(running, {"s1": 1.0})
    await rstore.commit("s1", 1, RunProgress(status="completed", budget_used_ms=2.0))
    assert await raw.zrange(running, 0, -1) == []
    assert await raw.zrange(keys.by_status("completed"), 0, -1) == ["s1"]
    assert await raw.zrange(keys.by_chain("alpha"), 0, -1) == ["s1"]
    assert await raw.zrange(keys.by_chain_status("alpha", "completed"), 0, -1) == ["s1"]
    assert await raw.zrange(keys.by_chain_status("alpha", "running"), 0, -1) == []


async def _calls(raw: aioredis.Redis) -> dict[str, int]:
    """Calls per command so far (INFO commandstats)."""
    stats = await raw.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


async def test_a_page_of_both_filters_walks_one_set_and_reads_only_what_it_returns(
    rstore: RedisStore, raw: aioredis.Redis
) -> None:
    # 40 runs of c3 (none failed), 40 failed runs of c2: a page of c3 and failed matches none.
    # Walking either filter's set and checking the other read 40 ids (100,000 runs: 10,000,
    # 11x an unfiltered page in bench/list_filters.py); the chain-status set holds none.
    for i in range(80):
        await rstore.create_run(make_run(f"r{i}", chain=f"c{2 + i % 2}", created_at=100.0 + i))
        if i % 2 == 0:
            await rstore.commit(f"r{i}", 1, RunProgress(status="failed", budget_used_ms=1.0))
    assert len(await rstore.list_runs("failed", 50, chain="c2")) == 40  # (indexes ready)
    before = await _calls(raw)
    assert await rstore.list_runs("failed", 50, chain="c3") == []
    page = await rstore.list_runs("failed", 10, chain="c2")
    after = await _calls(raw)
    assert [r.run_id for r in page] == [f"r{i}" for i in range(78, 58, -2)]
    calls = {name: after[name] - before.get(name, 0) for name in after}
    assert calls.get("zrevrange") == 2  # one walk per page, of one set
    assert calls.get("hgetall") == 10  # the records of the page, no other
    assert calls.get("zmscore", 0) == 0


async def test_a_store_that_never_saw_the_run_reads_its_chain_to_move_it(
    redis_url: str, rstore: RedisStore, raw: aioredis.Redis
) -> None:
    await rstore.create_run(make_run("x1", chain="beta", token=0, status="queued", owner=None))
    other = RedisStore(redis_url)  # another process: neither created nor read the run
    try:
        await other.claim("x1", 0, OwnerLease(host="h", pid=1, token=1, expires_at=time.time()))
        keys = rstore.keys
        assert await raw.zrange(keys.by_chain_status("beta", "running"), 0, -1) == ["x1"]
        assert await raw.zrange(keys.by_chain_status("beta", "queued"), 0, -1) == []
        fresh = RedisStore(redis_url)
        await fresh.commit("x1", 1, RunProgress(status="partial", budget_used_ms=1.0))
        await fresh.close()
        assert await raw.zrange(keys.by_chain_status("beta", "partial"), 0, -1) == ["x1"]
        assert await raw.zrange(keys.by_chain_status("beta", "running"), 0, -1) == []
        assert [r.run_id for r in await other.list_runs("partial", chain="beta")] == ["x1"]
    finally:
        await other.close()
