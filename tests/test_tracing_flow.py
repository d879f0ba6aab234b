"""Spans of a chain with groups (the SDK's in-memory exporter, the real runner and store): a
``chain.branch`` per switch or parallel branch and a ``chain.item`` per map item, each under its
group's ``chain.step`` and over its inner steps' spans, named by path."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode

from chainrt._runtime import open_runtime
from chainrt.spec import load_spec
from chainrt.tracing import _attributes as attr
from chainrt.tracing import in_memory_hooks

FLOW = Path(__file__).parent / "data" / "chains" / "flow"


def children(spans: Sequence[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    assert parent.context is not None
    found = [
        s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id
    ]
    return sorted(found, key=lambda s: s.start_time or 0)


def step_span(spans: Sequence[ReadableSpan], step_id: str) -> ReadableSpan:
    [span] = [
        s
        for s in spans
        if s.name == attr.SPAN_STEP and (s.attributes or {}).get(attr.STEP_ID) == step_id
    ]
    return span


def inner_steps(spans: Sequence[ReadableSpan], parent: ReadableSpan) -> list[Any]:
    return [
        (s.attributes or {}).get(attr.STEP_ID)
        for s in children(spans, parent)
        if s.name == attr.SPAN_STEP
    ]


async def run_traced(tmp_path: Path, name: str, inputs: dict[str, Any]) -> Any:
    hooks = in_memory_hooks()
    loaded = load_spec(FLOW / name)
    async with open_runtime(store=f"sqlite:///{tmp_path / 'runs.db'}", hooks=hooks) as runtime:
        result = await runtime.runner.run(loaded.spec, inputs, source_dir=loaded.source_dir)
    return result, hooks.exporter.get_finished_spans()  # type: ignore[union-attr]


async def test_each_branch_and_map_item_has_its_span_under_the_group(
    tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setenv("CHAINRT_TEST_LOG", str(tmp_path / "calls.jsonl"))
    inputs = {"question": "refund A12 please", "items": ["x", "y", "z"]}
    result, spans = await run_traced(tmp_path, "forms.yaml", inputs)
    assert result.status == "completed", result.error

    # parallel: one chain.branch per branch, its inner steps' chain.step spans inside it.
    gather = step_span(spans, "gather")
    branches = {
        (s.attributes or {}).get(attr.BRANCH): s
        for s in children(spans, gather)
        if s.name == attr.SPAN_BRANCH
    }
    assert set(branches) == {"orders", "kb"}
    kb = branches["kb"]
    assert (kb.attributes or {}).get(attr.PATH) == "gather.kb"
    assert (kb.attributes or {}).get(attr.GROUP) == "gather"
    assert (kb.attributes or {}).get(attr.STATUS) == "completed"
    assert (kb.attributes or {}).get(attr.RUN_ID) == result.run_id
    assert inner_steps(spans, kb) == ["gather.kb.search", "gather.kb.rerank"]
    assert inner_steps(spans, branches["orders"]) == ["gather.orders.orders"]
    # The two branches ran at once: each started before the other ended.
    orders = branches["orders"]
    assert (kb.start_time or 0) < (orders.end_time or 0)
    assert (orders.start_time or 0) < (kb.end_time or 0)

    # switch: the taken branch only.
    route = step_span(spans, "route")
    [taken] = [s for s in children(spans, route) if s.name == attr.SPAN_BRANCH]
    assert (taken.attributes or {}).get(attr.BRANCH) == "refund"
    assert inner_steps(spans, taken) == ["route.refund.policy", "route.refund.refund_answer"]

    # map: one chain.item per item, with its index and path.
    per_item = step_span(spans, "per_item")
    items = [s for s in children(spans, per_item) if s.name == attr.SPAN_ITEM]
    got = sorted(
        ((s.attributes or {}).get(attr.ITEM_INDEX), (s.attributes or {}).get(attr.PATH))
        for s in items
    )
    assert got == [(0, "per_item[0]"), (1, "per_item[1]"), (2, "per_item[2]")]
    for item in items:
        index = (item.attributes or {}).get(attr.ITEM_INDEX)
        assert inner_steps(spans, item) == [f"per_item[{index}].classify"]
    # No branch span outside a group.
    assert not [s for s in spans if s.name == attr.SPAN_BRANCH and s.parent is None]


async def test_a_branch_cancelled_by_join_any_ends_its_span_cancelled(
    tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setenv("CHAINRT_TEST_LOG", str(tmp_path / "calls.jsonl"))
    result, spans = await run_traced(tmp_path, "any.yaml", {})
    assert result.status == "completed", result.error
    race = step_span(spans, "race")
    branches = {
        (s.attributes or {}).get(attr.BRANCH): s
        for s in children(spans, race)
        if s.name == attr.SPAN_BRANCH
    }
    assert (branches["quick"].attributes or {}).get(attr.STATUS) == "completed"
    assert branches["quick"].status.status_code != StatusCode.ERROR
    assert (branches["slow"].attributes or {}).get(attr.STATUS) == "cancelled"
    # The slow branch's span ended with the group, not after its 3 s tool.
    assert (branches["slow"].end_time or 0) <= (race.end_time or 0)
