"""The store conformance tests of listing and expiry (part of every store's suite).

:class:`~chainrt.testing.store_conformance.StoreConformance` inherits these: a store passes only
if it lists runs newest first, by status and chain as each status changes, and lets finished
runs expire while running ones stay.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from chainrt._errors import RunNotFound
from chainrt.store._protocol import CheckpointStore

from ._store_records import OpenStore, make_lease, make_progress, make_run, make_step

__all__ = ["ListingConformance"]


class ListingConformance:
    """Listing and expiry; mixed into :class:`StoreConformance`, whose fixtures (``store``,
    ``open_store``) they use."""

    # -- listing -----------------------------------------------------------------------------------

    async def test_list_runs_newest_first_with_filter_and_limit(
        self, store: CheckpointStore
    ) -> None:
        for i in range(5):
            await store.create_run(make_run(f"r{i}", created_at=1000.0 + i))
        await store.commit("r1", 1, make_progress(1.0, "completed", release_owner=True))
        await store.commit("r3", 1, make_progress(1.0, "completed", release_owner=True))
        assert [r.run_id for r in await store.list_runs()] == ["r4", "r3", "r2", "r1", "r0"]
        assert [r.run_id for r in await store.list_runs(limit=2)] == ["r4", "r3"]
        completed = await store.list_runs(status="completed")
        assert [r.run_id for r in completed] == ["r3", "r1"]
        assert {r.status for r in completed} == {"completed"}
        running = await store.list_runs(status="running", limit=2)
        assert [r.run_id for r in running] == ["r4", "r2"]
        assert await store.list_runs(status="failed") == []
        assert await store.list_runs(limit=0) == []

    async def test_list_runs_by_status_and_chain_follow_each_status_change(
        self, store: CheckpointStore
    ) -> None:
        # Filtered pages are served from indexes that the writes which change a run's status
        # keep up to date: create, claim, a commit to another status (step commits too).
        async def ids(**filters: Any) -> list[str]:
            return [r.run_id for r in await store.list_runs(**filters)]

        await store.create_run(make_run("a0", chain="alpha", created_at=1000.0))
        await store.create_run(make_run("b1", chain="beta", created_at=1001.0))
        await store.create_run(make_run("a2", chain="alpha", created_at=1002.0))
        queued = make_run("q3", token=0, chain="beta", created_at=1003.0, status="queued")
        await store.create_run(queued.model_copy(update={"owner": None}))
        assert await ids(status="queued") == ["q3"]
        assert await ids(status="running") == ["a2", "b1", "a0"]
        assert await ids(chain="beta") == ["q3", "b1"]
        assert await ids(chain="alpha", status="running") == ["a2", "a0"]
        assert await ids(chain="nope") == []
        assert await ids(status="nope") == []

        await store.claim("q3", 0, make_lease("host-b"))  # queued -> running
        assert await ids(status="queued") == []
        assert await ids(status="running") == ["q3", "a2", "b1", "a0"]
        await store.commit("a2", 1, make_progress(1.0), make_step("s"))  # a step: still running
        await store.commit("a2", 1, make_progress(2.0, "completed", release_owner=True))
        await store.commit("b1", 1, make_progress(2.0, "partial", release_owner=True))
        assert await ids(status="running") == ["q3", "a0"]
        assert await ids(status="completed") == ["a2"]
        assert await ids(status="partial", chain="beta") == ["b1"]
        await store.claim("b1", 1, make_lease("host-c"))  # a resume: partial -> running
        assert await ids(status="partial") == []
        assert await ids(status="running", chain="beta") == ["q3", "b1"]
        await store.commit("b1", 2, make_progress(3.0, "failed", release_owner=True))
        assert await ids(status="failed") == ["b1"]
        assert [r.status for r in await store.list_runs(chain="beta")] == ["running", "failed"]

        # Keyset pages on a filtered list: every run of the chain once, newest first.
        for i in range(7):
            await store.create_run(make_run(f"g{i}", chain="gamma", created_at=2000.0 + i // 2))
        seen: list[str] = []
        before = None
        while page := await store.list_runs(limit=3, before=before, chain="gamma"):
            seen += [r.run_id for r in page]
            before = (page[-1].created_at, page[-1].run_id)
        assert seen == ["g6", "g5", "g4", "g3", "g2", "g1", "g0"]
        after = await store.list_runs("running", 2, before=(2002.0, "g4"), chain="gamma")
        assert [r.run_id for r in after] == ["g3", "g2"]
        # Both filters, pages smaller than the matches: each run once, none skipped.
        seen, before = [], None
        while page := await store.list_runs("running", 3, before=before, chain="gamma"):
            seen += [r.run_id for r in page]
            before = (page[-1].created_at, page[-1].run_id)
        assert seen == ["g6", "g5", "g4", "g3", "g2", "g1", "g0"]

    # -- expiry ------------------------------------------------------------------------------------

    async def test_finished_runs_expire_running_runs_stay(self, open_store: OpenStore) -> None:
        store = await open_store(record_ttl_s=0.3)
        await store.create_run(make_run("done", created_at=1.0))
        await store.create_run(make_run("alive", created_at=2.0))
        await store.commit("done", 1, make_progress(1.0), make_step("a"))
        await store.commit("done", 1, make_progress(2.0, "completed", release_owner=True))
        await store.commit("alive", 1, make_progress(1.0), make_step("a"))
        assert (await store.get_run("done")).status == "completed"  # not yet
        await asyncio.sleep(0.6)
        with pytest.raises(RunNotFound):
            await store.get_run("done")
        with pytest.raises(RunNotFound):
            await store.get_steps("done")
        assert [r.run_id for r in await store.list_runs()] == ["alive"]
        assert set(await store.get_steps("alive")) == {"a"}
        # The id of an expired run is free again, without its old steps.
        await store.create_run(make_run("done"))
        assert await store.get_steps("done") == {}
