"""Agent steps through the real runner, against a scripted model (a real HTTP server that plays
back a fixed conversation: chainrt/testing/scripted_model.py): the loop, bad calls fed back, the final reserve,
records under paths, and a kill -9 mid-call whose resume runs no recorded call again."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import chainrt
from chainrt._progress import Progress
from chainrt._runner import Runner
from chainrt.agent._turns import ANSWER_SCHEMA
from chainrt.concurrency import LocalLimiter
from chainrt.dispatch import Dispatcher
from chainrt.dispatch._pool import load_pool_backends
from chainrt.spec import add_chain_root
from chainrt.store import open_store
from chainrt.testing.scripted_model import AgentStub, answer, calls, serve

AGENT = Path(__file__).parent / "data" / "chains" / "agent"

# A loaded 2-core machine may wake the loop late and a SQLite commit may take tens of ms; the
# margin covers that (the nominal figures are bench/agent.py's).
LOAD_MARGIN_MS = 400.0


@pytest.fixture
def call_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "calls.jsonl"
    monkeypatch.setenv("CHAINRT_TEST_LOG", str(path))
    return path


def logged(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [json.loads(line)["tool"] for line in path.read_text().splitlines()]


def stub(
    script: list[str], final: str = "final answer", delay_s: float = 0.0
) -> Iterator[AgentStub]:
    yield from serve(script, final, delay_s)


def chain_files(tmp_path: Path, model: AgentStub, **agent: Any) -> tuple[Path, Path]:
    """A copy of the agent chain (its tools beside it) with ``agent`` fields changed, and a pool
    file whose ``primary`` is the scripted model."""
    shutil.copy(AGENT / "tools.py", tmp_path / "tools.py")
    text = (AGENT / "orders.yaml").read_text()
    budget = agent.pop("budget", None)
    if budget is not None:
        text = text.replace("budget: 20s", f"budget: {budget}")
    for key, value in agent.items():
        line = re.compile(rf"^      {key}: .*$", re.MULTILINE)
        if line.search(text):
            text = line.sub(f"      {key}: {value}", text)
        else:
            text = text.replace(
                "      constrain: shape\n", f"      constrain: shape\n      {key}: {value}\n"
            )
    chain = tmp_path / "orders.yaml"
    chain.write_text(text)
    pool = tmp_path / "pool.yaml"
    pool.write_text(
        f"models:\n  primary: {{endpoints: [{{url: '{model.url}'}}]}}\nhealth: {{enabled: false}}\n"
    )
    return chain, pool


async def records(store_url: str, run_id: str) -> dict[str, Any]:
    store = open_store(store_url)
    try:
        return await store.get_steps(run_id)
    finally:
        await store.close()


async def test_calls_proposed_together_run_and_their_results_go_back(
    tmp_path: Path, store_url: str, call_log: Path
) -> None:
    script = [
        calls(("lookup_order", {"order_id": "A1"}), ("refund_policy", {})),
        answer("A1 has shipped; refunds within 30 days."),
    ]
    for model in stub(script):
        chain, pool = chain_files(tmp_path, model)
        result = await chainrt.load(chain).arun(
            {"question": "Where is A1?"}, run_id="a1", store=store_url, pool=str(pool)
        )
        assert result.status == "completed", result.error
        assert result.output == {
            "answer": "A1 has shipped; refunds within 30 days.",
            "calls": [
                {"name": "lookup_order", "arguments": {"order_id": "A1"},
                 "result": {"order_id": "A1", "status": "shipped", "total": 40}},
                {"name": "refund_policy", "arguments": {}, "result": "refunds within 30 days"},
            ],
            "iterations": 2,
            "stopped": "answer",
        }  # fmt: skip
        # The result nests the turns and calls under the agent step, in the order they ran.
        inner = [str(s.path) for s in result.steps[0].steps or []]
        assert inner[0] == "agent.turn[0]"
        assert sorted(inner[1:3]) == ["agent.call[0.0]", "agent.call[0.1]"]
        assert inner[3] == "agent.turn[1]"
        steps = await records(store_url, "a1")
        assert {"agent.turn[0]", "agent.call[0.0]", "agent.call[0.1]", "agent.turn[1]"} <= set(
            steps
        )
        assert steps["agent.call[0.0]"].status == "completed"
        assert steps["agent.turn[0]"].attempt_log[0].usage is not None
        # The second turn carried both results; the first offered the tools in its system message.
        first, second = model.requests
        assert "lookup_order" in first["messages"][0]["content"]
        assert first["response_format"]["type"] == "json_schema"
        fed = second["messages"][-1]["content"]
        assert '"status": "shipped"' in fed
        assert "refunds within 30 days" in fed
    assert sorted(logged(call_log)) == ["lookup_order", "refund_policy"]


async def test_bad_calls_go_back_to_the_model_and_the_step_goes_on(
    tmp_path: Path, call_log: Path
) -> None:
    script = [
        calls(("nope", {}), ("lookup_order", {"order_id": 5}), ("broken", {"reason": "disk"})),
        answer("sorry"),
    ]
    for model in stub(script):
        chain, pool = chain_files(tmp_path, model)
        store = f"sqlite:///{tmp_path / 'runs.db'}"
        result = await chainrt.load(chain).arun(
            {"question": "?"}, run_id="bad", store=store, pool=str(pool)
        )
        assert result.status == "completed", result.error
        made = result.output["calls"]
        assert "there is no tool 'nope'" in made[0]["error"]
        assert "order_id" in made[1]["error"]
        assert "string" in made[1]["error"]
        assert "broken tool: disk" in made[2]["error"]
        fed = model.requests[1]["messages"][-1]["content"]
        assert "there is no tool 'nope'" in fed
        assert "broken tool: disk" in fed
        steps = await records(store, "bad")
        assert [steps[f"agent.call[0.{i}]"].status for i in range(3)] == ["failed"] * 3
    assert logged(call_log) == ["broken"]  # the checked-out calls never ran


async def test_max_iterations_then_one_last_turn_without_tools(tmp_path: Path) -> None:
    for model in stub([calls(("refund_policy", {}))], final="out of turns"):
        chain, pool = chain_files(tmp_path, model, max_iterations=2)
        store = f"sqlite:///{tmp_path / 'runs.db'}"
        result = await chainrt.load(chain).arun(
            {"question": "?"}, run_id="max", store=store, pool=str(pool)
        )
        assert result.status == "completed", result.error
        assert result.output["stopped"] == "max_iterations"
        assert result.output["answer"] == "out of turns"
        assert result.output["iterations"] == 3
        last = model.requests[-1]
        assert last["response_format"]["json_schema"]["schema"] == ANSWER_SCHEMA  # no tools offered


async def test_the_final_reserve_stops_tool_calls_and_the_answer_comes_in_time(
    tmp_path: Path,
) -> None:
    # Each tool turn sleeps 300 ms in a tool; with a 1.5 s budget and a 600 ms reserve, the loop
    # must stop calling tools and answer, inside the budget.
    for model in stub([calls(("slow", {"ms": 300}))], final="what I have"):
        chain, pool = chain_files(tmp_path, model, budget="1500ms", final_reserve="600ms")
        store = f"sqlite:///{tmp_path / 'runs.db'}"
        result = await chainrt.load(chain).arun(
            {"question": "?"}, run_id="reserve", store=store, pool=str(pool)
        )
        assert result.status == "completed", result.error
        assert result.output["stopped"] == "budget"
        assert result.output["answer"] == "what I have"
        assert 1 <= len(result.output["calls"]) < 4
        assert result.budget.used_ms <= result.budget.total_ms + LOAD_MARGIN_MS


async def test_slow_record_writes_do_not_take_the_last_turns_reserve(tmp_path: Path) -> None:
    # Each record of a turn or call takes 600 ms to write; the model 600 ms to answer; the
    # reserve is 1 s. The call runs until the work must end; were its record written inside the
    # reserve, the last turn would have 400 ms for its 600 ms answer and the run would end with
    # nothing to say. The loop keeps time for the writes it has measured (600 ms x 1.5).
    for model in stub([calls(("slow", {"ms": 10_000}))], final="what I have", delay_s=0.6):
        chain, pool = chain_files(tmp_path, model, budget="4s", final_reserve="1s")
        store = open_store(f"sqlite:///{tmp_path / 'runs.db'}")
        inner = store.commit

        async def slow_commit(run_id: str, token: int, progress: Any, step: Any = None) -> Any:
            if step is not None and (".turn[" in step.step_id or ".call[" in step.step_id):
                await asyncio.sleep(0.6)
            return await inner(run_id, token, progress, step)

        store.commit = slow_commit  # type: ignore[method-assign]
        try:
            result = await chainrt.load(chain).arun(
                {"question": "?"}, run_id="slow-writes", store=store, pool=str(pool)
            )
            steps = await store.get_steps("slow-writes")
        finally:
            await store.close()
        assert result.status == "completed", result.error
        assert result.output["answer"] == "what I have"
        assert result.output["stopped"] == "budget"
        assert steps["agent.call[0.0]"].status == "failed"  # cut when the work had to end
        assert steps["agent.turn[1]"].status == "completed"


async def test_a_measured_reserve_is_kept_whole_when_it_is_most_of_the_budget(
    tmp_path: Path,
) -> None:
    # The model answers in 1 s (measured by a first run: p90 1 s, reserve 1.5 s). With a 2 s
    # budget the reserve is most of it; cut to half the allotment (under 1 s) it would leave
    # the last turn too little for a 1 s answer, and the run would end with nothing to say.
    script = [calls(("refund_policy", {}))] * 3 + [answer("done")]
    for model in stub(script, final="what I have", delay_s=1.0):
        chain, pool = chain_files(tmp_path, model, final_reserve="auto")
        store = f"sqlite:///{tmp_path / 'runs.db'}"
        warm = await chainrt.load(chain).arun(
            {"question": "?"}, run_id="warm", store=store, pool=str(pool)
        )
        assert warm.output["stopped"] == "answer"  # four answers measured
        chain.write_text(chain.read_text().replace("budget: 20s", "budget: 2s"))
        result = await chainrt.load(chain).arun(
            {"question": "?"}, run_id="tight", store=store, pool=str(pool)
        )
        assert result.status == "completed", result.error
        assert result.output["answer"] == "what I have"
        assert result.output["stopped"] == "budget"


def _run_until_killed(chain: Path, pool: Path, store_url: str, marker: Path, log: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAINRT_")}
    env.update(
        {
            "CHAINRT_STORE": store_url,
            "CHAINRT_POOL": str(pool),
            "CHAINRT_TEST_LOG": str(log),
            "CHAINRT_TEST_KILL_AT": str(marker),
        }
    )
    owner = subprocess.Popen(
        [sys.executable, "-m", "chainrt", "run", str(chain),
         "--input", json.dumps({"question": "refund A1"}), "--run-id", "kill-1", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert owner.poll() is None, owner.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.02)
        os.kill(owner.pid, signal.SIGKILL)  # inside issue_refund: turn 0's calls are recorded
    finally:
        owner.wait(timeout=30)
        owner.communicate()


async def test_a_resume_after_kill_9_runs_no_recorded_call_again(
    tmp_path: Path, store_url: str, call_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = [
        calls(("lookup_order", {"order_id": "A1"}), ("refund_policy", {})),
        calls(("issue_refund", {"refund": {"order_id": "A1", "amount": 40}})),
        answer("Refunded 40 EUR for A1."),
    ]
    marker = tmp_path / "in_refund"
    for model in stub(script):
        chain, pool = chain_files(tmp_path, model)
        _run_until_killed(chain, pool, store_url, marker, call_log)
        before = await records(store_url, "kill-1")
        recorded = {p for p, r in before.items() if r.status in ("completed", "failed")}
        assert {"agent.turn[0]", "agent.call[0.0]", "agent.call[0.1]", "agent.turn[1]"} <= recorded
        assert logged(call_log) == ["lookup_order", "refund_policy", "issue_refund"] or sorted(
            logged(call_log)
        ) == ["issue_refund", "lookup_order", "refund_policy"]
        asked_before = len(model.requests)
        monkeypatch.setenv("CHAINRT_TEST_KILL_AT", str(marker))  # exists: no second kill
        add_chain_root(tmp_path)  # the killed process's chain folder: this process may use it
        result = await chainrt.aresume("kill-1", store=store_url, pool=str(pool), wait=False)
        assert result.status == "completed", result.error
        assert result.output["answer"] == "Refunded 40 EUR for A1."
        after = await records(store_url, "kill-1")
        for path in recorded:
            assert after[path] == before[path], path  # not run, not written again
        # Only the call in flight at the kill ran again (once, same key, next attempt), and
        # the model was asked only the turn after it.
        ran = logged(call_log)
        assert sorted(ran) == ["issue_refund", "issue_refund", "lookup_order", "refund_policy"]
        keys = [json.loads(x) for x in call_log.read_text().splitlines()]
        refunds = [k for k in keys if k["tool"] == "issue_refund"]
        assert refunds[0]["key"] == refunds[1]["key"] == "kill-1:agent.call[1.0]"
        assert refunds[1]["attempt"] == refunds[0]["attempt"] + 1
        assert len(model.requests) - asked_before == 1


async def test_strict_calls_decode_into_each_tools_schema(tmp_path: Path) -> None:
    refund = {"refund": {"order_id": "A1", "amount": 12.5}}
    for model in stub([calls(("issue_refund", refund)), answer("done")]):
        chain, pool = chain_files(tmp_path, model, constrain="calls")
        store = f"sqlite:///{tmp_path / 'runs.db'}"
        result = await chainrt.load(chain).arun(
            {"question": "?"}, run_id="strict", store=store, pool=str(pool)
        )
        assert result.status == "completed", result.error
        assert result.output["calls"][0]["result"] == {"refunded": 12.5, "order_id": "A1"}
        schema = model.requests[0]["response_format"]["json_schema"]["schema"]
        items = schema["anyOf"][0]["properties"]["calls"]["items"]["anyOf"]
        names = [item["properties"]["name"]["const"] for item in items]
        assert names == ["lookup_order", "refund_policy", "issue_refund", "broken", "slow"]


async def test_a_tools_own_key_runs_its_calls_one_at_a_time(tmp_path: Path, call_log: Path) -> None:
    together = calls(("slow", {"ms": 150}), ("slow", {"ms": 150}), ("slow", {"ms": 150}))
    for model in stub([together, answer("done")]):
        chain, pool = chain_files(tmp_path, model)
        keyed = '{tool: tools.py:slow, concurrency: [{key: "slow:{{ args.ms }}", limit: 1}]}'
        text = chain.read_text().replace("tools.py:slow", keyed)
        # The step's own key (held for the whole loop) sees the agent's model as step.model.
        step_key = '    concurrency: [{key: "model:{{ step.model }}", limit: 1}]\noutput:'
        chain.write_text(text.replace("output:", step_key))
        store = f"sqlite:///{tmp_path / 'runs.db'}"
        result = await chainrt.load(chain).arun(
            {"question": "?"}, run_id="keyed", store=store, pool=str(pool)
        )
        assert result.status == "completed", result.error
        assert [c["result"] for c in result.output["calls"]] == ["slept"] * 3
        assert set((await records(store, "keyed"))["agent"].waits_ms) == {"model:primary"}
    spans = sorted(
        (entry["started"], entry["ended"])
        for entry in map(json.loads, call_log.read_text().splitlines())
    )
    assert len(spans) == 3
    for (_, ended), (started, _) in itertools.pairwise(spans):
        assert started >= ended  # never two at once: each waited for the key


@pytest.mark.slow
def test_the_example_agent_on_the_local_model(tmp_path: Path) -> None:
    # The real in-process model (constrained decoding), end to end: whatever the small model
    # decides, every call it makes names a real tool, each is recorded, and an answer comes.
    store = f"sqlite:///{tmp_path}/runs.db"
    chain = chainrt.load(Path(__file__).parent.parent / "chains" / "agent_example.yaml")
    result = chain.run(
        {"question": "Where is my order 1042?"}, run_id="e2e", store=store, pool=None, budget="90s"
    )
    assert result.status == "completed", result.error
    output = result.output
    assert isinstance(output, dict)
    assert isinstance(output["answer"], str)
    assert output["answer"]
    assert output["stopped"] in ("answer", "max_iterations", "budget")
    assert {c["name"] for c in output["calls"]} <= {"lookup_order", "refund_policy"}
    steps = asyncio.run(records(store, "e2e"))
    for turn in range(output["iterations"]):
        assert steps[f"agent.turn[{turn}]"].model == "local"
    assert sum(1 for path in steps if ".call[" in path) == len(output["calls"])


class _Tokens(Progress):
    wants_tokens = True

    def __init__(self) -> None:
        self.tokens: list[tuple[str, str]] = []
        self.attempts: list[str] = []

    def token(self, step_id: str, text: str) -> None:
        self.tokens.append((step_id, text))

    def attempt(self, step_id: str, record: Any) -> None:
        self.attempts.append(step_id)


async def test_every_turn_streams_its_tokens_as_the_steps_events(tmp_path: Path) -> None:
    script = [calls(("refund_policy", {})), answer("policy read")]
    for model in stub(script):
        chain, pool = chain_files(tmp_path, model)
        loaded = chainrt.load(chain)
        store = open_store(f"sqlite:///{tmp_path / 'runs.db'}")
        heard = _Tokens()
        try:
            runner = Runner(store, Dispatcher(load_pool_backends(pool)), LocalLimiter())
            result = await runner.run(
                loaded.spec, {"question": "?"}, source_dir=tmp_path, progress=heard
            )
        finally:
            await store.close()
        assert result.status == "completed", result.error
        assert all(body.get("stream") for body in model.requests)
        streamed = "".join(text for _, text in heard.tokens)
        assert streamed == script[0] + script[1]  # both turns, in order
        assert {step for step, _ in heard.tokens} == {"agent"}
        assert heard.attempts == ["agent", "agent"]


async def test_a_langchain_tool_is_offered_and_called(tmp_path: Path) -> None:
    script = [calls(("word_count", {"text": "one two three"})), answer("three words")]
    for model in stub(script):
        chain, pool = chain_files(tmp_path, model, constrain="calls")
        shutil.copy(AGENT / "lc_tools.py", tmp_path / "lc_tools.py")
        chain.write_text(chain.read_text().replace("tools.py:slow", "lc_tools.py:word_count"))
        store = f"sqlite:///{tmp_path / 'runs.db'}"
        result = await chainrt.load(chain).arun(
            {"question": "?"}, run_id="lc", store=store, pool=str(pool)
        )
        assert result.status == "completed", result.error
        assert result.output["calls"] == [
            {"name": "word_count", "arguments": {"text": "one two three"}, "result": 3}
        ]
        offered = model.requests[0]["messages"][0]["content"]
        assert "word_count: Count the words of a text." in offered


async def test_a_model_too_slow_for_even_the_last_turn_ends_the_run_partial(
    tmp_path: Path,
) -> None:
    for model in stub([answer("too late")], delay_s=3.0):
        chain, pool = chain_files(tmp_path, model, budget="800ms")
        store = f"sqlite:///{tmp_path / 'runs.db'}"
        result = await chainrt.load(chain).arun(
            {"question": "?"}, run_id="slow", store=store, pool=str(pool)
        )
        assert result.status == "partial"
        assert result.steps[0].status == "timed_out"
        assert result.budget.used_ms <= result.budget.total_ms + LOAD_MARGIN_MS
        steps = await records(store, "slow")
        assert steps["agent"].output["answer"] is None
        assert steps["agent"].output["stopped"] == "budget"
        assert steps["agent.turn[0]"].status == "timed_out"  # the last turn, cut too


async def test_each_turn_falls_back_when_the_model_cannot_answer(tmp_path: Path) -> None:
    for model in stub([calls(("refund_policy", {})), answer("from the backup")]):
        chain, pool = chain_files(tmp_path, model)
        chain.write_text(chain.read_text().replace("output:", "    fallbacks: [backup]\noutput:"))
        # primary: nothing listens there (a refused connection); backup: the scripted model.
        pool.write_text(
            "models:\n  primary: {endpoints: [{url: 'http://127.0.0.1:9'}]}\n"
            f"  backup: {{endpoints: [{{url: '{model.url}'}}]}}\nhealth: {{enabled: false}}\n"
        )
        store = f"sqlite:///{tmp_path / 'runs.db'}"
        result = await chainrt.load(chain).arun(
            {"question": "?"}, run_id="fb", store=store, pool=str(pool)
        )
        assert result.status == "completed", result.error
        assert result.output["answer"] == "from the backup"
        steps = await records(store, "fb")
        for turn in ("agent.turn[0]", "agent.turn[1]"):
            assert steps[turn].model == "backup"
            assert steps[turn].fallback == "backup"
            assert [a.model for a in steps[turn].attempt_log][-1] == "backup"
        assert steps["agent"].fallback == "backup"


async def test_a_result_the_store_cannot_hold_goes_back_as_an_error_and_never_runs_again(
    tmp_path: Path, call_log: Path
) -> None:
    for model in stub([calls(("unstorable", {})), answer("noted")]):
        chain, pool = chain_files(tmp_path, model)
        chain.write_text(chain.read_text().replace("tools.py:slow", "tools.py:unstorable"))
        store = f"sqlite:///{tmp_path / 'runs.db'}"
        result = await chainrt.load(chain).arun(
            {"question": "?"}, run_id="unstorable", store=store, pool=str(pool)
        )
        assert result.status == "completed", result.error
        made = result.output["calls"][0]
        assert "could not be stored" in made["error"]
        assert "result" not in made
        assert "could not be stored" in model.requests[1]["messages"][-1]["content"]
        steps = await records(store, "unstorable")
        assert steps["agent.call[0.0]"].status == "failed"
    assert logged(call_log) == ["unstorable"]


async def test_agents_inside_a_parallel_group_record_under_their_paths(tmp_path: Path) -> None:
    script = [calls(("lookup_order", {"order_id": "A1"})), answer("A1 shipped")]
    for model in stub(script):
        _, pool = chain_files(tmp_path, model)
        agent = (
            "{id: %s, agent: {model: primary, prompt: '?', constrain: shape, "
            "tools: [tools.py:lookup_order]}}"
        )
        chain = tmp_path / "fan.yaml"
        chain.write_text(
            "name: fan\nbudget: 20s\nsteps:\n  - id: fan\n    parallel:\n"
            f"      a: [{agent % 'one'}]\n      b: [{agent % 'two'}]\n"
        )
        store = f"sqlite:///{tmp_path / 'runs.db'}"
        result = await chainrt.load(chain).arun({}, run_id="fan", store=store, pool=str(pool))
        assert result.status == "completed", result.error
        assert {b: o["answer"] for b, o in result.output.items()} == {
            "a": "A1 shipped",
            "b": "A1 shipped",
        }
        steps = await records(store, "fan")
        for prefix in ("fan.a.one", "fan.b.two"):
            assert steps[f"{prefix}.call[0.0]"].output["result"]["status"] == "shipped"
            assert steps[f"{prefix}.turn[1]"].status == "completed"
        fan = result.steps[0]
        one = next(s for s in fan.steps or [] if s.id == "one")
        assert [s.path for s in one.steps or []] == [
            "fan.a.one.turn[0]",
            "fan.a.one.call[0.0]",
            "fan.a.one.turn[1]",
        ]
