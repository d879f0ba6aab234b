"""Redis failing under a running chain: a restart, an outage that lasts, Redis down.

The runs here use their own ``RedisServer(password=..., durable=True)`` (``appendfsync always``:
a write that Redis acknowledged survives its ``kill -9``), so that a restart keeps the data.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis

from chainrt import CheckpointError, StoreUnavailable
from chainrt._runtime import open_runtime
from chainrt.redis.keys import StoreKeys
from chainrt.spec import load_spec
from chainrt.testing.drill import expected_output, read_log
from chainrt.testing.redis_server import RedisServer, free_port

pytestmark = pytest.mark.redis

DRILL = Path(__file__).parent / "data" / "drill"
SLOW = DRILL / "slow.yaml"  # 20 steps of 50 ms, budget 30 s
PASSWORD = "outage-pw-42"
KEYS = StoreKeys()
COMMIT_GRACE_S = 0.5  # chainrt._runner._COMMIT_GRACE_S: a write may land this late
SLACK_S = 1.0
"""Scheduling slack on a busy 2-core machine (0.2 s was reached beside other work in CI). Each
bound below stays clear of the failure it catches by more than this: a write that waited out a
store retry window (10 s where the budget or the grace bounds it, another 2 s otherwise)."""
LONG_RETRY_S = 10.0


@pytest.fixture
def durable() -> Iterator[RedisServer]:
    with RedisServer(password=PASSWORD, durable=True) as server:
        yield server


def chainrt(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chainrt", *args], capture_output=True, text=True, timeout=timeout
    )


def start_run(server: RedisServer, run_id: str, log_dir: Path) -> subprocess.Popen[str]:
    inputs = json.dumps({"seed": run_id, "log_dir": str(log_dir)})
    args = ["run", str(SLOW), "--input", inputs, "--run-id", run_id, "--store", server.url]
    return subprocess.Popen(
        [sys.executable, "-m", "chainrt", *args, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "CHAINRT_LEASE_TTL_S": "10"},
    )


def wait_for_steps(client: redis.Redis, run_id: str, count: int) -> dict[bytes, bytes]:
    """The run's step records, byte for byte, once at least ``count`` exist."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        steps: dict[bytes, bytes] = client.hgetall(KEYS.steps(run_id))  # type: ignore[assignment]
        if len(steps) >= count:
            return steps
        time.sleep(0.005)
    raise AssertionError(f"run {run_id} never reached {count} recorded steps")


def test_a_redis_restart_mid_run_loses_no_recorded_step(
    durable: RedisServer, tmp_path: Path
) -> None:
    run = start_run(durable, "restart-1", tmp_path)
    client = redis.Redis.from_url(durable.url)
    try:
        before = wait_for_steps(client, "restart-1", 5)
        durable.kill()
        time.sleep(0.2)  # Redis is gone for a moment; the runner's writes retry meanwhile
        durable.start()
        out, err = run.communicate(timeout=60)
        assert run.returncode == 0, err
        result = json.loads(out)
        assert result["status"] == "completed"
        assert result["output"] == expected_output("restart-1", 20)
        after: dict[bytes, bytes] = client.hgetall(KEYS.steps("restart-1"))  # type: ignore[assignment]
    finally:
        client.close()
    assert len(after) == 20
    for step_id, record in before.items():
        if json.loads(record)["status"] == "running":  # a ctx tool's attempt, written first
            continue
        assert after[step_id] == record  # every record written before the restart survived
    executions, problems = read_log(tmp_path / "restart-1.jsonl")
    assert problems == []
    assert sorted(e.step for e in executions) == [f"s{i:02d}" for i in range(20)]  # each once
    assert {e.pid for e in executions} == {run.pid}


def test_a_store_that_stays_down_ends_the_run_and_keeps_its_checkpoint(
    durable: RedisServer, tmp_path: Path
) -> None:
    run = start_run(durable, "down-1", tmp_path)
    client = redis.Redis.from_url(durable.url)
    try:
        wait_for_steps(client, "down-1", 5)
        durable.kill()
        killed_at = time.monotonic()
        _, err = run.communicate(timeout=60)
        gave_up_s = time.monotonic() - killed_at
        lines = err.strip().splitlines()
        assert run.returncode not in (0, 1), err  # a store error, not a failed run
        assert len(lines) == 1, err
        assert "Traceback" not in err
        assert f"redis://:***@127.0.0.1:{durable.port}/0" in lines[0]
        assert PASSWORD not in err
        assert gave_up_s < 2.0 + 1.5  # one store retry window (2 s), not one per write

        durable.start()  # the append-only file brings back what was acknowledged
        recorded: dict[bytes, bytes] = client.hgetall(KEYS.steps("down-1"))  # type: ignore[assignment]
    finally:
        client.close()
    assert len(recorded) >= 5
    inspect = chainrt("inspect", "down-1", "--store", durable.url, "--json")
    assert inspect.returncode == 0, inspect.stderr
    shown = json.loads(inspect.stdout)
    assert shown["status"] == "running"
    assert sorted(s["id"] for s in shown["steps"]) == sorted(k.decode() for k in recorded)
    for step_id, raw in recorded.items():
        assert shown["records"][step_id.decode()]["output"] == json.loads(raw)["output"]

    resumed = chainrt("resume", "down-1", "--store", durable.url, "--json", "--chains", str(DRILL))
    assert resumed.returncode == 0, resumed.stderr
    result = json.loads(resumed.stdout)
    assert result["status"] == "completed"
    assert result["output"] == expected_output("down-1", 20)
    executions, problems = read_log(tmp_path / "down-1.jsonl")
    assert problems == []
    # A step in flight at the outage may have a `running` record (a tool taking ctx writes its
    # attempt first): it is not done, and its re-run is the one allowed below.
    done = {k for k, raw in recorded.items() if json.loads(raw)["status"] != "running"}
    rerun = [e.step for e in executions if e.pid != run.pid and e.step.encode() in done]
    assert rerun == []  # the resume ran none of the steps recorded before the outage
    assert len(executions) <= 21  # at most the one step in flight at the outage ran twice


def test_redis_down_at_start_is_one_line_naming_the_url(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    url = f"redis://:{PASSWORD}@127.0.0.1:{port}/0"
    inputs = json.dumps({"seed": "x", "log_dir": str(tmp_path)})
    done = chainrt("run", str(SLOW), "--input", inputs, "--store", url, "--json")
    assert done.returncode not in (0, 1), done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"redis://:***@127.0.0.1:{port}/0" in lines[0]
    assert "unreachable" in lines[0]
    assert PASSWORD not in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
    assert list(tmp_path.glob("*.jsonl")) == []  # not one step ran


# ---------------------------------------------------------------------------- within the budget


def write_grace_chain(directory: Path) -> Path:
    """Three steps; the middle one (allotted ~1.93 s) sleeps 1.8 s, until ~0.17 s of the 2 s
    budget are left, so its write (while the store is down) starts with less than the grace."""
    shutil.copy(DRILL / "tools.py", directory / "tools.py")
    args = '{prev: "{{ %s }}", sleep_ms: %d, log_dir: "{{ input.log_dir }}"}'
    chain = directory / "grace.yaml"
    chain.write_text(
        "name: grace\nbudget: 2s\ninputs: {seed: str, log_dir: str}\nsteps:\n"
        f"  - {{id: s00, weight: 1, tool: tools.py:step_sync, args: {args % ('input.seed', 20)}}}\n"
        f"  - {{id: s01, weight: 10, tool: tools.py:step_sync, args: {args % ('steps.s00.output', 1800)}}}\n"
        f"  - {{id: s02, weight: 0.2, tool: tools.py:step_sync, args: {args % ('steps.s01.output', 10)}}}\n"
    )
    return chain


@pytest.mark.parametrize(
    ("case", "budget_ms", "after_steps", "most_past_budget_s"),
    [
        ("budget bound", 1500.0, 5, SLACK_S),  # the write gets what the budget has left
        ("grace bound", None, 1, COMMIT_GRACE_S + SLACK_S),  # the last write gets the grace
        ("retry bound", 30_000.0, 5, None),  # the store gives up after its 2 s retry window
    ],
)
async def test_store_outage_ends_the_run_within_its_budget(
    durable: RedisServer,
    tmp_path: Path,
    case: str,
    budget_ms: float | None,
    after_steps: int,
    most_past_budget_s: float | None,
) -> None:
    chain = SLOW if budget_ms is not None else write_grace_chain(tmp_path)
    loaded = load_spec(chain)
    budget_s = (budget_ms or loaded.spec.budget) / 1000
    run_id = f"budget-{case.split()[0]}"
    probe = aioredis.Redis(port=durable.port, password=PASSWORD)
    # Where the budget or the grace bounds the write, the store's own retry window is long, so
    # that a write that ignored them would overrun by far more than the scheduling slack.
    url = durable.url if most_past_budget_s is None else f"{durable.url}?retry_for_s={LONG_RETRY_S}"
    async with open_runtime(store=url) as runtime:
        started = time.monotonic()
        run = asyncio.create_task(
            runtime.runner.run(
                loaded.spec,
                {"seed": run_id, "log_dir": str(tmp_path)},
                source_dir=loaded.source_dir,
                run_id=run_id,
                budget_ms=budget_ms,
            )
        )
        while await probe.hlen(KEYS.steps(run_id)) < after_steps:
            assert not run.done(), run.result()
            await asyncio.sleep(0.005)
        await probe.aclose()
        if case == "grace bound":
            await asyncio.sleep(0.3)  # s01 is sleeping now; it ends with ~0.15 s left
        durable.kill()
        killed = time.monotonic()
        with pytest.raises(CheckpointError) as caught:
            await run
        ended = time.monotonic()
    assert isinstance(caught.value, StoreUnavailable)
    assert f"redis://:***@127.0.0.1:{durable.port}/0" in str(caught.value)
    assert PASSWORD not in str(caught.value)
    if most_past_budget_s is not None:
        assert ended - started <= budget_s + most_past_budget_s, (ended - started, budget_s)
    else:
        assert ended - killed <= 2.0 + SLACK_S  # one retry window, then no second write
