"""A whole-run cancel while a group is in flight: the steps running inside it are recorded
``cancelled`` as a straight chain's step in flight is (issue 37), shown so by ``inspect`` and
in the result's tree; the steps that had not started stay unrecorded (``not run``)."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest

import chainrt
from chainrt import Runtime
from chainrt._records import RunRecord, StepRecord
from chainrt.cli._printer import print_inspect
from chainrt.runs._cancel import CANCEL_REASON, cancelled_inner

_TOOLS = """
import asyncio, json, os, time


def _log(name):
    with open(os.environ["CHAINRT_TEST_LOG"], "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"tool": name, "t": time.time()}) + "\\n")


async def quick(name):
    _log(name)
    return name


async def sleepy(name):
    _log(name)
    await asyncio.sleep(30)
    return name


async def sleepy_ctx(name, ctx):
    _log(name)
    await asyncio.sleep(30)
    return ctx.attempt
"""

_PARALLEL = """
name: cancel-parallel
budget: 60s
steps:
  - {id: first, tool: tools.py:quick, args: {name: first}}
  - id: gather
    parallel:
      a:
        - {id: a1, tool: tools.py:sleepy, args: {name: a1}}
        - {id: a2, tool: tools.py:quick, args: {name: a2}}
      b:
        - {id: b1, tool: tools.py:quick, args: {name: b1}}
        - {id: b2, tool: tools.py:sleepy_ctx, args: {name: b2}}
      c:
        - {id: c1, tool: tools.py:quick, args: {name: c1}}
  - {id: after, tool: tools.py:quick, args: {name: after}}
"""

_MAP = """
name: cancel-map
budget: 60s
inputs: {items: list}
steps:
  - id: each
    map: "{{ input.items }}"
    max_concurrency: 2
    steps:
      - {id: work, tool: tools.py:sleepy, args: {name: "w{{ index }}"}}
  - {id: after, tool: tools.py:quick, args: {name: after}}
"""


@pytest.fixture
def call_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "calls.jsonl"
    monkeypatch.setenv("CHAINRT_TEST_LOG", str(path))
    return path


async def _logged(log: Path, *names: str) -> None:
    """Wait until every tool of ``names`` has been called (each logs on its call)."""
    for _ in range(3000):
        if log.exists():
            seen = {json.loads(line)["tool"] for line in log.read_text().splitlines() if line}
            if set(names) <= seen:
                return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{names} were not all called")


async def _cancel_in_flight(
    tmp_path: Path, store_url: str, log: Path, chain_text: str, inputs: dict[str, Any],
    names: tuple[str, ...], *, from_other: bool,
) -> tuple[chainrt.RunResult, RunRecord, dict[str, StepRecord]]:  # fmt: skip
    (tmp_path / "tools.py").write_text(_TOOLS)
    (tmp_path / "chain.yaml").write_text(chain_text)
    chain = chainrt.load(tmp_path / "chain.yaml")
    async with Runtime(store=store_url) as owner, Runtime(store=store_url) as other:
        run = asyncio.ensure_future(owner.run(chain, inputs, run_id="cut"))
        await _logged(log, *names)
        await (other if from_other else owner).cancel("cut")
        result = await asyncio.wait_for(run, timeout=10)
        record, steps = await owner.store.get_run("cut"), await owner.store.get_steps("cut")
    return result, record, steps


@pytest.mark.parametrize("from_other", [False, True], ids=["same-runtime", "other-runtime"])
async def test_a_cancel_records_the_steps_running_in_each_branch_cancelled(
    tmp_path: Path, store_url: str, call_log: Path, from_other: bool
) -> None:
    result, record, steps = await _cancel_in_flight(
        tmp_path, store_url, call_log, _PARALLEL, {}, ("a1", "b2", "c1"), from_other=from_other
    )
    assert result.status == record.status == "cancelled"
    assert record.stopped_at == "gather"
    assert steps["gather"].status == "cancelled"
    statuses = {path: rec.status for path, rec in steps.items() if path.startswith("gather.")}
    # a1 and b2 were running: cancelled; a2 had not started; b1 and c1 had completed.
    assert statuses == {
        "gather.a.a1": "cancelled",
        "gather.b.b1": "completed",
        "gather.b.b2": "cancelled",
        "gather.c.c1": "completed",
    }
    assert steps["gather.a.a1"].error == CANCEL_REASON
    assert steps["gather.b.b2"].attempts == 1  # the ctx tool's attempt is kept: a resume counts on
    assert "after" not in steps
    tree = {s.path: s.status for s in {s.id: s for s in result.steps}["gather"].steps or []}
    assert tree == statuses
    out = io.StringIO()
    print_inspect(record, steps, None, out)
    lines = {ln.split()[1]: ln for ln in out.getvalue().splitlines() if "gather." in ln}
    assert "cancelled" in lines["gather.a.a1"]
    assert "not run" in lines["gather.a.a2"]
    assert "completed" in lines["gather.c.c1"]


async def test_a_cancel_records_the_running_wave_of_a_map_cancelled(
    tmp_path: Path, store_url: str, call_log: Path
) -> None:
    result, _, steps = await _cancel_in_flight(
        tmp_path, store_url, call_log, _MAP, {"items": [1, 2, 3, 4, 5]}, ("w0", "w1"),
        from_other=True,
    )  # fmt: skip
    assert result.status == "cancelled"
    inner = {path: rec.status for path, rec in steps.items() if path.startswith("each[")}
    # Two at a time: the first wave was running; the items of later waves never started.
    assert inner == {"each[0].work": "cancelled", "each[1].work": "cancelled"}


def _records(**statuses: tuple[str, dict[str, Any]]) -> dict[str, StepRecord]:
    return {
        path.replace("_", "."): StepRecord(step_id=path.replace("_", "."), status=s, **fields)
        for path, (s, fields) in statuses.items()
    }


def test_only_the_first_open_step_of_each_running_list_is_found() -> None:
    group = {
        "id": "g",
        "parallel": {
            "a": [{"id": "a1"}, {"id": "a2"}],
            "b": [{"id": "b1"}, {"id": "b2"}],
            "c": [{"id": "c1"}, {"id": "c2"}],
            "d": [{"id": "d1"}],
        },
    }
    run = RunRecord(
        run_id="r", chain="c", spec={"name": "c", "steps": [group]}, input={}, budget_total_ms=1e3
    )
    steps = _records(
        g_a_a1=("completed", {}),  # a: a2 was running
        g_b_b1=("failed", {}),  # b had stopped: nothing of it runs
        g_c_c1=("running", {"started_at": 5.0, "attempts": 2}),  # c: c1's attempt in flight
        g_d_d1=("completed", {}),  # d had ended
    )
    found = {r.step_id: r for r in cancelled_inner(run, steps, "g", 10.0)}
    assert sorted(found) == ["g.a.a2", "g.c.c1"]
    assert found["g.c.c1"].started_at == 5.0
    assert found["g.c.c1"].attempts == 2
    assert all(r.status == "cancelled" for r in found.values())
    assert cancelled_inner(run, steps, "other", 10.0) == []
