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
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import pytest

from chainrt._errors import (
    CheckpointError,
    CorruptRecord,
    FencedOut,
    RecordTooLarge,
    RunNotFound,
)
from chainrt.store._protocol import CheckpointStore
from chainrt.store._records import (
    AttemptRecord,
    OwnerLease,
    RunProgress,
    RunRecord,
    StepRecord,
)

__all__ = ["StoreConformance", "StoreFactory", "make_run", "make_step"]


class StoreFactory(Protocol):
    """Opens a fresh store on the test's shared backing database."""

    def __call__(
        self, *, record_ttl_s: float | None = None, max_record_bytes: int | None = None
    ) -> Awaitable[CheckpointStore]: ...


OpenStore = Callable[..., Awaitable[CheckpointStore]]

_UNICODE = "naïve café — 東京 🚀 \u0000-free \\ \"quoted\" 'single'"


def make_run(run_id: str = "run-1", *, token: int = 1, **overrides: Any) -> RunRecord:
    """A run record exercising every field (nested spec, unicode input, owner lease)."""
    fields: dict[str, Any] = {
        "run_id": run_id,
        "chain": "support_agent",
        "spec": {
            "name": "support_agent",
            "budget": 8000.0,
            "steps": [{"id": "intent", "weight": 0.2, "llm": {"model": "primary"}}],
        },
        "source": "/srv/chains",
        "input": {"user_id": "u1", "question": _UNICODE, "nested": {"list": [1, 2.5, None]}},
        "budget_total_ms": 8000.0,
        "owner": OwnerLease(host="host-a", pid=4242, token=token, expires_at=time.time() + 10),
        "fencing_token": token,
        "trace": {"trace_id": "0af7651916cd43dd8448eb211c80319c", "links": []},
        "waits_ms": {"user:u1": 1.5},
        "created_at": 1_700_000_000.25,
        "updated_at": 1_700_000_000.5,
    }
    fields.update(overrides)
    return RunRecord(**fields)


def make_step(step_id: str = "intent", **overrides: Any) -> StepRecord:
    """A completed step record with a nested, unicode output and an attempt log."""
    fields: dict[str, Any] = {
        "step_id": step_id,
        "status": "completed",
        "output": {"intent": "order_status", "text": _UNICODE, "scores": [0.9, 0.1]},
        "attempts": 2,
        "model": "primary",
        "fallback": "local",
        "allotted_ms": 1600.0,
        "elapsed_ms": 420.5,
        "started_at": 1_700_000_001.0,
        "finished_at": 1_700_000_001.4205,
        "attempt_log": [
            AttemptRecord(attempt=1, model="primary", status="timeout", elapsed_ms=300.0),
            AttemptRecord(attempt=2, model="local", status="ok", elapsed_ms=120.5),
        ],
        "waits_ms": {"model:primary": 0.25},
    }
    fields.update(overrides)
    return StepRecord(**fields)


def _progress(used: float, status: Any = "running", **overrides: Any) -> RunProgress:
    return RunProgress(status=status, budget_used_ms=used, **overrides)


def _lease(host: str, token: int = 0) -> OwnerLease:
    return OwnerLease(host=host, pid=1000, token=token, expires_at=time.time() + 10)


class StoreConformance:
    """Tests every CheckpointStore must pass. Subclass it; see the module docstring."""

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
        assert loaded.input["question"] == _UNICODE
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
        run = make_run(owner=_lease("host-a", token=3), fencing_token=1)
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
            await store.commit("nope", 1, _progress(1.0), make_step())
        with pytest.raises(RunNotFound):
            await store.claim("nope", 1, _lease("b"))
        with pytest.raises(RunNotFound):
            await store.renew("nope", 1, time.time() + 5)

    async def test_second_store_sees_the_same_runs(
        self, store: CheckpointStore, open_store: OpenStore
    ) -> None:
        await store.create_run(make_run())
        await store.commit("run-1", 1, _progress(5.0), make_step())
        other = await open_store()
        assert (await other.get_run("run-1")).budget_used_ms == 5.0
        assert set(await other.get_steps("run-1")) == {"intent"}

    # -- commit ------------------------------------------------------------------------------------

    async def test_commit_writes_step_and_progress(self, store: CheckpointStore) -> None:
        await store.create_run(make_run())
        assert await store.get_steps("run-1") == {}
        step = make_step()
        progress = _progress(420.5, waits_ms={"user:u1": 2.0}, output={"partial": [1]})
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
        await store.commit("run-1", 1, _progress(1.0), make_step("a"))
        await store.commit("run-1", 1, _progress(2.0))
        # Sending the same commit twice (a retry) leaves the same state.
        await store.commit("run-1", 1, _progress(3.0), make_step("b"))
        await store.commit("run-1", 1, _progress(3.0), make_step("b"))
        assert (await store.get_run("run-1")).budget_used_ms == 3.0
        assert sorted(await store.get_steps("run-1")) == ["a", "b"]

    async def test_final_commit_releases_owner(self, store: CheckpointStore) -> None:
        await store.create_run(make_run())
        final = _progress(900.0, "completed", output="done", release_owner=True)
        await store.commit("run-1", 1, final, make_step("summary"))
        run = await store.get_run("run-1")
        assert (run.status, run.output, run.owner) == ("completed", "done", None)
        assert run.finished
        assert run.fencing_token == 1

    async def test_budget_total_and_trace_kept_unless_given(self, store: CheckpointStore) -> None:
        await store.create_run(make_run())
        new_trace = {"trace_id": "1" * 32, "links": [{"trace_id": "2" * 32}]}
        await store.commit("run-1", 1, _progress(1.0, budget_total_ms=9000.0, trace=new_trace))
        await store.commit("run-1", 1, _progress(2.0))
        run = await store.get_run("run-1")
        assert (run.budget_total_ms, run.trace, run.budget_used_ms) == (9000.0, new_trace, 2.0)

    async def test_fenced_commit_writes_nothing(self, store: CheckpointStore) -> None:
        await store.create_run(make_run())
        await store.commit("run-1", 1, _progress(10.0), make_step("a"))
        assert await store.claim("run-1", 1, _lease("host-b")) == 2
        with pytest.raises(FencedOut, match="token is now 2"):
            await store.commit("run-1", 1, _progress(99.0, "completed"), make_step("b"))
        run = await store.get_run("run-1")
        assert (run.budget_used_ms, run.status) == (10.0, "running")
        assert set(await store.get_steps("run-1")) == {"a"}
        await store.commit("run-1", 2, _progress(11.0), make_step("b"))  # the new owner may
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
            await store.commit("run-1", 1, _progress(5.0), make_step("a", output=big))
        # A small step with an oversized progress is refused whole: the step is not written.
        with pytest.raises(RecordTooLarge, match="progress"):
            await store.commit("run-1", 1, _progress(5.0, output=big), make_step("b"))
        assert await store.get_steps("run-1") == {}
        assert (await store.get_run("run-1")).budget_used_ms == 0.0

    # -- claim / renew -----------------------------------------------------------------------------

    async def test_claim_sets_owner_and_token(self, store: CheckpointStore) -> None:
        await store.create_run(make_run())
        lease = _lease("host-b", token=2)
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
            *(s.claim("run-1", 1, _lease(f"host-{i}")) for i, s in enumerate(others)),
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
        await store.commit("run-1", 1, _progress(5.0, "completed", release_owner=True))
        with pytest.raises(CheckpointError, match="completed") as info:
            await store.claim("run-1", 1, _lease("host-b"))
        assert not isinstance(info.value, FencedOut)
        assert (await store.get_run("run-1")).fencing_token == 1

    async def test_partial_run_can_be_claimed_again(self, open_store: OpenStore) -> None:
        store = await open_store(record_ttl_s=0.3)
        await store.create_run(make_run())
        await store.commit("run-1", 1, _progress(5.0, "partial", release_owner=True))
        assert await store.claim("run-1", 1, _lease("host-b")) == 2
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
        await store.claim("run-1", 1, _lease("host-b"))
        with pytest.raises(FencedOut):
            await store.renew("run-1", 1, later + 1)
        await store.commit("run-1", 2, _progress(1.0, "failed", release_owner=True))
        with pytest.raises(FencedOut, match="no owner lease"):
            await store.renew("run-1", 2, later + 1)

    # -- listing -----------------------------------------------------------------------------------

    async def test_list_runs_newest_first_with_filter_and_limit(
        self, store: CheckpointStore
    ) -> None:
        for i in range(5):
            await store.create_run(make_run(f"r{i}", created_at=1000.0 + i))
        await store.commit("r1", 1, _progress(1.0, "completed", release_owner=True))
        await store.commit("r3", 1, _progress(1.0, "completed", release_owner=True))
        assert [r.run_id for r in await store.list_runs()] == ["r4", "r3", "r2", "r1", "r0"]
        assert [r.run_id for r in await store.list_runs(limit=2)] == ["r4", "r3"]
        completed = await store.list_runs(status="completed")
        assert [r.run_id for r in completed] == ["r3", "r1"]
        assert {r.status for r in completed} == {"completed"}
        running = await store.list_runs(status="running", limit=2)
        assert [r.run_id for r in running] == ["r4", "r2"]
        assert await store.list_runs(status="failed") == []
        assert await store.list_runs(limit=0) == []

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
        await store.commit("run-1", 1, _progress(1.0), make_step("a"))
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
        await store.commit("run-2", 1, _progress(1.0), make_step("a"))
        await self.corrupt(store, "run-2", json.dumps(step), step_id="a")
        with pytest.raises(CorruptRecord, match="schema 7"):
            await store.get_steps("run-2")

    # -- expiry ------------------------------------------------------------------------------------

    async def test_finished_runs_expire_running_runs_stay(self, open_store: OpenStore) -> None:
        store = await open_store(record_ttl_s=0.3)
        await store.create_run(make_run("done", created_at=1.0))
        await store.create_run(make_run("alive", created_at=2.0))
        await store.commit("done", 1, _progress(1.0), make_step("a"))
        await store.commit("done", 1, _progress(2.0, "completed", release_owner=True))
        await store.commit("alive", 1, _progress(1.0), make_step("a"))
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

    # -- load --------------------------------------------------------------------------------------

    async def test_many_concurrent_commits(self, store: CheckpointStore) -> None:
        runs, steps = 20, 8
        await asyncio.gather(*(store.create_run(make_run(f"c{i}")) for i in range(runs)))

        async def drive(i: int) -> None:
            for k in range(steps):
                await store.commit(f"c{i}", 1, _progress(float(k)), make_step(f"s{k}"))
            await store.commit(f"c{i}", 1, _progress(99.0, "completed", output=i))

        await asyncio.gather(*(drive(i) for i in range(runs)))
        for i in range(runs):
            run = await store.get_run(f"c{i}")
            assert (run.status, run.output, run.budget_used_ms) == ("completed", i, 99.0)
            assert sorted(await store.get_steps(f"c{i}")) == [f"s{k}" for k in range(steps)]
