"""kill -9 at random moments of a chain with groups inside groups; resume until it completes.

After every kill the test reads which inner steps are recorded; a resume must run none of them
again, must never change the switch's branch, and the run must end with the right output.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from chainrt.store import open_store

FLOW = Path(__file__).parent / "data" / "chains" / "flow"
ITEMS = [3, 1, 4, 1, 5, 9, 2]
# Each process is a fresh interpreter (seconds to start on a loaded 2-core machine): a few runs
# of a few kills each keep the test well inside its 120 s; bench-scale drills are for bench/.
RUNS = 1
KILLS = 6
EXPECTED = {
    "route": {"a": 2, "b": 5},
    "branch": "wide",
    "each": [f"{i}:{v}" for i, v in enumerate(ITEMS)],
}


def logged(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [json.loads(line)["tool"] for line in path.read_text().splitlines() if line]


async def snapshot(url: str, run_id: str) -> tuple[dict[str, Any], str | None]:
    store = open_store(url)
    try:
        steps = await store.get_steps(run_id)
        run = await store.get_run(run_id)
    finally:
        await store.close()
    done = {p: r.output for p, r in steps.items() if r.status == "completed"}
    return done, run.status


@pytest.mark.slow
async def test_kill_9_at_random_moments_never_reruns_a_recorded_inner_step(
    store_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "calls.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAINRT_")}
    env.update(
        {"CHAINRT_STORE": store_url, "CHAINRT_TEST_LOG": str(log), "CHAINRT_CHAIN_ROOTS": str(FLOW)}
    )
    rng = random.Random(37)
    for number in range(RUNS):
        run_id = f"drill-{number}"
        inputs = json.dumps({"kind": "wide", "items": ITEMS})
        command = [sys.executable, "-m", "chainrt", "run", str(FLOW / "drill.yaml"),
                   "--input", inputs, "--run-id", run_id, "--json"]  # fmt: skip
        kills: list[tuple[int, dict[str, Any]]] = []  # (log lines at the kill, records then)
        status: str | None = None
        for _ in range(KILLS):
            before = len(logged(log))
            proc = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
            )
            # Kill once it has made a few calls of its own (its start-up varies by seconds).
            wanted = before + rng.randint(1, 8)
            deadline = time.monotonic() + 60
            while len(logged(log)) < wanted and proc.poll() is None:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.005)
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            proc.communicate()
            done, status = await snapshot(store_url, run_id)
            if status == "completed":
                break
            assert status == "running", (status, proc.returncode)
            kills.append((len(logged(log)), done))
            command = [sys.executable, "-m", "chainrt", "resume", run_id, "--json", "--no-wait"]
        if status != "completed":  # the last resume is left to finish
            finished = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
            assert finished.returncode == 0, finished.stderr
        store = open_store(store_url)
        try:
            run = await store.get_run(run_id)
        finally:
            await store.close()
        assert run.status == "completed", run.error
        assert run.output == EXPECTED
        calls = logged(log)
        # At least one kill came in the middle of a group (inner steps recorded, run unfinished).
        assert any("." in path for _, done in kills for path in done), kills
        for at, done in kills:
            again = [c for c in calls[at:] if c in done]
            assert again == [], f"recorded inner steps ran again after a kill: {again}"
            if "route#branch" in done:
                assert done["route#branch"] == "wide"
        log.unlink()  # the next run logs afresh
