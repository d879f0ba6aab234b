"""`chainrt inspect` draws a run's groups as a tree of their inner steps."""

from __future__ import annotations

import io
from pathlib import Path

import chainrt
from chainrt.cli._printer import print_inspect
from chainrt.store import open_store

FLOW = Path(__file__).parent / "data" / "chains" / "flow"


async def test_inspect_draws_each_group_s_inner_steps(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    chain = chainrt.load(FLOW / "forms.yaml")
    inputs = {"question": "refund A12", "items": ["a", "b"]}
    result = await chain.arun(inputs, run_id="tree-1", store=url)
    assert result.status == "completed", result.error
    store = open_store(url)
    try:
        run, steps = await store.get_run("tree-1"), await store.get_steps("tree-1")
    finally:
        await store.close()
    out = io.StringIO()
    print_inspect(run, steps, None, out)
    lines = [line.strip() for line in out.getvalue().splitlines()]
    assert "branch refund" in lines
    drawn = [line.split()[:3] for line in lines if line.startswith(("├─", "└─"))]
    assert drawn == [
        ["├─", "route.refund.policy", "completed"],
        ["└─", "route.refund.refund_answer", "completed"],
        ["├─", "gather.orders.orders", "completed"],
        ["├─", "gather.kb.search", "completed"],
        ["└─", "gather.kb.rerank", "completed"],
        ["├─", "per_item[0].classify", "completed"],
        ["└─", "per_item[1].classify", "completed"],
    ]
