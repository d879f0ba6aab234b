"""The conformance suite every checkpoint store must pass (public: run it on your own store).

Subclass :class:`StoreConformance` in a test module under a name pytest collects (``Test...``),
provide a ``make_store`` fixture that returns an async factory of fresh stores sharing one
backing database per test, and implement :meth:`StoreConformance.corrupt`::

    class TestMyStore(StoreConformance):
        @pytest.fixture
        def make_store(self, tmp_path):
            async def make(**options):
                return MyStore(tmp_path / "db", **options)
            return make

        async def corrupt(self, store, run_id, payload, *, step_id=None):
            ...  # write ``payload`` as the stored JSON of the run (or of one step), raw

The factory takes the keyword options ``record_ttl_s`` and ``max_record_bytes``. Each test
opens the stores it needs and closes them; nothing here sleeps longer than a second.

The suite's parts: creating, reading and committing runs and bad records here; claims, renewals
and concurrency in :mod:`._store_claims`; listing and expiry in :mod:`._store_listing`; parking
and signals in :mod:`.signal_conformance`; the records it writes (:func:`make_run`,
:func:`make_step`) in :mod:`._store_records`.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from chainrt._errors import (
    CheckpointError,
    CorruptRecord,
    FencedOut,
    RecordTooLarge,
    RunNotFound,
)
from chainrt.store._protocol import CheckpointStore

from ._store_claims import ClaimConformance
from ._store_listing import ListingConformance
from ._store_records import (
    UNICODE,
    OpenStore,
    StoreFactory,
    make_lease,
    make_progress,
    make_run,
    make_step,
)
from .signal_conformance import SignalConformance

__all__ = ["StoreConformance", "StoreFactory", "make_run", "make_step"]


class StoreConformance(ClaimConformance, ListingConformance, SignalConformance):
    """Tests every CheckpointStore must pass (parking and signals: :mod:`.signal_conformance`
    too). Subclass it; see the module docstring."""

    # -- hooks the concrete test class provides ------------------------------------------------

    @pytest.fixture
    def make_store(self) -> StoreFactory:
        """Override: return an async factory of stores on one fresh backing database."""
        raise NotImplementedError("a StoreConformance subclass must provide make_store")

    async def corrupt(
        self, store: CheckpointStore, run_id: str, payload: str, *, step_id: str | None = None
    ) -> None:
        """Override: store ``payload`` raw as the JSON record of the run (or of the step)."""
        raise NotImplementedError("a StoreConformance subclass must implement corrupt()")

    # -- fixtures --------------------------------------------------------------------------------

    @pytest.fixture
    async def open_store(self, make_store: StoreFactory) -> AsyncIterator[OpenStore]:
        """Open more stores on the same backing database; all are closed after the test."""
        opened: list[CheckpointStore] = []

        async def open_(**options: Any) -> CheckpointStore:
            store = await make_store(**options)
            opened.append(store)
            return store

        yield open_
        for store in opened:
            await store.close()

    @pytest.fixture
    async def store(self, open_store: OpenStore) -> CheckpointStore:
        """A fresh store with default options."""
        return await open_store()

    # -- create / get ----------------------------------------------------------------------------

    async def test_create_get_round_trip(self, store: CheckpointStore) -> None:
        run = make_run()
        await store.create_run(run)
        loaded = await store.get_run("run-1")
        assert loaded == run
        assert loaded.input["question"] == UNICODE
        assert loaded.owner is not None
        assert loaded.owner.token == 1
        assert loaded.schema_version == run.schema_version

    async def test_duplicate_create_refused(self, store: CheckpointStore) -> None:
        await store.create_run(make_run(chain="first"))
        with pytest.raises(CheckpointError, match="already exists") as info:
            await store.create_run(make_run(chain="second"))
        assert not isinstance(info.value, RunNotFound)
        assert (await store.get_run("run-1")).chain == "first"

    async def test_identical_create_is_a_harmless_retry(self, store: CheckpointStore) -> None:
        # A create whose reply was lost is sent again with the very same record: not an error.
        run = make_run()
        await store.create_run(run)
        await store.create_run(run)
        assert await store.get_run("run-1") == run

    async def test_owner_token_must_match_fencing_token(self, store: CheckpointStore) -> None:
        run = make_run(owner=make_lease("host-a", token=3), fencing_token=1)
        with pytest.raises(CheckpointError, match=r"owner\.token"):
            await store.create_run(run)
        with pytest.raises(RunNotFound):
            await store.get_run("run-1")

    async def test_empty_run_id_refused(self, store: CheckpointStore) -> None:
        with pytest.raises(CheckpointError, match="run id"):
            await store.get_run("")

    async def test_unknown_run(self, store: CheckpointStore) -> None:
        with pytest.raises(RunNotFound, match="nope"):
            await store.get_run("nope")
        with pytest.raises(RunNotFound):
            await store.get_steps("nope")
        with pytest.raises(RunNotFound):
            await store.commit("nope", 1, make_progress(1.0), make_step())
        with pytest.raises(RunNotFound):
            await store.claim("nope", 1, make_lease("b"))
        with pytest.raises(RunNotFound):
            await store.renew("nope", 1, time.time() + 5)

    async def test_step_records_named_by_path_round_trip(self, store: CheckpointStore) -> None:
        # Steps inside groups (switch, parallel, map) are recorded under their paths, and a
        # switch's choice under `<path>#branch`: each is its own record, read back as written.
        await store.create_run(make_run())
        paths = [
            "gather.kb.search",
            "per_item[3].classify",
            "per_item[12].inner[0].x",
            "route.refund.policy",
            "route#branch",
            "route.order-status.answer",
        ]
        for number, path in enumerate(paths):
            step = make_step(path, output={"path": path, "n": number})
            await store.commit("run-1", 1, make_progress(float(number)), step)
        steps = await store.get_steps("run-1")
        assert sorted(steps) == sorted(paths)
        for number, path in enumerate(paths):
            assert steps[path].step_id == path
            assert steps[path].output == {"path": path, "n": number}

    async def test_second_store_sees_the_same_runs(
        self, store: CheckpointStore, open_store: OpenStore
    ) -> None:
        await store.create_run(make_run())
        await store.commit("run-1", 1, make_progress(5.0), make_step())
        other = await open_store()
        assert (await other.get_run("run-1")).budget_used_ms == 5.0
        assert set(await other.get_steps("run-1")) == {"intent"}

    # -- commit ------------------------------------------------------------------------------------

    async def test_commit_writes_step_and_progress(self, store: CheckpointStore) -> None:
        await store.create_run(make_run())
        assert await store.get_steps("run-1") == {}
        step = make_step()
        progress = make_progress(420.5, waits_ms={"user:u1": 2.0}, output={"partial": [1]})
        await store.commit("run-1", 1, progress, step)
        run = await store.get_run("run-1")
        assert (run.status, run.budget_used_ms, run.output) == ("running", 420.5, {"partial": [1]})
        assert run.waits_ms == {"user:u1": 2.0}
        assert run.spec == make_run().spec  # the parts a commit does not touch are intact
        assert run.owner is not None
        assert run.owner.host == "host-a"
        assert await store.get_steps("run-1") == {"intent": step}

    async def test_commit_without_step_and_repeated(self, store: CheckpointStore) -> None:
        await store.create_run(make_run())
        await store.commit("run-1", 1, make_progress(1.0), make_step("a"))
        await store.commit("run-1", 1, make_progress(2.0))
        # Sending the same commit twice (a retry) leaves the same state.
        await store.commit("run-1", 1, make_progress(3.0), make_step("b"))
        await store.commit("run-1", 1, make_progress(3.0), make_step("b"))
        assert (await store.get_run("run-1")).budget_used_ms == 3.0
        assert sorted(await store.get_steps("run-1")) == ["a", "b"]

    async def test_final_commit_releases_owner(self, store: CheckpointStore) -> None:
        await store.create_run(make_run())
        final = make_progress(900.0, "completed", output="done", release_owner=True)
        await store.commit("run-1", 1, final, make_step("summary"))
        run = await store.get_run("run-1")
        assert (run.status, run.output, run.owner) == ("completed", "done", None)
        assert run.finished
        assert run.fencing_token == 1

    async def test_a_final_status_is_final(self, store: CheckpointStore) -> None:
        """With the same token, a retried final commit is harmless and nothing moves the run
        out of its final status (a late release of a run whose final commit landed while its
        reply was lost must not write it back as ``running``)."""
        await store.create_run(make_run())
        done = make_progress(5.0, "completed", output="done", release_owner=True)
        await store.commit("run-1", 1, done, make_step("last"))
        await store.commit("run-1", 1, done, make_step("last"))  # the retry
        with pytest.raises(CheckpointError, match="completed") as info:
            await store.commit("run-1", 1, make_progress(6.0, "running", release_owner=True))
        assert not isinstance(info.value, FencedOut)
        with pytest.raises(CheckpointError, match="completed"):
            await store.commit("run-1", 1, make_progress(6.0, "failed", release_owner=True))
        run = await store.get_run("run-1")
        assert (run.status, run.output, run.budget_used_ms) == ("completed", "done", 5.0)

    async def test_budget_total_and_trace_kept_unless_given(self, store: CheckpointStore) -> None:
        await store.create_run(make_run())
        new_trace = {"trace_id": "1" * 32, "links": [{"trace_id": "2" * 32}]}
        await store.commit("run-1", 1, make_progress(1.0, budget_total_ms=9000.0, trace=new_trace))
        await store.commit("run-1", 1, make_progress(2.0))
        run = await store.get_run("run-1")
        assert (run.budget_total_ms, run.trace, run.budget_used_ms) == (9000.0, new_trace, 2.0)

    async def test_fenced_commit_writes_nothing(self, store: CheckpointStore) -> None:
        await store.create_run(make_run())
        await store.commit("run-1", 1, make_progress(10.0), make_step("a"))
        assert await store.claim("run-1", 1, make_lease("host-b")) == 2
        with pytest.raises(FencedOut, match="token is now 2"):
            await store.commit("run-1", 1, make_progress(99.0, "completed"), make_step("b"))
        run = await store.get_run("run-1")
        assert (run.budget_used_ms, run.status) == (10.0, "running")
        assert set(await store.get_steps("run-1")) == {"a"}
        await store.commit("run-1", 2, make_progress(11.0), make_step("b"))  # the new owner may
        assert set(await store.get_steps("run-1")) == {"a", "b"}

    async def test_oversized_records_refused_and_nothing_written(
        self, open_store: OpenStore
    ) -> None:
        store = await open_store(max_record_bytes=64 * 1024)
        big = "x" * (65 * 1024)
        with pytest.raises(RecordTooLarge, match="run 'big'"):
            await store.create_run(make_run("big", input={"blob": big}))
        with pytest.raises(RunNotFound):
            await store.get_run("big")
        await store.create_run(make_run())
        with pytest.raises(RecordTooLarge, match="step 'a'"):
            await store.commit("run-1", 1, make_progress(5.0), make_step("a", output=big))
        # A small step with an oversized progress is refused whole: the step is not written.
        with pytest.raises(RecordTooLarge, match="progress"):
            await store.commit("run-1", 1, make_progress(5.0, output=big), make_step("b"))
        assert await store.get_steps("run-1") == {}
        assert (await store.get_run("run-1")).budget_used_ms == 0.0

    # -- bad records -------------------------------------------------------------------------------

    async def test_corrupt_run_record(self, store: CheckpointStore) -> None:
        await store.create_run(make_run("bad", created_at=2000.0))
        await store.create_run(make_run("good", created_at=1000.0))
        await self.corrupt(store, "bad", '{"run_id": "bad", "chain": ')
        with pytest.raises(CorruptRecord, match="'bad'") as info:
            await store.get_run("bad")
        assert "\n" not in str(info.value)
        # Listing skips the unreadable run instead of failing as a whole.
        assert [r.run_id for r in await store.list_runs()] == ["good"]

    async def test_corrupt_step_record(self, store: CheckpointStore) -> None:
        await store.create_run(make_run())
        await store.commit("run-1", 1, make_progress(1.0), make_step("a"))
        await self.corrupt(store, "run-1", "\x00garbage", step_id="a")
        with pytest.raises(CorruptRecord, match="step 'a' of run 'run-1'"):
            await store.get_steps("run-1")

    async def test_record_of_a_newer_schema(self, store: CheckpointStore) -> None:
        await store.create_run(make_run())
        newer = make_run().model_dump(mode="json", by_alias=True)
        newer.update(schema=99, field_from_the_future=True)
        await self.corrupt(store, "run-1", json.dumps(newer))
        with pytest.raises(CorruptRecord, match=r"schema 99.*newer chainrt"):
            await store.get_run("run-1")
        await store.create_run(make_run("run-2"))
        step = make_step("a").model_dump(mode="json", by_alias=True) | {"schema": 7}
        await store.commit("run-2", 1, make_progress(1.0), make_step("a"))
        await self.corrupt(store, "run-2", json.dumps(step), step_id="a")
        with pytest.raises(CorruptRecord, match="schema 7"):
            await store.get_steps("run-2")
