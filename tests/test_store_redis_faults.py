"""The Redis store when Redis fails: restarts mid-run, outages, a hung server, bad credentials.

The restart tests run their own ``RedisServer(durable=True)`` (``appendfsync always``; the
session server keeps nothing across a restart): a commit that returned must survive a ``kill -9``
of Redis.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from chainrt._errors import StoreUnavailable
from chainrt.store import RedisStore, RunProgress
from chainrt.testing.redis_server import RedisServer, free_port
from chainrt.testing.store_conformance import make_run, make_step

pytestmark = pytest.mark.redis

PASSWORD = "fault-pw-123"


@pytest.fixture
def durable() -> Iterator[RedisServer]:
    with RedisServer(password=PASSWORD, durable=True) as server:
        yield server


def _progress(k: int) -> RunProgress:
    return RunProgress(status="running", budget_used_ms=float(k), stopped_at=f"s{k}")


async def _check_nothing_lost(url: str, acked: dict[str, list[int]]) -> None:
    """Every acknowledged commit is there, whole; progress matches the newest step present."""
    store = RedisStore(url)
    try:
        for run_id, done in acked.items():
            steps = await store.get_steps(run_id)
            present = sorted(int(step_id[1:]) for step_id in steps)
            assert set(done) <= set(present), f"{run_id}: acknowledged steps lost"
            for k in present:
                assert steps[f"s{k}"] == make_step(f"s{k}", output=k)
            run = await store.get_run(run_id)
            # Step and progress are written together: the newest progress is the newest step.
            assert run.budget_used_ms == float(max(present))
            assert run.stopped_at == f"s{max(present)}"
    finally:
        await store.close()


async def test_restart_mid_commits_loses_no_acknowledged_step(durable: RedisServer) -> None:
    store = RedisStore(durable.url, retry_for_s=8.0, socket_timeout_s=1.0)
    runs = [f"run-{i}" for i in range(4)]
    for run_id in runs:
        await store.create_run(make_run(run_id))
    acked: dict[str, list[int]] = {run_id: [] for run_id in runs}
    failed: list[StoreUnavailable] = []
    half_way = asyncio.Event()

    async def committer(run_id: str) -> None:
        for k in range(120):
            if k == 40:
                half_way.set()
            try:
                await store.commit(run_id, 1, _progress(k), make_step(f"s{k}", output=k))
                acked[run_id].append(k)
            except StoreUnavailable as exc:
                failed.append(exc)
            await asyncio.sleep(0.001)

    async def chaos() -> int:
        await half_way.wait()
        durable.kill()
        before = sum(map(len, acked.values()))
        await asyncio.sleep(0.3)
        await asyncio.to_thread(durable.start)
        return before

    chaos_task = asyncio.create_task(chaos())
    await asyncio.gather(*(committer(r) for r in runs))
    acked_before_kill = await chaos_task
    await store.close()
    total = sum(map(len, acked.values()))
    assert 0 < acked_before_kill < total  # the outage really fell in the middle
    # The retry window (8 s) covers the restart: every commit ended up acknowledged.
    assert failed == []
    assert all(done == list(range(120)) for done in acked.values())
    await _check_nothing_lost(durable.url, acked)


async def test_outage_longer_than_retry_window(durable: RedisServer) -> None:
    store = RedisStore(durable.url, retry_for_s=0.3, socket_timeout_s=0.5)
    await store.create_run(make_run())
    await store.commit("run-1", 1, _progress(0), make_step("s0", output=0))
    durable.kill()
    with pytest.raises(StoreUnavailable) as info:
        await store.commit("run-1", 1, _progress(1), make_step("s1", output=1))
    error = info.value
    assert error.retryable
    assert f"redis://:***@127.0.0.1:{durable.port}/0" in str(error)
    assert PASSWORD not in str(error)
    assert "\n" not in str(error)
    durable.start()
    # The caller retries the very same commit once Redis is back: safe, and nothing is lost.
    await store.commit("run-1", 1, _progress(1), make_step("s1", output=1))
    await store.close()
    await _check_nothing_lost(durable.url, {"run-1": [0, 1]})


async def test_hung_redis_times_out_then_recovers(durable: RedisServer) -> None:
    store = RedisStore(durable.url, retry_for_s=0.4, socket_timeout_s=0.2)
    await store.create_run(make_run())
    assert durable.process is not None
    durable.process.send_signal(signal.SIGSTOP)
    try:
        with pytest.raises(StoreUnavailable, match="unreachable"):
            await store.get_run("run-1")
    finally:
        durable.process.send_signal(signal.SIGCONT)
    assert (await store.get_run("run-1")).run_id == "run-1"
    await store.commit("run-1", 1, _progress(3), make_step("s3", output=3))
    await store.close()
    await _check_nothing_lost(durable.url, {"run-1": [3]})


async def test_redis_down_at_open_is_one_clear_line() -> None:
    port = free_port()  # nothing listens here
    store = RedisStore(f"redis://:hunter2@127.0.0.1:{port}/0", retry_for_s=0.2)
    with pytest.raises(StoreUnavailable) as info:
        await store.get_run("run-1")
    await store.close()
    message = str(info.value)
    assert message.startswith(f"the Redis store redis://:***@127.0.0.1:{port}/0 is unreachable")
    assert "hunter2" not in message
    assert "\n" not in message
    assert info.value.retryable


@pytest.fixture(scope="module")
def secured() -> Iterator[RedisServer]:
    with RedisServer(password="right-pw") as server:
        yield server


@pytest.mark.parametrize("auth", [":wrong-pw@", ""])
async def test_bad_credentials_are_not_retried(secured: RedisServer, auth: str) -> None:
    store = RedisStore(f"redis://{auth}127.0.0.1:{secured.port}/0", retry_for_s=30.0)
    with pytest.raises(StoreUnavailable, match="password") as info:
        await store.create_run(make_run())
    await store.close()
    assert not info.value.retryable  # and it came at once, not after 30 s of retries
    assert "wrong-pw" not in str(info.value)


async def test_an_attribute_error_inside_redis_py_is_retried_but_ours_is_not() -> None:
    # redis-py's async cluster client can hit a connection a failover just closed and raise
    # AttributeError ('NoneType' object has no attribute 'writelines') before writing: retried.
    import types

    from chainrt.store._redis_client import _is_transient

    def send(writer: Any) -> None:
        writer.writelines([])

    def inside_redis_py() -> AttributeError:
        # The same function, run with redis-py's module name as its globals: a redis.* frame.
        in_redis = types.FunctionType(send.__code__, {"__name__": "redis.asyncio.connection"})
        try:
            in_redis(None)
        except AttributeError as exc:
            return exc
        raise AssertionError("no AttributeError")

    def ours() -> AttributeError:
        try:
            send(None)
        except AttributeError as exc:
            return exc
        raise AssertionError("no AttributeError")

    assert _is_transient(inside_redis_py())
    assert not _is_transient(ours())
