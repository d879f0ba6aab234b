"""The runner on tool chains: budgets, deadlines, retries, partial stops, resume semantics."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

import chainrt
from chainrt import InputError, RunLocked
from chainrt._runner import Runner
from chainrt.concurrency import LocalLimiter
from chainrt.dispatch import make_dispatcher
from chainrt.spec import spec_from_dict
from chainrt.store import open_store

CHAINS = Path(__file__).parent / "data" / "chains"


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'runs.db'}"


@pytest.fixture
def call_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "calls.jsonl"
    monkeypatch.setenv("CHAINRT_TEST_LOG", str(path))
    return path


def calls(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [json.loads(line)["tool"] for line in path.read_text().splitlines()]


async def test_tool_chain_completes_with_typed_templates(store_url: str) -> None:
    chain = chainrt.load(CHAINS / "misc.yaml")
    result = await chain.arun({"x": 40}, run_id="misc-1", store=store_url)
    assert result.status == "completed", result.error
    assert result.output["sum"] == 42  # native int survived "{{ input.x }}"
    assert result.output["ctx"]["key"] == "misc-1:ctx"
    assert result.output["ctx"]["left"] is True
    assert result.output["flaky"] == "ok after 2 failures"
    flaky = next(s for s in result.steps if s.id == "flaky")
    assert flaky.attempts == 3
    assert [s.id for s in result.steps] == ["ctx", "flaky", "sum"]
    assert result.budget.total_ms == 5000
    assert 0 < result.budget.used_ms < 5000


async def test_sync_tool_past_its_allotment_is_cut_and_run_is_partial(
    store_url: str, call_log: Path
) -> None:
    chain = chainrt.load(CHAINS / "slow_tool.yaml")
    started = time.perf_counter()
    result = await chain.arun({"seconds": 5.0}, store=store_url)
    elapsed_ms = (time.perf_counter() - started) * 1000
    assert result.status == "partial"
    assert result.stopped_at == "sleeper"
    sleeper = next(s for s in result.steps if s.id == "sleeper")
    assert sleeper.status == "timed_out"
    # 1 s budget: the run came back within budget + 50 ms (plus the loader and store set-up,
    # which happen before the budget clock starts and are measured separately here).
    assert result.budget.used_ms <= 1000 + 50
    assert elapsed_ms < 1000 + 1000, "the sync tool was not abandoned at its deadline"
    assert calls(call_log) == ["quick", "sleepy"]  # "after" never ran


async def test_optional_step_that_runs_long_is_skipped_and_run_completes(
    store_url: str, call_log: Path
) -> None:
    chain = chainrt.load(CHAINS / "slow_optional.yaml")
    result = await chain.arun({}, store=store_url)
    assert result.status == "completed", result.error
    assert result.output == "last"
    dawdle = next(s for s in result.steps if s.id == "dawdle")
    assert dawdle.status == "skipped"
    assert dawdle.error is not None
    assert "timed_out" in dawdle.error
    assert result.budget.used_ms <= 1000 + 50
    assert calls(call_log) == ["first", "async_sleepy", "last"]


async def test_bad_input_is_refused_before_anything_runs(store_url: str, call_log: Path) -> None:
    chain = chainrt.load(CHAINS / "misc.yaml")
    with pytest.raises(InputError, match="must be int"):
        await chain.arun({"x": "forty"}, store=store_url)
    with pytest.raises(InputError, match="lacks x"):
        await chain.arun({}, store=store_url)
    with pytest.raises(InputError, match="unknown field"):
        await chain.arun({"x": 1, "y": 2}, store=store_url)
    assert calls(call_log) == []


async def test_non_json_output_fails_the_step_clearly(store_url: str, tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("def bad():\n    return object()\n")
    (tmp_path / "c.yaml").write_text("name: c\nbudget: 2s\nsteps:\n  - {id: a, tool: 't.py:bad'}\n")
    result = await chainrt.load(tmp_path / "c.yaml").arun({}, store=store_url)
    assert result.status == "failed"
    assert result.error is not None
    assert "not JSON-serialisable" in result.error


async def test_resume_of_completed_run_runs_nothing(store_url: str, call_log: Path) -> None:
    chain = chainrt.load(CHAINS / "crashy.yaml")
    marker = call_log.parent / "marker"
    marker.write_text("already crashed once")  # so crash_once does not crash in-process
    first = await chain.arun({"marker": str(marker)}, run_id="done-1", store=store_url)
    assert first.status == "completed"
    before = calls(call_log)
    again = await chainrt.aresume("done-1", store=store_url)
    assert again.status == "completed"
    assert again.output == first.output
    assert calls(call_log) == before


async def test_resume_runs_only_the_steps_without_a_record(
    store_url: str, call_log: Path, tmp_path: Path
) -> None:
    chain = chainrt.load(CHAINS / "resumable.yaml")
    marker = tmp_path / "three-may-finish"
    first = await chain.arun({"marker": str(marker)}, run_id="part-1", store=store_url)
    assert (first.status, first.stopped_at) == ("partial", "three"), first.error
    assert [(s.id, s.status) for s in first.steps] == [
        ("one", "completed"),
        ("two", "completed"),
        ("three", "timed_out"),
    ]
    store = open_store(store_url)
    try:
        recorded = await store.get_steps("part-1")
        marker.write_text("go")
        again = await chainrt.aresume("part-1", store=store_url, budget="5s")
        after = await store.get_steps("part-1")
    finally:
        await store.close()
    assert again.status == "completed", again.error
    assert again.output == {"sum": 2, "three": "three"}  # four read one's and two's outputs
    # one and two ran once, in the first execution; three (the step that was cut) ran again.
    assert calls(call_log) == ["one", "two", "three", "three"]
    assert after["one"] == recorded["one"]
    assert after["two"] == recorded["two"]
    assert after["three"].started_at > recorded["three"].started_at
    assert after["four"].status == "completed"


def _bounds_ms(total: float, used_ms: tuple[float, float], share: float) -> tuple[float, float]:
    """docs/chain-format.md, Budget: ``(T - used) * w_k / sum(w_j)`` for the least and most budget used so far."""
    least, most = used_ms
    return (total - most) * share, (total - least) * share


async def test_unused_time_of_a_step_rolls_forward_to_later_steps(
    store_url: str, call_log: Path
) -> None:
    # The first step uses 0.2 s of the quarter of a 20 s budget it is given; what it leaves
    # rolls forward: the second step gets a third of what is left (not a fixed quarter), the
    # last one all that is left (not a fixed half). The budget is large so that load on the
    # machine cannot blur the two: a fixed share (5 s, 10 s) lies seconds outside the bounds.
    total = 20_000.0
    spec = spec_from_dict(
        {
            "name": "rollover",
            "budget": f"{total:.0f}ms",
            "steps": [
                {"id": "early", "tool": "tools.py:async_sleepy", "args": {"seconds": 0.2}},
                {"id": "next", "tool": "tools.py:add", "args": {"a": 1, "b": 2}},
                {"id": "last", "weight": 2, "tool": "tools.py:add", "args": {"a": 3, "b": 4}},
            ],
        }
    )
    store = open_store(store_url)
    runner = Runner(store, make_dispatcher(None), LocalLimiter())
    try:
        called_at = time.time()  # the budget clock starts after this
        result = await runner.run(spec, {}, source_dir=CHAINS)
        steps = await store.get_steps(result.run_id)
    finally:
        await store.close()
    assert result.status == "completed", result.error
    early, nxt, last = steps["early"], steps["next"], steps["last"]
    assert early.elapsed_ms >= 190  # the tool's 0.2 s sleep (asyncio may wake a little early)

    def used_before(step_started_at: float, *earlier: float) -> tuple[float, float]:
        # At least what the earlier steps took; at most the wall time since the call.
        return sum(earlier), (step_started_at - called_at) * 1000

    for record, used, share in [
        (early, used_before(early.started_at), 1 / 4),
        (nxt, used_before(nxt.started_at, early.elapsed_ms), 1 / 3),
        (last, used_before(last.started_at, early.elapsed_ms, nxt.elapsed_ms), 2 / 2),
    ]:
        low, high = _bounds_ms(total, used, share)
        assert low - 0.01 <= record.allotted_ms <= high + 0.01, (record.step_id, used, share)
    # Fixed shares of the total would have been these; the bounds above exclude them.
    assert nxt.allotted_ms > total / 4 + 1000
    assert last.allotted_ms > total / 2 + 1000


async def test_heartbeat_keeps_a_running_run_from_being_taken_over(
    store_url: str, call_log: Path
) -> None:
    # A lease of 1.5 s renewed every 0.5 s; the run takes 4.5 s, three lease lengths. A runner
    # on another host (so that only the lease, not a pid check, can stand in its way) tries
    # resume(wait=False) once the first lease would have expired, then every half lease:
    # each try must be refused while the owner still runs. Without renewal, the first try
    # takes the run over. 1.5 s rather than a shorter lease: a loaded 2-core machine may stall
    # the loop for a good part of a second, and a renewed lease must survive a 1 s stall.
    ttl_s = 1.5
    spec = spec_from_dict(
        {
            "name": "long_step",
            "budget": "60s",
            "steps": [{"id": "slow", "tool": "tools.py:async_sleepy", "args": {"seconds": 4.5}}],
        }
    )
    owner_store, other_store = open_store(store_url), open_store(store_url)
    owner = Runner(owner_store, make_dispatcher(None), LocalLimiter(), lease_ttl_s=ttl_s)
    other = Runner(
        other_store, make_dispatcher(None), LocalLimiter(), lease_ttl_s=ttl_s, host="other-host"
    )
    try:
        running = asyncio.create_task(owner.run(spec, {}, source_dir=CHAINS, run_id="beat-1"))
        created = time.time()
        refused = []
        await asyncio.sleep(ttl_s * 1.5)
        while not running.done():
            with pytest.raises(RunLocked, match="lease valid"):
                await other.resume("beat-1", wait=False)
            refused.append(time.time() - created)
            await asyncio.sleep(ttl_s / 2)
        result = await running
    finally:
        await owner_store.close()
        await other_store.close()
    assert result.status == "completed", result.error
    assert len(refused) >= 2, refused
    assert calls(call_log) == ["async_sleepy"]  # the step ran once, in its owner


async def test_one_runner_runs_many_runs_at_once_each_with_its_own_progress(
    store_url: str,
) -> None:
    from chainrt._progress import Progress
    from chainrt.store import RunRecord, StepRecord

    class Seen(Progress):
        def __init__(self) -> None:
            self.events: list[tuple[str, str]] = []

        def run_started(self, record: RunRecord, *, resumed: bool) -> None:
            self.events.append(("run", record.run_id))

        def step_finished(self, record: StepRecord) -> None:
            self.events.append(("step", record.step_id))

    spec = spec_from_dict(
        {
            "name": "together",
            "budget": "30s",
            "inputs": {"n": "int"},
            "steps": [
                {"id": "wait", "tool": "tools.py:async_sleepy", "args": {"seconds": 0.3}},
                {"id": "sum", "tool": "tools.py:add", "args": {"a": "{{ input.n }}", "b": 1}},
            ],
        }
    )
    store = open_store(store_url)
    runner = Runner(store, make_dispatcher(None), LocalLimiter())
    seen = [Seen() for _ in range(5)]
    try:
        results = await asyncio.gather(
            *(
                runner.run(spec, {"n": n}, source_dir=CHAINS, run_id=f"many-{n}", progress=seen[n])
                for n in range(5)
            )
        )
    finally:
        await store.close()
    assert [(r.run_id, r.status, r.output) for r in results] == [
        (f"many-{n}", "completed", n + 1) for n in range(5)
    ]
    for n, progress in enumerate(seen):
        assert progress.events == [("run", f"many-{n}"), ("step", "wait"), ("step", "sum")]


async def test_resume_refuses_a_live_owner_without_wait(store_url: str) -> None:
    from chainrt.store import OwnerLease, RunRecord, open_store

    chain = chainrt.load(CHAINS / "misc.yaml")
    store = open_store(store_url)
    try:
        # A run owned by a process on another host whose lease is still valid.
        await store.create_run(
            RunRecord(
                run_id="live-1",
                chain=chain.name,
                spec=chain.spec.model_dump(mode="json", by_alias=True),
                source=str(CHAINS),
                input={"x": 1},
                budget_total_ms=5000,
                owner=OwnerLease(host="elsewhere", pid=1, token=1, expires_at=time.time() + 60),
                fencing_token=1,
            )
        )
    finally:
        await store.close()
    with pytest.raises(RunLocked, match="elsewhere"):
        await chainrt.aresume("live-1", store=store_url, wait=False)


async def test_resume_takes_over_an_expired_lease_and_finishes(store_url: str) -> None:
    from chainrt.store import OwnerLease, RunRecord, open_store

    chain = chainrt.load(CHAINS / "misc.yaml")
    store = open_store(store_url)
    try:
        await store.create_run(
            RunRecord(
                run_id="expired-1",
                chain=chain.name,
                spec=chain.spec.model_dump(mode="json", by_alias=True),
                source=str(CHAINS),
                input={"x": 5},
                budget_total_ms=5000,
                budget_used_ms=1000,
                owner=OwnerLease(host="elsewhere", pid=1, token=1, expires_at=time.time() - 1),
                fencing_token=1,
            )
        )
    finally:
        await store.close()
    result = await chainrt.aresume("expired-1", store=store_url)
    assert result.status == "completed", result.error
    assert result.output["sum"] == 7
    assert result.budget.used_ms >= 1000  # the remaining budget, not a fresh one
