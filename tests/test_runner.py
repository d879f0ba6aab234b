"""The runner on tool chains: budgets, deadlines, retries, partial stops, resume semantics."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import chainrt
from chainrt import InputError, RunLocked

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
