"""Approvals of an agent's tool calls (``approval: NAME``), through the real runner against the
scripted model (chainrt/testing/scripted_model.py), on SQLite and Redis: each call waits for its
own signal, a refused call is never run and the model is told why, a resume never asks twice,
and a kill -9 of the process running an approved call runs it at most once more."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_agent_runner import chain_files, logged, stub

import chainrt
from chainrt import Runtime
from chainrt.agent._approvals import approval_key
from chainrt.errors import SignalRefused, SpecError
from chainrt.runs._signals import parked_detail, parked_wait
from chainrt.spec import add_chain_root
from chainrt.testing.scripted_model import AgentStub, answer, calls
from chainrt.testing.serve_process import ServeProcess

APPROVED = "{tool: tools.py:issue_refund, approval: refund_ok}"


@pytest.fixture
def call_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "calls.jsonl"
    monkeypatch.setenv("CHAINRT_TEST_LOG", str(path))
    return path


def refund(order_id: str, amount: float) -> tuple[str, dict[str, object]]:
    return ("issue_refund", {"refund": {"order_id": order_id, "amount": amount}})


def approval_chain(tmp_path: Path, model: AgentStub) -> tuple[Path, Path]:
    chain, pool = chain_files(tmp_path, model)
    text = chain.read_text()
    assert "        - tools.py:issue_refund\n" in text
    chain.write_text(text.replace("- tools.py:issue_refund\n", f"- {APPROVED}\n"))
    return chain, pool


def told(model: AgentStub) -> str:
    """Everything the model was sent, as one text."""
    return json.dumps(model.requests)


async def test_a_call_waits_for_its_approval_and_runs_once_approved(
    tmp_path: Path, store_url: str, call_log: Path
) -> None:
    script = [
        calls(("lookup_order", {"order_id": "A1"}), refund("A1", 40)),
        answer("Refunded 40 EUR for A1."),
    ]
    for model in stub(script):
        chain, pool = approval_chain(tmp_path, model)
        async with Runtime(store=store_url, pool=str(pool)) as rt:
            parked = await rt.run(chainrt.load(chain), {"question": "refund A1"}, run_id="ap-1")
            assert (parked.status, parked.stopped_at) == ("waiting", "agent"), parked.error
            assert parked.error is not None
            assert "refund_ok" in parked.error
            assert "agent.call[0.1]" in parked.error
            # The call beside it ran and is recorded; the refund waits, not run.
            assert logged(call_log) == ["lookup_order"]
            record = await rt.store.get_run("ap-1")
            assert (record.status, record.owner) == ("waiting", None)
            steps = await rt.store.get_steps("ap-1")
            assert steps["agent.call[0.0]"].status == "completed"
            assert steps["agent.call[0.1]"].status == "waiting"
            # What a person is shown: the signal, the call, its tool and its arguments.
            detail = parked_detail(record, steps)
            assert detail is not None
            assert detail["signal"] == "refund_ok"
            assert detail["step"] == "agent.call[0.1]"
            assert detail["tool"] == "issue_refund"
            assert detail["arguments"] == {"refund": {"order_id": "A1", "amount": 40}}
            wait = await parked_wait(rt.store, record)
            assert wait is not None
            assert wait.signal == "refund_ok"  # the CLI's `chainrt signal RUN refund_ok` hint
            # A payload of another shape is refused (422) and the run keeps waiting.
            with pytest.raises(SignalRefused, match="approve") as bad:
                await rt.signal("ap-1", "refund_ok", {"approve": "yes"})
            assert not bad.value.conflict
            assert (await rt.store.get_run("ap-1")).status == "waiting"
            assert (
                await rt.store.get_signal("ap-1", approval_key("refund_ok", "agent.call[0.1]"))
                is None
            )
            asked = len(model.requests)
            time.sleep(0.2)  # parked time: recorded apart from the budget
            done = await rt.signal("ap-1", "refund_ok", {"approve": True, "reason": "ok"})
            assert done.status == "completed", done.error
            assert done.output["answer"] == "Refunded 40 EUR for A1."
            assert done.output["calls"][1] == {
                "name": "issue_refund",
                "arguments": {"refund": {"order_id": "A1", "amount": 40}},
                "approval": {"signal": "refund_ok", "approve": True, "reason": "ok"},
                "result": {"refunded": 40.0, "order_id": "A1"},
            }
            assert logged(call_log) == ["lookup_order", "issue_refund"]
            assert len(model.requests) - asked == 1  # turn 0 replayed, only turn 1 asked
            record = await rt.store.get_run("ap-1")
            assert record.waits_ms["wait:agent.call[0.1]"] >= 200
            # The approval went to that call; the run no longer waits for anything.
            with pytest.raises(SignalRefused) as late:
                await rt.signal("ap-1", "refund_ok", {"approve": True})
            assert late.value.conflict


async def test_a_refused_call_is_not_run_and_the_next_call_asks_again(
    tmp_path: Path, store_url: str, call_log: Path
) -> None:
    script = [
        calls(refund("A1", 400)),
        calls(refund("A1", 40)),
        answer("Refunded 40 EUR; 400 was refused."),
    ]
    for model in stub(script):
        chain, pool = approval_chain(tmp_path, model)
        async with Runtime(store=store_url, pool=str(pool)) as rt:
            first = await rt.run(chainrt.load(chain), {"question": "refund A1"}, run_id="ap-2")
            assert first.status == "waiting", first.error
            # An approval is addressed to a waiting call: none waits before the run parks.
            refused = await rt.signal(
                "ap-2", "refund_ok", {"approve": False, "reason": "over the limit"}
            )
            # The refusal went back to the model, which proposed a smaller refund: that call
            # waits for its own approval (the first one's does not carry over).
            assert refused.status == "waiting", refused.error
            assert refused.error is not None
            assert "agent.call[1.0]" in refused.error
            assert logged(call_log) == []
            assert "over the limit" in told(model)
            steps = await rt.store.get_steps("ap-2")
            assert steps["agent.call[0.0]"].status == "failed"
            assert steps["agent.call[1.0]"].status == "waiting"
            # A resume without the signal never asks the first call again: it parks at the
            # second one, and the first is neither run nor rewritten.
            asked = len(model.requests)
            again = await rt.resume("ap-2")
            assert again.status == "waiting"
            assert "agent.call[1.0]" in (again.error or "")
            assert (await rt.store.get_steps("ap-2"))["agent.call[0.0]"] == steps["agent.call[0.0]"]
            assert len(model.requests) == asked
            done = await rt.signal("ap-2", "refund_ok", {"approve": True})
            assert done.status == "completed", done.error
            assert [c.get("approval", {}).get("approve") for c in done.output["calls"]] == [
                False,
                True,
            ]
            assert done.output["calls"][0]["error"] == (
                "the call was refused (approval 'refund_ok'): over the limit"
            )
            assert "result" not in done.output["calls"][0]
            assert logged(call_log) == ["issue_refund"]
            keys = [json.loads(x)["key"] for x in call_log.read_text().splitlines()]
            assert keys == ["ap-2:agent.call[1.0]"]


async def test_two_calls_proposed_together_each_wait_for_their_own_approval(
    tmp_path: Path, store_url: str, call_log: Path
) -> None:
    script = [calls(refund("A1", 40), refund("B2", 50)), answer("Refunded A1 only.")]
    for model in stub(script):
        chain, pool = approval_chain(tmp_path, model)
        async with Runtime(store=store_url, pool=str(pool)) as rt:
            parked = await rt.run(chainrt.load(chain), {"question": "refunds"}, run_id="ap-4")
            assert parked.status == "waiting", parked.error
            steps = await rt.store.get_steps("ap-4")
            assert steps["agent.call[0.0]"].status == steps["agent.call[0.1]"].status == "waiting"
            # The first in turn order takes the signal; the run then parks at the second.
            second = await rt.signal("ap-4", "refund_ok", {"approve": True})
            assert second.status == "waiting"
            assert "agent.call[0.1]" in (second.error or "")
            assert logged(call_log) == ["issue_refund"]
            done = await rt.signal("ap-4", "refund_ok", {"approve": False})
            assert done.status == "completed", done.error
            assert done.output["calls"][0]["result"] == {"refunded": 40.0, "order_id": "A1"}
            assert done.output["calls"][1]["error"] == "the call was refused (approval 'refund_ok')"
            keys = [json.loads(x)["key"] for x in call_log.read_text().splitlines()]
            assert keys == ["ap-4:agent.call[0.0]"]
            assert len(model.requests) == 2  # turn 0 once, then the answer


def _resume_until_killed(pool: Path, store_url: str, marker: Path, log: Path, root: Path) -> None:
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
        [sys.executable, "-m", "chainrt", "resume", "ap-3", "--chains", str(root), "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert owner.poll() is None, owner.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.02)
        os.kill(owner.pid, signal.SIGKILL)  # inside the approved issue_refund
    finally:
        owner.wait(timeout=30)
        owner.communicate()


@pytest.mark.slow
async def test_an_approved_call_killed_mid_run_runs_at_most_once_more_without_asking_again(
    tmp_path: Path, store_url: str, call_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = [calls(refund("A1", 40)), answer("Refunded 40 EUR for A1.")]
    marker = tmp_path / "in_refund"
    for model in stub(script):
        chain, pool = approval_chain(tmp_path, model)
        async with Runtime(store=store_url, pool=str(pool)) as rt:
            parked = await rt.run(chainrt.load(chain), {"question": "refund A1"}, run_id="ap-3")
            assert parked.status == "waiting", parked.error
            sent = await rt.signal("ap-3", "refund_ok", {"approve": True}, resume=False)
            assert sent.status == "waiting"  # kept; another process continues it
        _resume_until_killed(pool, store_url, marker, call_log, tmp_path)
        assert logged(call_log) == ["issue_refund"]
        monkeypatch.setenv("CHAINRT_TEST_KILL_AT", str(marker))  # exists: no second kill
        add_chain_root(tmp_path)
        result = await chainrt.aresume("ap-3", store=store_url, pool=str(pool), wait=False)
        assert result.status == "completed", result.error
        assert result.output["calls"][0]["approval"] == {"signal": "refund_ok", "approve": True}
        entries = [json.loads(x) for x in call_log.read_text().splitlines()]
        assert [e["key"] for e in entries] == ["ap-3:agent.call[0.0]"] * 2  # once more, same key
        assert entries[1]["attempt"] == entries[0]["attempt"] + 1


def test_an_approval_inside_a_parallel_branch_or_a_bad_name_is_refused_with_its_line(
    tmp_path: Path,
) -> None:
    (tmp_path / "tools.py").write_text("def refund(order_id: str) -> str:\n    return order_id\n")
    agent = (
        "{id: one, agent: {model: primary, prompt: '?', "
        "tools: [{tool: tools.py:refund, approval: %s}]}}"
    )
    chain = tmp_path / "fan.yaml"
    chain.write_text(
        "name: fan\nbudget: 20s\nsteps:\n  - id: fan\n    parallel:\n"
        f"      a: [{agent % 'refund_ok'}]\n"
    )
    with pytest.raises(SpecError, match="approval cannot be used by an agent inside a parallel"):
        chainrt.load(chain)
    chain.write_text(f"name: solo\nbudget: 20s\nsteps:\n  - {agent % 'no way'}\n")
    with pytest.raises(SpecError, match="approval must be a signal name") as bad:
        chainrt.load(chain)
    assert f"{chain}:4:" in str(bad.value)


def _until(server: ServeProcess, run_id: str, status: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        run: dict[str, Any] = server.get(f"/v1/runs/{run_id}").json()
        if run.get("status") == status:
            return run
        assert time.monotonic() < deadline, (run, server.log())
        time.sleep(0.05)


@pytest.mark.slow
def test_an_approval_over_http_continues_the_call_on_another_runner(
    tmp_path: Path, redis_url: str, call_log: Path
) -> None:
    script = [calls(refund("A1", 40)), calls(refund("A1", 30)), answer("Refunded 30 EUR.")]
    for model in stub(script):
        _, pool = approval_chain(tmp_path, model)
        env = {"CHAINRT_POOL": str(pool), "CHAINRT_TEST_LOG": str(call_log)}
        body = {"chain": "agent-orders", "input": {"question": "refund A1"}, "run_id": "ap-h"}
        with ServeProcess(store=redis_url, chains=tmp_path, env=env) as first:
            assert first.post("/v1/runs", json=body).status_code == 202
            _until(first, "ap-h", "waiting")
            waiting = first.get("/v1/runs/ap-h/record").json()["waiting_for"]
            assert (waiting["signal"], waiting["step"], waiting["tool"]) == (
                "refund_ok",
                "agent.call[0.0]",
                "issue_refund",
            )
            assert waiting["arguments"] == {"refund": {"order_id": "A1", "amount": 40}}
            first.kill()  # kill -9: a parked run is records only
        with ServeProcess(store=redis_url, chains=tmp_path, env=env) as second:
            bad = second.post("/v1/runs/ap-h/signal", json={"name": "refund_ok", "payload": {}})
            assert bad.status_code == 422
            no = {"name": "refund_ok", "payload": {"approve": False, "reason": "too much"}}
            refused = second.post("/v1/runs/ap-h/signal", json=no)
            assert refused.status_code == 202
            assert refused.json()["queued"] is True
            # The model is told, proposes a smaller refund: that call waits for its own approval.
            deadline = time.monotonic() + 60
            while True:
                record = second.get("/v1/runs/ap-h/record").json()
                if (record.get("waiting_for") or {}).get("step") == "agent.call[1.0]":
                    break
                assert time.monotonic() < deadline, (record, second.log())
                time.sleep(0.05)
            yes = {"name": "refund_ok", "payload": {"approve": True}}
            ok = second.post("/v1/runs/ap-h/signal", json=yes)
            assert (ok.status_code, ok.json()["queued"]) == (202, True)
            done = _until(second, "ap-h", "completed")
            assert done["output"]["calls"][1]["result"] == {"refunded": 30.0, "order_id": "A1"}
        assert logged(call_log) == ["issue_refund"]
        assert "too much" in told(model)
