"""The owner-lease heartbeat: renewals on a timer, no task between them, fencing noticed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from chainrt._records import RunProgress, RunRecord
from chainrt.errors import LeaseReleased
from chainrt.runs._lease import Heartbeat, new_lease
from chainrt.store import open_store


def _record(run_id: str, ttl_s: float) -> RunRecord:
    return RunRecord(
        run_id=run_id,
        chain="hb",
        spec={"name": "hb", "budget": 1000, "steps": [{"id": "a", "tool": "t.py:f"}]},
        input={},
        budget_total_ms=1000,
        owner=new_lease("here", 1, ttl_s),
        fencing_token=1,
    )


def _heartbeats() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("chainrt-heartbeat-")]


async def test_heartbeat_renews_on_a_timer_and_stops_without_a_task(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'hb.db'}")
    try:
        ttl_s = 0.3  # renewed every 0.1 s
        await store.create_run(_record("hb-1", ttl_s))
        first = (await store.get_run("hb-1")).owner
        assert first is not None
        fenced: list[bool] = []
        beat = Heartbeat(store, "hb-1", 1, ttl_s, on_fenced=lambda: fenced.append(True))
        beat.start()
        assert _heartbeats() == []  # between renewals nothing but a timer
        await asyncio.sleep(0.45)
        renewed = (await store.get_run("hb-1")).owner
        assert renewed is not None
        assert renewed.expires_at > first.expires_at
        await beat.stop()
        assert _heartbeats() == []
        after_stop = renewed.expires_at
        await asyncio.sleep(0.25)  # two periods: a stopped heartbeat renews nothing
        last = (await store.get_run("hb-1")).owner
        assert last is not None
        assert last.expires_at == after_stop
        assert fenced == []
        assert not beat.fenced
    finally:
        await store.close()


async def test_heartbeat_reports_a_takeover(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'hb.db'}")
    try:
        ttl_s = 0.15
        await store.create_run(_record("hb-2", ttl_s))
        # Another process claims the run: the owner's token 1 is fenced out.
        await store.claim("hb-2", 1, new_lease("other", 2, 30.0))
        fenced = asyncio.Event()
        beat = Heartbeat(store, "hb-2", 1, ttl_s, on_fenced=fenced.set)
        beat.start()
        await asyncio.wait_for(fenced.wait(), timeout=10)  # generous: a loaded 2-core machine
        assert beat.fenced
        await beat.stop()
        assert _heartbeats() == []
    finally:
        await store.close()


async def test_a_lease_released_by_this_process_is_no_takeover(tmp_path: Path) -> None:
    """The run's own final commit landed (in a failover its reply may be lost and retried
    while the heartbeat renews): the heartbeat stops quietly instead of cancelling the run,
    whose cancellation would release it again as ``running`` over its final status."""
    store = open_store(f"sqlite:///{tmp_path / 'hb.db'}")
    try:
        ttl_s = 0.15
        await store.create_run(_record("hb-3", ttl_s))
        done = RunProgress(status="completed", budget_used_ms=1.0, release_owner=True)
        await store.commit("hb-3", 1, done)
        with pytest.raises(LeaseReleased):  # what the heartbeat meets; still a FencedOut
            await store.renew("hb-3", 1, 0.0)
        fenced: list[bool] = []
        beat = Heartbeat(store, "hb-3", 1, ttl_s, on_fenced=lambda: fenced.append(True))
        beat.start()
        await asyncio.sleep(ttl_s)  # two renewals were due; the first one stopped it
        for _ in range(100):  # a loaded machine: the first renewal may come late
            if beat._stopped:
                break
            await asyncio.sleep(0.05)
        assert beat._stopped
        assert fenced == []
        assert not beat.fenced
        assert (await store.get_run("hb-3")).status == "completed"
        await beat.stop()
        assert _heartbeats() == []
    finally:
        await store.close()
