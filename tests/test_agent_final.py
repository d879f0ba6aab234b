"""An agent's last turn on a tight budget (issue 38), through the real runner against a scripted
model (a real HTTP server, chainrt/testing/scripted_model.py): the last turn is asked while the
calls' records are still being written (its own record after theirs), and a last turn cut by the
step's deadline answers with the text it had, marked cut (step and run ``partial``)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from test_agent_runner import LOAD_MARGIN_MS, chain_files, logged, records

import chainrt
from chainrt._run._agent_final import answer_so_far
from chainrt.store import open_store
from chainrt.testing.scripted_model import calls, serve

FULL = "Order A1 shipped on Monday and will arrive on Thursday by noon."
stub = serve


@pytest.fixture
def call_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "calls.jsonl"
    monkeypatch.setenv("CHAINRT_TEST_LOG", str(path))
    return path


async def test_the_last_turn_is_asked_while_the_calls_records_are_written(
    tmp_path: Path,
) -> None:
    # The model answers in 1 s; the call's record takes 2.5 s to write (a store stalling on
    # fsync; under the 3 s a write may take here, what the budget has left); the budget is 4 s.
    # Asked after the write, the last turn would start at ~3.5 s and be cut with nothing to say;
    # asked beside it, its answer comes at ~2 s, and its own record is written once the call's is.
    for model in stub([calls(("refund_policy", {}))], final="30 days", delay_s=1.0):
        chain, pool = chain_files(tmp_path, model, budget="4s", max_iterations=1)
        store = open_store(f"sqlite:///{tmp_path / 'runs.db'}")
        inner = store.commit
        written: list[str] = []
        asked_by_then: list[int] = []

        async def slow_commit(run_id: str, token: int, progress: Any, step: Any = None) -> None:
            if step is not None and ".call[" in step.step_id:
                await asyncio.sleep(2.5)
                asked_by_then.append(len(model.requests))
            await inner(run_id, token, progress, step)
            if step is not None:
                written.append(step.step_id)

        store.commit = slow_commit  # type: ignore[method-assign]
        try:
            result = await chainrt.load(chain).arun(
                {"question": "?"}, run_id="beside", store=store, pool=str(pool)
            )
        finally:
            await store.close()
        assert result.status == "completed", result.error
        assert result.output["answer"] == "30 days"
        assert result.output["stopped"] == "max_iterations"
        assert asked_by_then == [2]  # the last turn's request came while the write stalled
        assert written.index("agent.call[0.0]") < written.index("agent.turn[1]")


async def test_a_call_record_the_store_refuses_is_told_to_the_last_turn(
    tmp_path: Path, call_log: Path
) -> None:
    # The last turn is asked while the call's record is written; the store refuses it (the
    # result is too deep to store): the turn is asked again with the error the records hold.
    for model in stub([calls(("unstorable", {}))], final="noted"):
        chain, pool = chain_files(tmp_path, model, max_iterations=1)
        chain.write_text(chain.read_text().replace("tools.py:slow", "tools.py:unstorable"))
        store = f"sqlite:///{tmp_path / 'runs.db'}"
        result = await chainrt.load(chain).arun(
            {"question": "?"}, run_id="refused", store=store, pool=str(pool)
        )
        assert result.status == "completed", result.error
        assert result.output["answer"] == "noted"
        assert "could not be stored" in result.output["calls"][0]["error"]
        told = model.requests[-1]["messages"][-2]["content"]
        assert "could not be stored" in told
        assert "returned" not in told
        steps = await records(store, "refused")
        assert steps["agent.call[0.0]"].status == "failed"
        assert steps["agent.turn[1]"].status == "completed"


async def test_a_last_turn_cut_at_the_deadline_answers_with_the_text_it_had(
    tmp_path: Path, call_log: Path
) -> None:
    # The last answer streams 8 characters every 250 ms (2.5 s in all); the budget is 1.2 s.
    for model in stub([calls(("refund_policy", {}))], final=FULL, pace_s=0.25):
        chain, pool = chain_files(tmp_path, model, budget="1200ms", max_iterations=1)
        store = f"sqlite:///{tmp_path / 'runs.db'}"
        result = await chainrt.load(chain).arun(
            {"question": "?"}, run_id="cut", store=store, pool=str(pool)
        )
        assert result.status == "partial"
        assert result.steps[0].status == "partial"
        assert result.budget.used_ms <= result.budget.total_ms + LOAD_MARGIN_MS
        steps = await records(store, "cut")
        output = steps["agent"].output
        assert output["cut"] is True
        assert output["stopped"] == "budget"
        said = output["answer"]
        assert said
        assert FULL.startswith(said)
        assert said != FULL
        assert output["calls"][0]["result"] == "refunds within 30 days"
        assert "cut off at the step's deadline" in str(steps["agent"].error)
        last = steps["agent.turn[1]"]
        assert last.status == "partial"
        assert last.output["cut"] is True
        assert last.output["text"].startswith('{"content": "Order A1')
        # A resume with time asks the last turn again (a cut turn is not replayed) and runs
        # no call again.
        model.pace_s = 0.0
        resumed = await chainrt.aresume("cut", store=store, pool=str(pool), budget="10s")
        assert resumed.status == "completed", resumed.error
        assert resumed.output["answer"] == FULL
        assert resumed.output["stopped"] == "max_iterations"
        assert "cut" not in resumed.output
        assert len(model.requests) == 3  # the first turn replayed, the last asked twice
    assert logged(call_log) == ["refund_policy"]


async def test_a_worker_that_stops_at_the_deadline_gives_the_text_it_had(
    tmp_path: Path,
) -> None:
    # A worker stops generating at the request's deadline and replies with the text so far
    # (finish_reason "deadline"): the agent answers with it, marked cut.
    for model in stub(
        [calls(("refund_policy", {}))], final='{"content": "Order A1 sh', final_finish="deadline"
    ):
        chain, pool = chain_files(tmp_path, model, max_iterations=1)
        store = f"sqlite:///{tmp_path / 'runs.db'}"
        result = await chainrt.load(chain).arun(
            {"question": "?"}, run_id="worker-cut", store=store, pool=str(pool)
        )
        assert result.status == "partial"
        steps = await records(store, "worker-cut")
        assert steps["agent"].status == "partial"
        assert steps["agent"].output["answer"] == "Order A1 sh"
        assert steps["agent"].output["cut"] is True
        assert steps["agent.turn[1]"].model == "primary"


async def test_a_last_turn_cut_before_its_answer_began_ends_with_nothing_to_say(
    tmp_path: Path,
) -> None:
    # Only '{"conten' came before the deadline: no answer had begun, and none is made up.
    for model in stub([calls(("refund_policy", {}))], final=FULL, pace_s=5.0):
        chain, pool = chain_files(tmp_path, model, budget="1s", max_iterations=1)
        store = f"sqlite:///{tmp_path / 'runs.db'}"
        result = await chainrt.load(chain).arun(
            {"question": "?"}, run_id="nothing", store=store, pool=str(pool)
        )
        assert result.status == "partial"
        assert result.steps[0].status == "timed_out"
        steps = await records(store, "nothing")
        assert steps["agent"].output["answer"] is None
        assert "cut" not in steps["agent"].output
        assert steps["agent.turn[1]"].status == "timed_out"


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('{"content": "Order A1 sh', "Order A1 sh"),
        ('{ "content" : "a \\"quoted\\" word', 'a "quoted" word'),
        ('{"content": "line\\nbreak and \\u00e9t\\u00', "line\nbreak and \u00e9t"),
        ('{"content": "ends with a backslash \\', "ends with a backslash"),
        ('{"content": "smile \\ud83d', "smile"),
        ('{"content": "whole"}', "whole"),
        ('{"content": "', ""),
        ('{"conten', ""),
        ('{"calls": [{"name": "x"', ""),
        ("plain text from a backend", "plain text from a backend"),
        ("   ", ""),
    ],
)
def test_the_answer_so_far_is_read_from_a_cut_reply(text: str, said: str) -> None:
    assert answer_so_far(text) == said
