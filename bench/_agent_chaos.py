"""bench/agent.py --chaos N: agent runs killed with kill -9 at random moments, then resumed.

Each run is ``chainrt run`` of a four-turn agent (five side-effect calls, two turns proposing two
at once) against the scripted model, killed with ``kill -9`` once a random number (0-5) of its
calls has started plus a random 0-60 ms, then resumed in this process until it completes. Counted: runs, runs killed mid-way, tool calls that
ran again although their record was written before the kill (goal: 0), wrong final outputs
(goal: 0), and calls in flight at a kill that ran once more (allowed: at most once each).
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import chainrt
from chainrt.spec import add_chain_root
from chainrt.store import open_store
from chainrt.testing.scripted_model import answer, calls, scripted_model

CHAIN = """\
name: agent-chaos
budget: 60s
inputs: {q: str}
steps:
  - id: agent
    agent:
      model: primary
      prompt: "{{ input.q }}"
      tools: [_agent_tools.py:side]
      max_iterations: 6
      constrain: shape
output: "{{ steps.agent.output }}"
"""

SCRIPT = [
    calls(("side", {"n": 1}), ("side", {"n": 2})),
    calls(("side", {"n": 3})),
    calls(("side", {"n": 4}), ("side", {"n": 5})),
    answer("done"),
]
EXPECTED = {
    "answer": "done",
    "calls": [{"name": "side", "arguments": {"n": n}, "result": 2 * n} for n in range(1, 6)],
    "iterations": 4,
    "stopped": "answer",
}


def _log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def chaos(runs: int, store_url: str, folder: Path, seed: int = 1) -> dict[str, int]:
    """``runs`` killed-and-resumed agent runs on ``store_url``; the counts."""
    rng = random.Random(seed)
    chain = folder / "chaos.yaml"
    chain.write_text(CHAIN)
    log = folder / f"chaos-{time.time_ns()}.jsonl"
    counts: collections.Counter[str] = collections.Counter()
    with scripted_model(SCRIPT, delay_s=0.02) as model:
        pool = folder / "chaos-pool.yaml"
        pool.write_text(
            f"models:\n  primary: {{endpoints: [{{url: '{model.url}'}}]}}\n"
            "health: {enabled: false}\n"
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("CHAINRT_")}
        env.update({"CHAINRT_STORE": store_url, "CHAINRT_POOL": str(pool),
                    "CHAINRT_TEST_LOG": str(log)})  # fmt: skip
        add_chain_root(folder)  # the runs' chain folder: this process resumes them
        os.environ["CHAINRT_TEST_LOG"] = str(log)  # the resumed runs' calls are logged too
        span = _span(chain, env, counts)
        store = open_store(store_url)
        try:
            for index in range(runs):
                await _one(chain, env, store, store_url, str(pool), log, rng, span, index, counts)
        finally:
            await store.close()
    shown = ("runs", "killed", "never_started", "recorded_calls_run_again", "wrong_output")
    return {**{key: counts.get(key, 0) for key in shown}, **counts}


def _span(chain: Path, env: dict[str, str], counts: collections.Counter[str]) -> float:
    """Seconds from a run's process start to its end, measured once (kill moments fall in it)."""
    t0 = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "chainrt", "run", str(chain), "--input", '{"q": "?"}',
         "--run-id", f"span-{time.time_ns()}"],
        env=env, capture_output=True, check=True,
    )  # fmt: skip
    return time.monotonic() - t0


async def _one(
    chain: Path,
    env: dict[str, str],
    store: Any,
    store_url: str,
    pool: str,
    log: Path,
    rng: random.Random,
    span: float,
    index: int,
    counts: collections.Counter[str],
) -> None:
    run_id = f"chaos-{index}-{time.time_ns()}"
    owner = subprocess.Popen(
        [sys.executable, "-m", "chainrt", "run", str(chain), "--input", '{"q": "?"}',
         "--run-id", run_id],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    # Killed once the run's k-th call has started (k random, 0..5), a random moment later: in
    # a turn, between calls proposed together, or while a call's record is written.
    wanted = rng.randint(0, 5)
    ends = time.monotonic() + span * 3
    while owner.poll() is None and time.monotonic() < ends:
        if sum(1 for e in _log(log) if e["key"].startswith(run_id + ":")) >= wanted:
            break
        time.sleep(0.005)
    time.sleep(rng.uniform(0.0, 0.06))
    killed = owner.poll() is None
    if killed:
        os.kill(owner.pid, signal.SIGKILL)
    owner.wait()
    counts["runs"] += 1
    try:
        before = await store.get_steps(run_id)
    except chainrt.errors.ChainRTError:
        before = {}
    recorded = {
        f"{run_id}:{p}"
        for p, r in before.items()
        if ".call[" in p and r.status in ("completed", "failed")
    }
    seen = len(_log(log))
    if killed:
        counts["killed"] += 1
        if not before:
            counts["killed_before_any_record"] += 1
        try:
            result = await chainrt.aresume(run_id, store=store_url, pool=pool, wait=False)
        except chainrt.errors.RunNotFound:  # killed before its run record was written
            counts["never_started"] += 1
            return
    else:
        result = await chainrt.aresume(run_id, store=store_url, pool=pool, wait=False)
    if result.status != "completed" or result.output != EXPECTED:
        counts["wrong_output"] += 1
    entries = _log(log)
    started = {e["key"] for e in entries[:seen] if e["key"].startswith(run_id + ":")}
    again = [e["key"] for e in entries[seen:] if e["key"].startswith(run_id + ":")]
    counts["recorded_calls_run_again"] += sum(1 for key in again if key in recorded)
    counts["in_flight_calls_run_again"] += sum(1 for k in again if k in started - recorded)
    counts["calls_after_resume"] += len(again)
    counts["calls_run_more_than_twice"] += sum(
        1 for key in set(again) if sum(1 for e in entries if e["key"] == key) > 2
    )
