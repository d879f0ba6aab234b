"""``?wait=`` on a run that another process ends: woken by the notices every ``chainrt serve``
hears on its shared subscription (``chainrt:run-changes``, ``chainrt:cancel``), not by its
periodic re-read of the store (issue 39).

The re-read is pushed beyond a wait of 10 minutes: a waiter that the notice did not wake never
returns, and the test fails at pytest's own timeout (no clock is read here).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from chainrt._bus import cancel_channel, publish_client, runs_channel
from chainrt._records import RunRecord
from chainrt._runtime import Runtime
from chainrt.runs._lease import this_host
from chainrt.serve import _watch
from chainrt.serve._fail import fail_in_store
from chainrt.serve._watch import Watchers


def _record(run_id: str) -> RunRecord:
    spec = {"name": "c", "budget": 60_000.0, "steps": []}
    return RunRecord(
        run_id=run_id, chain="c", spec=spec, input={}, status="queued", budget_total_ms=60_000
    )


@pytest.mark.parametrize("how", ["run-changes", "cancel"])
async def test_a_wait_is_woken_by_the_notice_of_a_run_ended_elsewhere(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    monkeypatch.setattr(_watch, "_QUIET_S", 600.0)  # no re-read within the wait below
    async with Runtime(store=redis_url) as runtime:
        watchers = Watchers()
        await watchers.start(runtime, redis_url)
        publisher = publish_client(redis_url)
        try:
            await runtime.store.create_run(_record("far"))
            waiting = asyncio.ensure_future(watchers.wait_final("far", 600.0))
            while "far" not in watchers._waiters:  # the waiter has read the record: queued
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)
            assert not waiting.done()
            # Another process ends the run (in the store first), then tells the fleet.
            ended = await fail_in_store(
                runtime.store, "far", "ended elsewhere", host=this_host(), ttl_s=10.0
            )
            assert ended is not None
            if how == "run-changes":
                notice = json.dumps({"run_id": "far", "status": "failed"})
                await publisher.publish(runs_channel(), notice)
            else:
                await publisher.publish(cancel_channel(), "far")
            waited = await waiting
            assert isinstance(waited, tuple)  # ended elsewhere: read, not told in process
            record, steps = waited
            assert record.status == "failed"
            # Told by the notice of its final status (sent after the final write), the waiter
            # read the steps with the record; told of a cancel (sent before it), not.
            assert (steps is not None) == (how == "run-changes")
            assert "far" not in watchers._waiters  # the waiter left
        finally:
            await publisher.aclose()
            await watchers.close()


async def test_a_notice_of_another_run_or_of_a_start_wakes_nobody(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_watch, "_QUIET_S", 600.0)
    async with Runtime(store=redis_url) as runtime:
        watchers = Watchers()
        await watchers.start(runtime, redis_url)
        publisher = publish_client(redis_url)
        try:
            await runtime.store.create_run(_record("mine"))
            reads = 0
            get_run = runtime.store.get_run

            async def counted(run_id: str) -> RunRecord:
                nonlocal reads
                reads += 1
                return await get_run(run_id)

            monkeypatch.setattr(runtime.store, "get_run", counted)
            waiting = asyncio.ensure_future(watchers.wait_final("mine", 1.5))
            while "mine" not in watchers._waiters:
                await asyncio.sleep(0.01)
            for notice in (
                {"run_id": "other", "status": "failed"},
                {"run_id": "mine", "status": "running"},
            ):
                await publisher.publish(runs_channel(), json.dumps(notice))
            waited = await waiting
            assert isinstance(waited, tuple)
            record, _ = waited
            assert record.status == "queued"  # the wait ended with the run still queued
            assert reads == 2  # once at the start, once when the wait ran out: no wake-up between
        finally:
            await publisher.aclose()
            await watchers.close()
