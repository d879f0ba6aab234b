"""The losers of a ``join: any`` group across a crash (issue 37, bench/chaos.py --chain flow).

A crash between the join and the losers' ``cancelled`` records leaves a loser's ``running``
record (a tool that takes ``ctx`` writes one before each attempt): the resume replays the
winner, runs no loser again and records the loser ``cancelled`` (its attempts kept), as the
crashed execution would have. And a loser cut by the join in one execution is recorded from the
start of its attempt, with that attempt's number."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from chainrt._runner import Runner
from chainrt.concurrency import LocalLimiter
from chainrt.dispatch import Dispatcher
from chainrt.spec import add_chain_root
from chainrt.store import open_store

_TOOLS = """
import asyncio, json, os, time


def _log(name):
    with open(os.environ["CHAINRT_TEST_LOG"], "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"tool": name, "t": time.time()}) + "\\n")


async def step(name, ms=0):
    _log(name)
    await asyncio.sleep(ms / 1000)
    return name


async def step_ctx(name, ms, ctx):
    _log(name)
    await asyncio.sleep(ms / 1000)
    return ctx.attempt
"""

_CHAIN = """
name: losers
budget: 30s
steps:
  - id: race
    parallel:
      quick: [{id: quick, tool: tools.py:step, args: {name: quick, ms: 50}}]
      slow: [{id: slow, tool: tools.py:step_ctx, args: {name: slow, ms: 20000}}]
    join: any
  - {id: after, tool: tools.py:step, args: {name: after}}
"""

# The owner dies as it is about to record the loser cancelled: after the join, before that write.
_KILL_AT_THE_LOSERS_RECORD = """
import asyncio, os, signal, sys
from pathlib import Path
from chainrt._runner import Runner
from chainrt.concurrency import LocalLimiter
from chainrt.dispatch import Dispatcher
from chainrt.spec import add_chain_root, load_spec
from chainrt.store import open_store

async def main() -> None:
    folder = Path(sys.argv[1])
    add_chain_root(folder)
    store = open_store(sys.argv[2])
    commit = store.commit

    async def killing_commit(run_id, token, progress, step=None):
        if step is not None and step.step_id == "race.slow.slow" and step.status == "cancelled":
            os.kill(os.getpid(), signal.SIGKILL)
        await commit(run_id, token, progress, step)

    store.commit = killing_commit
    runner = Runner(store, Dispatcher({}), LocalLimiter())
    loaded = load_spec(folder / "chain.yaml")
    await runner.run(loaded.spec, {}, source_dir=loaded.source_dir, run_id="losers")

asyncio.run(main())
"""


@pytest.fixture
def call_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "calls.jsonl"
    monkeypatch.setenv("CHAINRT_TEST_LOG", str(path))
    return path


def _calls(log: Path) -> list[str]:
    return [json.loads(line)["tool"] for line in log.read_text().splitlines() if line]


async def test_a_resume_records_the_loser_a_crash_left_running(
    tmp_path: Path, store_url: str, call_log: Path
) -> None:
    (tmp_path / "tools.py").write_text(_TOOLS)
    (tmp_path / "chain.yaml").write_text(_CHAIN)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAINRT_")}
    env["CHAINRT_TEST_LOG"] = str(call_log)
    owner = subprocess.run(
        [sys.executable, "-c", _KILL_AT_THE_LOSERS_RECORD, str(tmp_path), store_url],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert owner.returncode == -signal.SIGKILL, owner.stderr
    store = open_store(store_url)
    try:
        before = await store.get_steps("losers")
        marker = before["race.slow.slow"]
        assert (marker.status, marker.attempts) == ("running", 1)  # what the crash left
        assert before["race.quick.quick"].status == "completed"
        add_chain_root(tmp_path)
        runner = Runner(store, Dispatcher({}), LocalLimiter())
        result = await runner.resume("losers", wait=False)
        after = await store.get_steps("losers")
    finally:
        await store.close()
    assert result.status == "completed", result.error
    assert _calls(call_log) == ["quick", "slow", "after"]  # the loser was not run again
    loser = after["race.slow.slow"]
    assert loser.status == "cancelled"
    assert "join" in (loser.error or "")
    assert loser.attempts == 1  # a later run of it would count on from its attempt
    assert loser.started_at == marker.started_at
    assert loser.finished_at >= loser.started_at
    assert after["race"].output == {"quick": "quick"}


async def test_a_loser_cut_by_the_join_is_recorded_from_its_attempt(
    tmp_path: Path, store_url: str, call_log: Path
) -> None:
    (tmp_path / "tools.py").write_text(_TOOLS)
    (tmp_path / "chain.yaml").write_text(_CHAIN)
    add_chain_root(tmp_path)
    from chainrt.spec import load_spec

    loaded = load_spec(tmp_path / "chain.yaml")
    store = open_store(store_url)
    try:
        runner = Runner(store, Dispatcher({}), LocalLimiter())
        result = await runner.run(loaded.spec, {}, source_dir=loaded.source_dir, run_id="cut")
        steps = await store.get_steps("cut")
    finally:
        await store.close()
    assert result.status == "completed", result.error
    loser = steps["race.slow.slow"]
    assert (loser.status, loser.attempts) == ("cancelled", 1)
    called_at = next(
        json.loads(line)["t"]
        for line in call_log.read_text().splitlines()
        if json.loads(line)["tool"] == "slow"
    )
    assert loser.started_at <= called_at <= loser.finished_at
