"""chainrt.Runtime: shared dispatcher state across runs, default runtimes, events and cancel."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

import chainrt
from chainrt import Runtime
from chainrt._defaults import default_runtime
from chainrt._events import history

CHAINS = Path(__file__).parent / "data" / "chains"

_DEAD_POOL = """
models:
  primary:
    endpoints:
      - {url: "http://127.0.0.1:%d", capacity: 1}
"""

_DEAD_CHAIN = """
name: dead-endpoint
budget: 5s
steps:
  - id: ask
    llm: {model: primary, prompt: "hi", max_tokens: 4}
    retry: {attempts: 2, backoff: 10ms}
    static_answer: "fallback answer"
"""


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'runs.db'}"


@pytest.fixture
def dead_endpoint(tmp_path: Path) -> tuple[chainrt.Chain, str]:
    from chainrt.testing.redis_server import free_port

    pool = tmp_path / "pool.yaml"
    pool.write_text(_DEAD_POOL % free_port())  # nothing listens there: connections are refused
    chain_file = tmp_path / "dead.yaml"
    chain_file.write_text(_DEAD_CHAIN)
    return chainrt.load(chain_file), str(pool)


@pytest.fixture
def call_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "calls.jsonl"
    monkeypatch.setenv("CHAINRT_TEST_LOG", str(path))
    return path


def calls(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [json.loads(line)["tool"] for line in path.read_text().splitlines()]


async def _tried_endpoint(store: chainrt.Runtime, run_id: str) -> bool:
    steps = await store.store.get_steps(run_id)
    return any(a.status == "connect" for a in steps["ask"].attempt_log)


async def test_a_dead_endpoint_learned_in_one_run_is_skipped_by_the_next(
    dead_endpoint: tuple[chainrt.Chain, str], store_url: str
) -> None:
    chain, pool = dead_endpoint
    async with Runtime(store=store_url, pool=pool) as rt:
        first = await rt.run(chain, {})
        second = await rt.run(chain, {})
        assert (first.status, first.output) == ("completed", "fallback answer")
        assert (second.status, second.output) == ("completed", "fallback answer")
        assert await _tried_endpoint(rt, first.run_id)  # learned the hard way...
        assert not await _tried_endpoint(rt, second.run_id)  # ...and remembered
    # A fresh runtime knows nothing: its first run tries the dead endpoint again.
    async with Runtime(store=store_url, pool=pool) as fresh:
        third = await fresh.run(chain, {})
        assert await _tried_endpoint(fresh, third.run_id)


async def test_chain_arun_reuses_the_default_runtime_of_its_store_and_pool(
    dead_endpoint: tuple[chainrt.Chain, str], store_url: str
) -> None:
    chain, pool = dead_endpoint
    first = await chain.arun({}, store=store_url, pool=pool)
    second = await chain.arun({}, store=store_url, pool=pool)
    rt = await default_runtime(store_url, pool)
    assert await _tried_endpoint(rt, first.run_id)
    assert not await _tried_endpoint(rt, second.run_id)
    assert await default_runtime(store_url, pool) is rt
    assert await default_runtime(store_url, None) is not rt


def test_sync_chain_run_reuses_one_runtime_across_calls(
    dead_endpoint: tuple[chainrt.Chain, str], store_url: str
) -> None:
    chain, pool = dead_endpoint
    first = chain.run({}, store=store_url, pool=pool)
    second = chain.run({}, store=store_url, pool=pool)

    async def tried(run_id: str) -> bool:
        async with Runtime(store=store_url) as rt:
            return await _tried_endpoint(rt, run_id)

    assert asyncio.run(tried(first.run_id))
    assert not asyncio.run(tried(second.run_id))


async def test_stream_yields_the_events_the_records_replay(store_url: str) -> None:
    chain = chainrt.load(CHAINS / "noop.yaml")
    async with Runtime(store=store_url) as rt:
        events = [e async for e in rt.stream(chain, {}, run_id="streamed")]
        run = await rt.store.get_run("streamed")
        replayed = history(run, await rt.store.get_steps("streamed"))
    kinds = [e.type for e in events]
    steps = [f"s{i}" for i in range(1, 11)]
    assert kinds == [
        "run_started",
        *["step_started", "attempt", "step_finished"] * 10,
        "run_finished",
    ]
    assert [e.step_id for e in events if e.type == "step_started"] == steps
    assert [(e.type, e.step_id) for e in replayed] == [(e.type, e.step_id) for e in events]
    final = events[-1].to_dict()
    assert (final["status"], final["run_id"], final["type"]) == (
        "completed",
        "streamed",
        "run_finished",
    )
    assert events[1].to_dict()["allotted_ms"] > 0


@pytest.mark.parametrize("chain_name", ["cancellable", "cancellable_sync"])
async def test_cancel_stops_a_sleeping_tool_frees_the_slot_and_records_cancelled(
    chain_name: str, store_url: str, call_log: Path
) -> None:
    chain = chainrt.load(CHAINS / f"{chain_name}.yaml")
    async with Runtime(store=store_url) as rt:
        run = asyncio.ensure_future(rt.run(chain, {"seconds": 30.0}, run_id="victim"))
        while "sleepy" not in "".join(calls(call_log)):
            await asyncio.sleep(0.01)
        started = time.monotonic()
        cancelled = await rt.cancel("victim")
        result = await run
        took = time.monotonic() - started
        assert cancelled.status == result.status == "cancelled"
        assert result.error == "cancelled by request"
        assert (await rt.store.get_run("victim")).status == "cancelled"
        # The run's concurrency slot (limit 1) is free: the next run gets it and completes
        # while the cancelled run's 30 s sleep would still be going.
        after = await rt.run(chain, {"seconds": 0.0}, budget="5s")
        assert after.status == "completed", after.error
    # 30 s tool: anything near that would mean the cancel waited for it; 1 s is the goal, and
    # 5 s leaves a loaded 2-core machine room without letting a wait for the tool pass.
    assert took < 5.0
    log = calls(call_log)
    assert log.count("after") == 1  # only the second run's: nothing of the victim ran later


async def test_cancel_from_another_runtime_reaches_the_owner(
    store_url: str, call_log: Path
) -> None:
    chain = chainrt.load(CHAINS / "cancellable.yaml")
    async with Runtime(store=store_url) as owner, Runtime(store=store_url) as other:
        run = asyncio.ensure_future(owner.run(chain, {"seconds": 30.0}, run_id="far"))
        while "async_sleepy" not in calls(call_log):
            await asyncio.sleep(0.01)
        await other.cancel("far")
        result = await asyncio.wait_for(run, timeout=10)  # the owner's watcher stops it
        assert result.status == "cancelled"
        assert owner.active() == []


async def test_cancel_from_another_runtime_over_redis_pubsub(
    redis_url: str, call_log: Path
) -> None:
    chain = chainrt.load(CHAINS / "cancellable.yaml")
    async with Runtime(store=redis_url) as owner, Runtime(store=redis_url) as other:
        run = asyncio.ensure_future(owner.run(chain, {"seconds": 30.0}, run_id="far-redis"))
        while "async_sleepy" not in calls(call_log):
            await asyncio.sleep(0.01)
        await other.cancel("far-redis")
        result = await asyncio.wait_for(run, timeout=10)
        assert result.status == "cancelled"
        assert (await owner.store.get_run("far-redis")).owner is None


async def test_cancel_of_a_finished_run_leaves_it_as_it_is(store_url: str) -> None:
    chain = chainrt.load(CHAINS / "noop.yaml")
    async with Runtime(store=store_url) as rt:
        done = await rt.run(chain, {}, run_id="done")
        again = await rt.cancel("done")
    assert done.status == again.status == "completed"
    assert again.output == done.output
