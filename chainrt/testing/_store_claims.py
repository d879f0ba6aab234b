"""The store conformance tests of ownership and concurrency (part of every store's suite).

:class:`~chainrt.testing.store_conformance.StoreConformance` inherits these: a store passes only
if a claim takes the owner lease with the next fencing token (one winner among concurrent
claims, none on a completed run), a renewal keeps it, and many concurrent commits all land.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from chainrt._errors import CheckpointError, FencedOut
from chainrt.store._protocol import CheckpointStore

from ._store_records import OpenStore, make_lease, make_progress, make_run, make_step

__all__ = ["ClaimConformance"]


class ClaimConformance:
    """Claims, renewals and concurrent commits; mixed into :class:`StoreConformance`, whose
    fixtures (``store``, ``open_store``) they use."""

    # -- claim / renew -----------------------------------------------------------------------------

    async def test_claim_sets_owner_and_token(self, store: CheckpointStore) -> None:
        await store.create_run(make_run())
        lease = make_lease("host-b", token=2)
        assert await store.claim("run-1", 1, lease) == 2
        assert lease.token == 2
        run = await store.get_run("run-1")
        assert run.fencing_token == 2
        assert run.owner == lease

    async def test_concurrent_claims_exactly_one_wins(
        self, store: CheckpointStore, open_store: OpenStore
    ) -> None:
        await store.create_run(make_run())
        others = [await open_store() for _ in range(4)]
        results = await asyncio.gather(
            *(s.claim("run-1", 1, make_lease(f"host-{i}")) for i, s in enumerate(others)),
            return_exceptions=True,
        )
        winners = [r for r in results if r == 2]
        losers = [r for r in results if isinstance(r, FencedOut)]
        assert (len(winners), len(losers)) == (1, 3), results
        owner = (await store.get_run("run-1")).owner
        assert owner is not None
        assert owner.host == f"host-{results.index(2)}"

    async def test_completed_run_cannot_be_claimed(self, store: CheckpointStore) -> None:
        await store.create_run(make_run())
        await store.commit("run-1", 1, make_progress(5.0, "completed", release_owner=True))
        with pytest.raises(CheckpointError, match="completed") as info:
            await store.claim("run-1", 1, make_lease("host-b"))
        assert not isinstance(info.value, FencedOut)
        assert (await store.get_run("run-1")).fencing_token == 1

    async def test_partial_run_can_be_claimed_again(self, open_store: OpenStore) -> None:
        store = await open_store(record_ttl_s=0.3)
        await store.create_run(make_run())
        await store.commit("run-1", 1, make_progress(5.0, "partial", release_owner=True))
        assert await store.claim("run-1", 1, make_lease("host-b")) == 2
        assert (await store.get_run("run-1")).status == "running"
        await asyncio.sleep(0.5)  # past the TTL of finished runs: a claimed run no longer expires
        assert (await store.get_run("run-1")).fencing_token == 2

    async def test_renew(self, store: CheckpointStore) -> None:
        await store.create_run(make_run())
        later = time.time() + 60
        await store.renew("run-1", 1, later)
        owner = (await store.get_run("run-1")).owner
        assert owner is not None
        assert owner.expires_at == later
        await store.claim("run-1", 1, make_lease("host-b"))
        with pytest.raises(FencedOut):
            await store.renew("run-1", 1, later + 1)
        await store.commit("run-1", 2, make_progress(1.0, "failed", release_owner=True))
        with pytest.raises(FencedOut, match="no owner lease"):
            await store.renew("run-1", 2, later + 1)

    # -- load --------------------------------------------------------------------------------------

    async def test_many_concurrent_commits(self, store: CheckpointStore) -> None:
        runs, steps = 20, 8
        await asyncio.gather(*(store.create_run(make_run(f"c{i}")) for i in range(runs)))

        async def drive(i: int) -> None:
            for k in range(steps):
                await store.commit(f"c{i}", 1, make_progress(float(k)), make_step(f"s{k}"))
            await store.commit(f"c{i}", 1, make_progress(99.0, "completed", output=i))

        await asyncio.gather(*(drive(i) for i in range(runs)))
        for i in range(runs):
            run = await store.get_run(f"c{i}")
            assert (run.status, run.output, run.budget_used_ms) == ("completed", i, 99.0)
            assert sorted(await store.get_steps(f"c{i}")) == [f"s{k}" for k in range(steps)]
