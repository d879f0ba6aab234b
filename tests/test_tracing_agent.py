"""Spans of an agent step (the SDK's in-memory exporter, the real runner and store, the scripted
model over HTTP): an ``agent.turn`` per model turn and an ``agent.call`` per tool call under the
step's ``chain.step``, the turn's ``llm.dispatch`` under it; a call parked for its approval is
not an error; a resume opens spans only for what it runs (replayed turns and calls have none)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode
from test_agent_runner import chain_files, stub
from test_tracing_flow import children, step_span

import chainrt
from chainrt._runtime import open_runtime
from chainrt.testing.scripted_model import answer, calls
from chainrt.tracing import _attributes as attr
from chainrt.tracing import in_memory_hooks


def parts(spans: Sequence[ReadableSpan], parent: ReadableSpan) -> list[tuple[str, Any, Any]]:
    """The agent spans under ``parent``: (name, path, status), by path."""
    found = [
        (s.name, (s.attributes or {}).get(attr.PATH), (s.attributes or {}).get(attr.STATUS))
        for s in children(spans, parent)
        if s.name in (attr.SPAN_AGENT_TURN, attr.SPAN_AGENT_CALL)
    ]
    return sorted(found, key=lambda p: str(p[1]))


def named(spans: Sequence[ReadableSpan], path: str) -> ReadableSpan:
    [span] = [s for s in spans if (s.attributes or {}).get(attr.PATH) == path]
    return span


async def test_each_turn_and_call_has_its_span_under_the_agent_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHAINRT_TEST_LOG", str(tmp_path / "calls.jsonl"))
    script = [
        calls(("lookup_order", {"order_id": "A1"}), ("broken", {"reason": "x"})),
        calls(("issue_refund", {"refund": {"order_id": "A1", "amount": 40}})),
        answer("Refunded 40 EUR for A1."),
    ]
    for model in stub(script):
        chain, pool = chain_files(tmp_path, model)
        text = chain.read_text().replace(
            "- tools.py:issue_refund\n", "- {tool: tools.py:issue_refund, approval: refund_ok}\n"
        )
        chain.write_text(text)
        hooks = in_memory_hooks()
        store = f"sqlite:///{tmp_path / 'runs.db'}"
        async with open_runtime(store=store, pool=str(pool), hooks=hooks) as rt:
            parked = await rt.run(chainrt.load(chain), {"question": "refund A1"}, run_id="tr-1")
            assert parked.status == "waiting", parked.error
            first = list(hooks.exporter.get_finished_spans())  # type: ignore[union-attr]
            hooks.exporter.clear()  # type: ignore[union-attr]
            done = await rt.signal("tr-1", "refund_ok", {"approve": True})
            assert done.status == "completed", done.error
            second = list(hooks.exporter.get_finished_spans())  # type: ignore[union-attr]

    agent = step_span(first, "agent")
    assert parts(first, agent) == [
        ("agent.call", "agent.call[0.0]", "completed"),
        ("agent.call", "agent.call[0.1]", "failed"),
        ("agent.call", "agent.call[1.0]", "waiting"),
        ("agent.turn", "agent.turn[0]", "completed"),
        ("agent.turn", "agent.turn[1]", "completed"),
    ]
    turn0 = named(first, "agent.turn[0]")
    assert (turn0.attributes or {}).get(attr.MODEL) == "primary"
    assert (turn0.attributes or {}).get(attr.AGENT_FINAL) is False
    assert (turn0.attributes or {}).get(attr.RUN_ID) == "tr-1"
    assert (turn0.attributes or {}).get(attr.STEP_ID) == "agent"
    # The model's attempt, then the turn's own record written.
    assert [s.name for s in children(first, turn0)] == [attr.SPAN_DISPATCH, attr.SPAN_CHECKPOINT]
    lookup = named(first, "agent.call[0.0]")
    assert (lookup.attributes or {}).get(attr.AGENT_TOOL) == "lookup_order"
    assert lookup.status.status_code != StatusCode.ERROR
    assert named(first, "agent.call[0.1]").status.status_code == StatusCode.ERROR  # it raised
    # Parked for its approval: waiting, not failed.
    assert named(first, "agent.call[1.0]").status.status_code != StatusCode.ERROR
    # The two calls of turn 0 ran at once, each in its own span.
    other = named(first, "agent.call[0.1]")
    assert (lookup.start_time or 0) < (other.end_time or 0)
    assert (other.start_time or 0) < (lookup.end_time or 0)

    # The resume after the approval: spans for the approved call and the answering turn only.
    agent = step_span(second, "agent")
    assert parts(second, agent) == [
        ("agent.call", "agent.call[1.0]", "completed"),
        ("agent.turn", "agent.turn[2]", "completed"),
    ]
