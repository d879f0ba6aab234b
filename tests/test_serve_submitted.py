"""A run submitted to a server starts there from the record the submit wrote, not read back
(chainrt/serve/_submitted.py); a record that went stale meanwhile (cancelled while queued) is
fenced out at the claim and the entry is handled from the store, as before."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from chainrt._records import RunRecord
from chainrt.serve import ServeConfig, Service, SubmitRequest
from chainrt.serve._submitted import KEEP_MAX, KEEP_S, JustSubmitted

CHAINS = Path(__file__).parent / "data" / "serve"


def _record(run_id: str) -> RunRecord:
    return RunRecord(run_id=run_id, chain="c", spec={}, input={}, budget_total_ms=1000)


def test_a_kept_record_is_taken_once_and_not_after_its_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    kept = JustSubmitted()
    first, second = _record("a"), _record("b")
    kept.keep(first)
    kept.keep(second)
    assert kept.take("a") is first
    assert kept.take("a") is None  # never the same twice
    now[0] += KEEP_S + 0.1
    assert kept.take("b") is None  # too old: read from the store instead
    kept.keep(_record("c"))
    kept.forget("c")
    assert kept.take("c") is None
    assert len(kept) == 0


def test_at_most_keep_max_records_and_old_ones_go_first(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    kept = JustSubmitted()
    for i in range(KEEP_MAX + 10):
        kept.keep(_record(f"r{i}"))
    assert len(kept) == KEEP_MAX
    assert kept.take("r0") is None  # the oldest went first
    assert kept.take(f"r{KEEP_MAX + 9}") is not None
    now[0] += KEEP_S + 0.1
    kept.keep(_record("new"))  # a keep drops every record past its time
    assert len(kept) == 1


async def test_a_submitted_run_starts_from_its_kept_record(redis_url: str) -> None:
    service = Service(ServeConfig(chains=str(CHAINS), store=redis_url))
    await service.start()
    taken: list[str] = []
    take = service.submitted.take

    def counted(run_id: str) -> RunRecord | None:
        got = take(run_id)
        if got is not None:
            taken.append(run_id)
        return got

    service.submitted.take = counted  # type: ignore[method-assign]
    try:
        outcome = await service.submit(SubmitRequest(chain="five", input={}, run_id="k1"))
        assert outcome.kind == "created"
        result = await service.result("k1", wait_s=30)
        assert (result.status, result.output) == ("completed", 1)
        assert taken == ["k1"]
        assert len(service.submitted) == 0
    finally:
        await asyncio.wait_for(service.stop(drain_s=1), 30)


async def test_a_run_cancelled_while_its_record_was_kept_stays_cancelled(
    redis_url: str,
) -> None:
    """One slot, held by a nap: the second run's entry waits with its record kept, it is
    cancelled meanwhile, then taken with that stale record: the claim is fenced out, the
    entry is handled from the store (cancelled: acknowledged) and nothing of it runs."""
    service = Service(ServeConfig(chains=str(CHAINS), store=redis_url, max_runs=1))
    await service.start()
    try:
        nap = SubmitRequest(chain="nap", input={"seconds": 0.5, "label": "x"}, run_id="hold")
        await service.submit(nap)
        deadline = time.monotonic() + 10
        while (await service.runtime.store.get_run("hold")).status != "running":
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        await service.submit(SubmitRequest(chain="five", input={}, run_id="late"))
        assert len(service.submitted) == 1  # kept: the slot is busy, nothing took it yet
        assert (await service.cancel("late")).status == "cancelled"
        assert (await service.result("hold", wait_s=30)).status == "completed"
        deadline = time.monotonic() + 10
        while (
            len(service.submitted)
            or service.in_flight()
            or sum(d.waiting for d in await service.queue.depth())
        ):
            assert time.monotonic() < deadline, await service.queue.depth()
            await asyncio.sleep(0.05)
        late = await service.runtime.store.get_run("late")
        assert late.status == "cancelled"
        assert await service.runtime.store.get_steps("late") == {}
        # Its entry was acknowledged (handled again from the store), not left pending.
        raw = aioredis.Redis.from_url(redis_url)
        try:
            pending = [
                (await raw.xpending(stream, "runners"))["pending"]
                for stream in await raw.keys("*queue*")
                if await raw.type(stream) == b"stream"
            ]
        finally:
            await raw.aclose()
        assert pending
        assert sum(pending) == 0, pending
    finally:
        await asyncio.wait_for(service.stop(drain_s=1), 30)
