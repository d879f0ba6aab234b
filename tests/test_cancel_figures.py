"""A cancelled run reports the budget it used up to the cancel and its step in flight as
``cancelled`` (issue 41), whether the cancel came from the owner's runtime or another one."""

from __future__ import annotations

import asyncio
import io
import json
import time
from pathlib import Path

import pytest

import chainrt
from chainrt import Runtime
from chainrt._records import OwnerLease, RunRecord, StepRecord
from chainrt.cli._printer import print_inspect
from chainrt.runs._cancel import CANCEL_REASON, cancelled_progress
from chainrt.testing.serve_process import ServeProcess

CHAINS = Path(__file__).parent / "data" / "chains"
SERVE_CHAINS = Path(__file__).parent / "data" / "serve"

_CTX_CHAIN = """
name: cancellable-ctx
budget: 60s
steps:
  - id: first
    tool: tools.py:quick
  - id: sleeper
    tool: tools.py:sleepy_ctx
  - id: after
    tool: tools.py:quick
"""

_CTX_TOOLS = """
import asyncio, json, os, time


def _log(name):
    with open(os.environ["CHAINRT_TEST_LOG"], "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"tool": name, "t": time.time()}) + "\\n")


def quick():
    _log("quick")
    return 1


async def sleepy_ctx(ctx):
    _log("sleepy_ctx")
    await asyncio.sleep(30)
    return ctx.attempt
"""

# ---------------------------------------------------------------- the pure part, table tests

_SPEC = {"name": "c", "steps": [{"id": "a"}, {"id": "b"}, {"id": "c"}]}


def _run(status: str, *, used: float = 100.0, at: float = 1000.0, lease: float = 1e12) -> RunRecord:
    owner = OwnerLease(host="h", pid=1, token=1, expires_at=lease)
    return RunRecord(
        run_id="r",
        chain="c",
        spec=_SPEC,
        input={},
        status=status,
        budget_total_ms=60_000,
        budget_used_ms=used,
        fencing_token=1,
        owner=None if status == "queued" else owner,
        updated_at=at,
    )


def _step(step_id: str, status: str, **more: object) -> StepRecord:
    return StepRecord.model_validate({"step_id": step_id, "status": status, **more})


@pytest.mark.parametrize(
    ("before", "steps", "used_ms", "stopped_at", "step_started"),
    [
        # running, "a" done: "b" in flight since the last write 1.5 s before the cancel
        (_run("running"), {"a": _step("a", "completed")}, 1600.0, "b", 1000.0),
        # nothing written yet: the first step is in flight since the claim
        (_run("running"), {}, 1600.0, "a", 1000.0),
        # "a" skipped (optional), "b" failed in an earlier execution and runs again
        (
            _run("running"),
            {"a": _step("a", "skipped"), "b": _step("b", "failed")},
            1600.0,
            "b",
            1000.0,
        ),
        # a ctx tool's running record: the step started when its attempt was written
        (
            _run("running"),
            {
                "a": _step("a", "completed"),
                "b": _step("b", "running", attempts=2, started_at=1001.0),
            },
            1600.0,
            "b",
            1001.0,
        ),
        # every step written: the run was finishing, no step in flight
        (_run("running"), {s: _step(s, "completed") for s in "abc"}, 1600.0, None, None),
        # queued: never started, nothing used, nothing in flight
        (_run("queued", used=0.0), {}, 0.0, None, None),
        # the owner's lease ran out (it crashed): no time since, nothing in flight
        (_run("running", lease=1001.0), {"a": _step("a", "completed")}, 100.0, None, None),
    ],
)
def test_cancelled_progress(
    before: RunRecord,
    steps: dict[str, StepRecord],
    used_ms: float,
    stopped_at: str | None,
    step_started: float | None,
) -> None:
    progress, step = cancelled_progress(before, steps, now=1001.5)
    assert progress.status == "cancelled"
    assert progress.error == CANCEL_REASON
    assert progress.release_owner
    assert progress.budget_used_ms == pytest.approx(used_ms)
    assert progress.stopped_at == stopped_at
    if step_started is None:
        assert step is None
        return
    assert step is not None
    assert (step.step_id, step.status, step.error) == (stopped_at, "cancelled", CANCEL_REASON)
    assert step.started_at == step_started
    assert step.finished_at == 1001.5
    assert step.elapsed_ms == pytest.approx((1001.5 - step_started) * 1000)


def test_cancelled_progress_keeps_a_running_records_attempts() -> None:
    running = _step("b", "running", attempts=3, started_at=1001.0)
    _, step = cancelled_progress(
        _run("running"), {"b": running, "a": _step("a", "completed")}, 1002
    )
    assert step is not None
    assert step.attempts == 3  # a resume's ctx.attempt counts on from it


def test_a_clock_behind_the_owners_never_gives_negative_time() -> None:
    progress, step = cancelled_progress(_run("running"), {}, now=999.0)
    assert progress.budget_used_ms == 100.0
    assert step is not None
    assert step.elapsed_ms == 0.0


# ---------------------------------------------------------------- through the real runner


@pytest.fixture
def call_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "calls.jsonl"
    monkeypatch.setenv("CHAINRT_TEST_LOG", str(path))
    return path


async def _called_at(log: Path, tool: str) -> float:
    """When ``tool`` was called (unix seconds), waiting for the call."""
    while True:
        if log.exists():
            for line in log.read_text().splitlines():
                entry = json.loads(line)
                if entry["tool"] == tool:
                    return float(entry["t"])
        await asyncio.sleep(0.01)


async def _cancel_after_200ms(
    chain: chainrt.Chain, tool: str, store_url: str, log: Path, *, from_other: bool
) -> None:
    async with Runtime(store=store_url) as owner, Runtime(store=store_url) as other:
        begun = time.time()
        run = asyncio.ensure_future(owner.run(chain, {"seconds": 30.0}, run_id="cut"))
        tool_at = await _called_at(log, tool)
        await asyncio.sleep(0.2)
        cancel_at = time.time()
        cancelled = await (other if from_other else owner).cancel("cut")
        ended = time.time()
        result = await asyncio.wait_for(run, timeout=10)
        record = await owner.store.get_run("cut")
        steps = await owner.store.get_steps("cut")
    # Lower bounds measured in this run: the budget's clock and the step were going before the
    # tool was called (the tool's own log line), and the cancel began after ~200 ms of it. No
    # margin for load is needed (load only makes the run longer); 20 ms covers clock reads.
    ran_ms = (cancel_at - tool_at) * 1000
    for seen in (cancelled, result):
        assert seen.status == "cancelled"
        assert seen.budget.used_ms >= ran_ms - 20
        assert seen.budget.used_ms <= (ended - begun) * 1000 + 20  # no more than had passed
        assert seen.stopped_at == "sleeper"
        step = {s.id: s for s in seen.steps}["sleeper"]
        assert step.status == "cancelled"
        assert step.elapsed_ms >= ran_ms - 20
    assert record.budget_used_ms >= ran_ms - 20
    assert steps["sleeper"].status == "cancelled"
    assert steps["first"].status == "completed"
    assert "after" not in steps


@pytest.mark.parametrize("from_other", [False, True], ids=["same-runtime", "other-runtime"])
async def test_a_cancelled_run_shows_the_time_it_used_and_its_step_cancelled(
    store_url: str, call_log: Path, from_other: bool
) -> None:
    chain = chainrt.load(CHAINS / "cancellable.yaml")
    await _cancel_after_200ms(chain, "async_sleepy", store_url, call_log, from_other=from_other)


async def test_a_ctx_tools_running_record_becomes_cancelled(
    store_url: str, call_log: Path, tmp_path: Path
) -> None:
    (tmp_path / "tools.py").write_text(_CTX_TOOLS)
    (tmp_path / "chain.yaml").write_text(_CTX_CHAIN)
    chain = chainrt.load(tmp_path / "chain.yaml")
    await _cancel_after_200ms(chain, "sleepy_ctx", store_url, call_log, from_other=True)


async def test_inspect_prints_the_cancelled_step(store_url: str, call_log: Path) -> None:
    chain = chainrt.load(CHAINS / "cancellable.yaml")
    async with Runtime(store=store_url) as rt:
        run = asyncio.ensure_future(rt.run(chain, {"seconds": 30.0}, run_id="shown"))
        await _called_at(call_log, "async_sleepy")
        await rt.cancel("shown")
        await run
        record, steps = await rt.store.get_run("shown"), await rt.store.get_steps("shown")
    out = io.StringIO()
    print_inspect(record, steps, None, out)
    step_lines = [ln for ln in out.getvalue().splitlines() if ln[:3].strip() and ln[:2] == "  "]
    lines = {line.split()[1]: line for line in step_lines}
    assert "cancelled" in lines["sleeper"]
    assert "not run" not in lines["sleeper"]
    assert "not run" in lines["after"]


# ---------------------------------------------------------------- what the dashboard reads


def test_the_dashboards_record_of_a_run_cancelled_over_http(store_url: str, tmp_path: Path) -> None:
    """``chainrt serve``'s ``/v1/runs/{id}/record`` (what ``/ui/runs/{id}`` draws) of a run
    cancelled by ``POST /v1/runs/{id}/cancel`` in its step, on a real server."""
    log = tmp_path / "calls.jsonl"
    with ServeProcess(
        store=store_url, chains=SERVE_CHAINS, env={"CHAINRT_TEST_LOG": str(log)}
    ) as r:
        body = {"chain": "nap", "input": {"seconds": 30.0, "label": "x"}, "run_id": "ui-cut"}
        assert r.post("/v1/runs", json=body).status_code == 202
        deadline = time.monotonic() + 60
        while not log.exists() or not log.read_text().strip():
            assert time.monotonic() < deadline, "the nap step never started"
            time.sleep(0.02)
        tool_at = float(json.loads(log.read_text().splitlines()[0])["t"])
        time.sleep(0.2)
        cancel_at = time.time()
        assert r.post("/v1/runs/ui-cut/cancel").json()["status"] == "cancelled"
        detail = r.get("/v1/runs/ui-cut/record").json()
    ran_ms = (cancel_at - tool_at) * 1000  # a lower bound measured here (see above)
    assert detail["status"] == "cancelled"
    assert detail["stopped_at"] == "nap"
    assert detail["budget"]["used_ms"] >= ran_ms - 20
    assert detail["records"]["nap"]["status"] == "cancelled"
    assert detail["records"]["nap"]["elapsed_ms"] >= ran_ms - 20
    assert [s["status"] for s in detail["steps"]] == ["cancelled"]
