"""Cancel then resume with a sync tool in flight (a real ``chainrt serve`` on SQLite): the
cancelled call keeps running in its thread (Python cannot stop one), and the resume waits for it
instead of running the same tool a second time at once."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from chainrt.testing.serve_process import ServeProcess

TOOLS = """
import json, os, time

def slow(seconds: float) -> str:
    with open(os.environ["CHAINRT_TEST_LOG"], "a") as fh:
        fh.write(json.dumps({"at": "start", "t": time.time()}) + "\\n")
    time.sleep(seconds)
    with open(os.environ["CHAINRT_TEST_LOG"], "a") as fh:
        fh.write(json.dumps({"at": "end", "t": time.time()}) + "\\n")
    return "done"
"""

CHAIN = """name: slow
budget: 2m
inputs:
  seconds: float
steps:
  - {id: s, tool: "slowtools.py:slow", args: {seconds: "{{ input.seconds }}"}}
"""


def test_a_resume_after_a_cancel_waits_for_the_abandoned_sync_tool(tmp_path: Path) -> None:
    chains = tmp_path / "chains"
    chains.mkdir()
    (chains / "slowtools.py").write_text(TOOLS)
    (chains / "slow.yaml").write_text(CHAIN)
    calls = tmp_path / "calls.jsonl"
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    with ServeProcess(store=store, chains=chains, env={"CHAINRT_TEST_LOG": str(calls)}) as r:
        body = {"chain": "slow", "input": {"seconds": 2.0}, "run_id": "twice"}
        assert r.post("/v1/runs", json=body).status_code == 202
        deadline = time.monotonic() + 60
        while not calls.exists() or "start" not in calls.read_text():
            assert time.monotonic() < deadline, r.log()
            time.sleep(0.02)
        assert r.post("/v1/runs/twice/cancel", json={}).json()["status"] == "cancelled"
        assert r.post("/v1/runs/twice/resume", json={}).status_code == 202
        deadline = time.monotonic() + 60
        while (final := r.get("/v1/runs/twice").json())["status"] != "completed":
            assert time.monotonic() < deadline, final  # still cancelled: the resume is queued
            time.sleep(0.1)
    log = [json.loads(line) for line in calls.read_text().splitlines()]
    assert [e["at"] for e in log] == ["start", "end", "start", "end"]  # never two at once
    assert log[2]["t"] >= log[1]["t"]


GATED_TOOLS = """
import asyncio, json, os, time
from pathlib import Path

def _log(at: str, name: str) -> None:
    with open(os.environ["CHAINRT_TEST_LOG"], "a") as fh:
        fh.write(json.dumps({"at": at, "tool": name, "pid": os.getpid(), "t": time.time()}) + "\\n")

def gated(gate: str) -> int:
    # A sync tool that runs until the file ``gate`` exists (a cancel cannot stop it).
    _log("start", "gated")
    deadline = time.monotonic() + 120
    while not Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    _log("end", "gated")
    return os.getpid()

async def hold(gate: str) -> int:
    # An async tool that keeps its runner's one slot until the file ``gate`` exists.
    _log("start", "hold")
    while not Path(gate).exists():
        await asyncio.sleep(0.05)
    return os.getpid()
"""

GATED = """name: gated
budget: 5m
inputs:
  gate: str
steps:
  - {id: s, tool: "gatetools.py:gated", args: {gate: "{{ input.gate }}"}}
"""

HOLD = """name: hold
budget: 5m
inputs:
  gate: str
steps:
  - {id: h, tool: "gatetools.py:hold", args: {gate: "{{ input.gate }}"}}
"""


def _entries(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def _until(check: object, what: str, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


async def _cancel_in_store_only(redis_url: str, run_id: str) -> None:
    """Cancel as a process that tells nobody would: the run fenced in the store, no notice."""
    from chainrt.runs._cancel import cancel_in_store
    from chainrt.store import open_store

    store = open_store(redis_url)
    try:
        await cancel_in_store(store, run_id, host="elsewhere", ttl_s=10.0)
    finally:
        await store.close()


@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.parametrize("told", [True, False], ids=["cancel-through-b", "cancel-not-told"])
def test_a_resume_on_another_runner_waits_for_the_cancelled_owners_sync_tool(
    tmp_path: Path, redis_url: str, told: bool
) -> None:
    """Cancel a run while its sync tool runs on runner A, then resume it through runner B with
    A busy: B runs it, but only once A's abandoned call has ended; A, fenced out, writes nothing
    over B's run. The cancel goes through B (A is told by pub/sub), or straight to the store
    with no notice (A finds out at its next lease renewal: FencedOut)."""
    chains = tmp_path / "chains"
    chains.mkdir()
    (chains / "gatetools.py").write_text(GATED_TOOLS)
    (chains / "gated.yaml").write_text(GATED)
    (chains / "hold.yaml").write_text(HOLD)
    calls = tmp_path / "calls.jsonl"
    env = {"CHAINRT_TEST_LOG": str(calls)}
    gates = {name: tmp_path / name for name in ("run", "hold1", "hold2")}
    runners = [
        ServeProcess(store=redis_url, chains=chains, env=env, max_runs=1).start() for _ in range(2)
    ]
    try:
        by_pid = {r.pid: r for r in runners}
        first = {"chain": "gated", "input": {"gate": str(gates["run"])}, "run_id": "across"}
        assert runners[0].post("/v1/runs", json=first).status_code == 202
        _until(lambda: _entries(calls), "the gated tool never started")
        a = by_pid[int(_entries(calls)[0]["pid"])]  # type: ignore[call-overload]
        b = runners[1] if a is runners[0] else runners[0]
        # B busy (its one slot), then the cancel through B: A's slot frees, its thread runs on.
        hold1 = {"chain": "hold", "input": {"gate": str(gates["hold1"])}, "run_id": "hold1"}
        assert b.post("/v1/runs", json=hold1).status_code == 202
        _until(lambda: [e for e in _entries(calls) if e["pid"] == b.pid], "B never took hold1")
        if told:
            assert b.post("/v1/runs/across/cancel", json={}).json()["status"] == "cancelled"
        else:
            asyncio.run(_cancel_in_store_only(redis_url, "across"))
            _until(lambda: "still running here" in a.log(), a.log())  # its renewal: fenced
        # A busy now, then B free again: the resume can only go to B.
        hold2 = {"chain": "hold", "input": {"gate": str(gates["hold2"])}}
        assert b.post("/v1/runs", json=hold2).status_code == 202
        _until(
            lambda: [e for e in _entries(calls) if e["pid"] == a.pid and e["tool"] == "hold"],
            "A never took hold2",
        )
        gates["hold1"].touch()
        _until(lambda: b.get("/v1/runs/hold1").json()["status"] == "completed", "hold1")
        assert b.post("/v1/runs/across/resume", json={}).status_code == 202

        # B holds the resume while A's call runs: no second start of the tool.
        def gated_calls() -> list[str]:
            return [str(e["at"]) for e in _entries(calls) if e["tool"] == "gated"]

        _until(
            lambda: "waiting for its cancelled execution" in b.log() or len(gated_calls()) > 1,
            b.log(),
        )
        assert gated_calls() == ["start"]  # not a second start beside A's call
        gates["run"].touch()  # A's abandoned call ends; then B's call runs (and ends at once)
        _until(lambda: b.get("/v1/runs/across").json()["status"] == "completed", b.log())
        gates["hold2"].touch()
        _until(lambda: len([e for e in _entries(calls) if e["tool"] == "hold"]) == 2, "holds")
        time.sleep(1.0)  # A's thread has returned and its lease renewal would have run
        final = b.get("/v1/runs/across").json()
    finally:
        for gate in gates.values():
            gate.touch()
        for r in runners:
            r.stop()
    gated = [e for e in _entries(calls) if e["tool"] == "gated"]
    assert [(e["at"], e["pid"]) for e in gated] == [
        ("start", a.pid),
        ("end", a.pid),
        ("start", b.pid),
        ("end", b.pid),
    ]
    assert gated[2]["t"] >= gated[1]["t"]  # type: ignore[operator]
    assert (final["status"], final["output"]) == ("completed", b.pid)  # B's, not A's
