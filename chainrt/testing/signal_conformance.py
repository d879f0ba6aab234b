"""The conformance tests of the ``waiting`` status and of signals (part of every store's suite).

:class:`~chainrt.testing.store_conformance.StoreConformance` inherits these: a store passes the
suite only if it parks runs (``waiting``: no owner, listed by status, never expired) and keeps
signals (the first of a name, early ones included, with the run's status read atomically).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from chainrt._errors import RunNotFound, SignalRefused
from chainrt._records import OwnerLease, RunProgress, RunRecord
from chainrt.store._protocol import CheckpointStore
from chainrt.store._signals import SignalRecord

__all__ = ["SignalConformance"]

OpenStore = Callable[..., Awaitable[CheckpointStore]]

_PAYLOAD = {"approved": True, "note": "naïve café — 東京 🚀", "nested": {"list": [1, 2.5, None]}}


def _run(run_id: str) -> RunRecord:
    return RunRecord(
        run_id=run_id,
        chain="approvals",
        spec={"name": "approvals", "budget": 8000.0, "steps": []},
        input={},
        budget_total_ms=8000.0,
        owner=OwnerLease(host="host-a", pid=4242, token=1, expires_at=time.time() + 10),
        fencing_token=1,
    )


async def _park(store: CheckpointStore, run_id: str) -> None:
    progress = RunProgress(
        status="waiting",
        budget_used_ms=120.0,
        error="step approve: waiting for signal 'ok'",
        stopped_at="approve",
        release_owner=True,
        waits_ms={},
    )
    await store.commit(run_id, 1, progress)


class SignalConformance:
    """Tests of parking and signals every CheckpointStore must pass (see the module)."""

    async def test_waiting_run_has_no_owner_is_listed_and_does_not_expire(
        self, open_store: OpenStore
    ) -> None:
        store = await open_store(record_ttl_s=0.3)
        await store.create_run(_run("w1"))
        await store.create_run(_run("r1"))
        await _park(store, "w1")
        run = await store.get_run("w1")
        assert (run.status, run.owner, run.stopped_at, run.finished) == (
            "waiting",
            None,
            "approve",
            False,
        )
        assert [r.run_id for r in await store.list_runs(status="waiting")] == ["w1"]
        assert [r.run_id for r in await store.list_runs(status="waiting", chain="approvals")] == [
            "w1"
        ]
        await asyncio.sleep(0.5)  # past the TTL of finished runs: a waiting run is not finished
        assert (await store.get_run("w1")).status == "waiting"
        # A parked run is continued by a claim, like any run whose owner is gone.
        lease = OwnerLease(host="host-b", pid=1, token=0, expires_at=time.time() + 10)
        assert await store.claim("w1", 1, lease) == 2
        assert (await store.get_run("w1")).status == "running"
        assert await store.list_runs(status="waiting") == []

    async def test_early_signal_is_kept_with_the_status_read_at_once(
        self, store: CheckpointStore
    ) -> None:
        await store.create_run(_run("s1"))
        assert await store.get_signal("s1", "ok") is None
        kept = await store.put_signal("s1", SignalRecord(name="ok", payload=_PAYLOAD, at=5.0))
        assert (kept.status, kept.stored, kept.signal.payload) == ("running", True, _PAYLOAD)
        got = await store.get_signal("s1", "ok")
        assert got is not None
        assert (got.name, got.payload, got.at) == ("ok", _PAYLOAD, 5.0)
        await _park(store, "s1")
        other = await store.put_signal("s1", SignalRecord(name="later", payload=None))
        assert (other.status, other.stored) == ("waiting", True)
        assert await store.get_signal("s1", "nope") is None

    async def test_first_signal_of_a_name_wins(self, store: CheckpointStore) -> None:
        await store.create_run(_run("s2"))
        await store.put_signal("s2", SignalRecord(name="ok", payload={"a": 1}, at=1.0))
        again = await store.put_signal("s2", SignalRecord(name="ok", payload={"a": 1}, at=2.0))
        assert (again.stored, again.signal.at) == (False, 1.0)  # a retry: the first one stays
        with pytest.raises(SignalRefused, match="another payload") as info:
            await store.put_signal("s2", SignalRecord(name="ok", payload={"a": 2}))
        assert info.value.conflict
        got = await store.get_signal("s2", "ok")
        assert got is not None
        assert got.payload == {"a": 1}

    async def test_signals_are_per_run(self, store: CheckpointStore) -> None:
        await store.create_run(_run("s3"))
        await store.create_run(_run("s4"))
        await store.put_signal("s3", SignalRecord(name="ok", payload=3))
        assert await store.get_signal("s4", "ok") is None
        got = await store.get_signal("s3", "ok")
        assert got is not None
        assert got.payload == 3

    async def test_signal_to_unknown_or_ended_run_is_refused(self, store: CheckpointStore) -> None:
        with pytest.raises(RunNotFound):
            await store.put_signal("ghost", SignalRecord(name="ok"))
        await store.create_run(_run("s5"))
        done = RunProgress(status="completed", budget_used_ms=1.0, release_owner=True)
        await store.commit("s5", 1, done)
        with pytest.raises(SignalRefused, match="has ended") as info:
            await store.put_signal("s5", SignalRecord(name="ok"))
        assert info.value.conflict
        assert await store.get_signal("s5", "ok") is None

    async def test_oversized_payload_is_refused(self, open_store: OpenStore) -> None:
        store = await open_store(max_record_bytes=10_000)
        await store.create_run(_run("s6"))
        big: Any = {"text": "x" * 20_000}
        with pytest.raises(SignalRefused, match="over the store's limit"):
            await store.put_signal("s6", SignalRecord(name="ok", payload=big))
        assert await store.get_signal("s6", "ok") is None
