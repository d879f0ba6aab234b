"""Inside branches and items: concurrency keys, retries, cancel, and events named by path."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

import chainrt
from chainrt import Runtime
from chainrt._events import EventProgress, RunEvent

FLOW = Path(__file__).parent / "data" / "chains" / "flow"


@pytest.fixture
def call_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "calls.jsonl"
    monkeypatch.setenv("CHAINRT_TEST_LOG", str(path))
    return path


def entries(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_keys_and_retries_work_inside_branches_and_items(
    store_url: str, call_log: Path
) -> None:
    chain = chainrt.load(FLOW / "inside.yaml")
    tag = uuid.uuid4().hex[:8]
    events: list[RunEvent] = []
    async with Runtime(store=store_url) as runtime:
        progress = EventProgress(events.append)
        result = await runtime.runner.run(
            chain.spec, {"tag": tag}, source_dir=FLOW, progress=progress
        )
    assert result.status == "completed", result.error
    held = {e["tool"]: e for e in entries(call_log) if e["tool"] in ("one", "two")}
    first, second = sorted(held.values(), key=lambda e: e["entered"])
    # One key of limit 1 across two parallel branches: they took turns, not overlapped.
    assert second["entered"] >= first["left"] - 0.001
    fan = {s.path: s for s in result.steps[0].steps or []}
    assert fan["fan.three.three"].attempts == 3  # two failures, then the retry that worked
    each = {s.path: s for s in result.steps[1].steps or []}
    assert [each[f"each[{i}].retried"].attempts for i in (0, 1)] == [2, 2]
    # Events of inner steps carry the path as their step id.
    started = [e.step_id for e in events if e.type == "step_started"]
    assert {"fan.one.one", "fan.two.two", "fan.three.three", "each[1].retried"} <= set(started)
    finished = {e.step_id for e in events if e.type == "step_finished"}
    assert {"fan", "each", "fan.three.three", "each[0].retried"} <= finished


async def test_cancel_stops_a_run_inside_a_parallel_branch(store_url: str, call_log: Path) -> None:
    chain = chainrt.load(FLOW / "long_branch.yaml")
    run_id = f"cancel-{uuid.uuid4().hex[:8]}"
    async with Runtime(store=store_url) as runtime:
        run = asyncio.ensure_future(runtime.run(chain, {}, run_id=run_id))
        while "long" not in [e["tool"] for e in entries(call_log)]:
            await asyncio.sleep(0.01)
        await runtime.cancel(run_id)
        result = await asyncio.wait_for(run, timeout=10)  # not the branch's 30 s
        steps = await runtime.store.get_steps(run_id)
    assert result.status == "cancelled"
    assert steps["fan.quick.quick"].status == "completed"  # recorded before the cancel
    # The step running in the other branch is recorded cancelled, as a straight step is.
    assert steps["fan.long.long"].status == "cancelled"


async def test_spans_of_inner_steps_carry_the_path_under_their_group_s_span(
    tmp_path: Path, call_log: Path
) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from chainrt._runtime import open_runtime
    from chainrt.tracing import in_memory_hooks

    hooks = in_memory_hooks()
    chain = chainrt.load(FLOW / "forms.yaml")
    inputs = {"question": "refund A1", "items": [1, 2]}
    async with open_runtime(store=f"sqlite:///{tmp_path / 'runs.db'}", hooks=hooks) as rt:
        result = await rt.runner.run(chain.spec, inputs, source_dir=FLOW)
    assert result.status == "completed", result.error
    assert isinstance(hooks.exporter, InMemorySpanExporter)
    every = hooks.exporter.get_finished_spans()
    spans = [s for s in every if s.name == "chain.step"]
    by_path = {str(dict(s.attributes or {})["chainrt.step_id"]): s for s in spans}
    by_id = {s.context.span_id: s for s in every if s.context is not None}
    assert dict(by_path["gather"].attributes or {})["chainrt.step_kind"] == "parallel"
    # An inner step's span is under its branch's (or map item's) span, under the group's.
    for path, between, branch, group in [
        ("route.refund.policy", "chain.branch", "route.refund", "route"),
        ("gather.kb.rerank", "chain.branch", "gather.kb", "gather"),
        ("per_item[1].classify", "chain.item", "per_item[1]", "per_item"),
    ]:
        parent = by_path[path].parent
        assert parent is not None
        middle = by_id[parent.span_id]
        assert middle.name == between, path
        assert dict(middle.attributes or {})["chainrt.path"] == branch
        assert middle.parent is not None
        assert middle.parent.span_id == by_path[group].context.span_id, path
