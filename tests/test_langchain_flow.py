"""A chain with groups behind LangChain's ``astream_events``: inner steps' events carry their
path (``gather.kb.search``, ``per_item[1].classify``) as ``step_id``, as in the run's records."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import chainrt

pytest.importorskip("langchain_core")

FLOW = Path(__file__).parent / "data" / "chains" / "flow"


async def test_astream_events_name_inner_steps_by_their_path(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHAINRT_TEST_LOG", str(tmp_path / "calls.jsonl"))
    runnable = chainrt.load(FLOW / "forms.yaml").as_runnable(store=store_url)
    inputs = {"question": "refund A12 please", "items": ["x", "y"]}
    seen = [
        e
        async for e in runnable.astream_events(inputs, {"run_name": "flow"}, version="v2")
        if e["name"] == "flow" and e["event"] == "on_chain_stream"
    ]
    chunks: list[dict[str, Any]] = [e["data"]["chunk"] for e in seen]
    events = [c for c in chunks if isinstance(c, dict) and "type" in c]
    started = [c["step_id"] for c in events if c["type"] == "step_started"]
    finished = {c["step_id"] for c in events if c["type"] == "step_finished"}
    inner = {
        "route.refund.policy",
        "route.refund.refund_answer",
        "gather.orders.orders",
        "gather.kb.search",
        "gather.kb.rerank",
        "per_item[0].classify",
        "per_item[1].classify",
    }
    assert inner <= set(started)
    assert inner <= finished
    # An inner step starts after its group and ends before it; untaken branches never appear.
    assert started.index("gather") < started.index("gather.kb.search")
    assert "route.status.status_answer" not in started
    assert not [s for s in started if s in ("policy", "search", "classify")]
    run_finished = [c for c in events if c["type"] == "run_finished"]
    assert run_finished
    assert run_finished[-1]["status"] == "completed"
