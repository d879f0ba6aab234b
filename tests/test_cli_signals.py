"""SIGTERM and SIGINT stop ``chainrt run`` cleanly (issue 12, findings 3 and 13).

A real ``chainrt run`` process holds a concurrency slot (``limit: 1``) on a real Redis, or on the
SQLite store whose limiter holds across processes, and is stopped inside its step. It must give back its owner lease and its slot, record the budget it used, print one
line naming the run to resume (its real id), and exit 128 + the signal's number. The slot's
lease lasts 60 s here, far past the next run's 8 s budget: had the slot not been released, the
next run of the same user would end ``rejected`` (what the issue saw), not ``completed``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chainrt.store import open_store

CHAIN = """\
name: hold
budget: 8s
inputs:
  user: str
  marker: str
concurrency:
  - key: "user:{{ input.user }}"
    limit: 1
steps:
  - id: hold
    tool: tools.py:hold
    args: {marker: "{{ input.marker }}"}
output: "{{ steps.hold.output }}"
"""

TOOLS = """\
import time
from pathlib import Path


def hold(marker):
    flag = Path(marker)
    if flag.exists():
        return "quick"
    flag.write_text("started")
    time.sleep(30)
    return "slow"
"""


@pytest.fixture
def chains(tmp_path: Path) -> Path:
    folder = tmp_path / "chains"
    folder.mkdir()
    (folder / "hold.yaml").write_text(CHAIN, encoding="utf-8")
    (folder / "tools.py").write_text(TOOLS, encoding="utf-8")
    return folder


def env_for(store: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAINRT_")}
    env.update({"CHAINRT_STORE": store, "CHAINRT_LEASE_TTL_S": "60"})
    return env


def cli(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chainrt", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=60,
    )


def wait_for(path: Path, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run never reached its step"
        time.sleep(0.02)


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
async def test_a_signal_releases_lease_and_slots_and_names_the_run(
    chains: Path, store_url: str, signum: signal.Signals, code: int
) -> None:
    env = env_for(store_url)
    marker = chains.parent / "started"
    inputs = json.dumps({"user": "u1", "marker": str(marker)})
    first = subprocess.Popen(
        [sys.executable, "-m", "chainrt", "run", "chains/hold.yaml", "--input", inputs,
         "--run-id", "sig-1", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=chains.parent,
    )  # fmt: skip
    try:
        wait_for(marker, first)
        first.send_signal(signum)
        _, stderr = first.communicate(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    assert first.returncode == code, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert f"stopped by {signum.name}" in lines[0]
    assert "`chainrt resume sig-1`" in lines[0]  # the real id, not RUN_ID

    store = open_store(store_url)
    try:
        stopped = await store.get_run("sig-1")
    finally:
        await store.close()
    assert stopped.status == "running"
    assert stopped.owner is None  # released: a resume may start at once
    assert stopped.budget_used_ms > 0  # the time spent in the step was recorded

    other = json.dumps({"user": "u1", "marker": str(marker)})  # the marker exists: quick
    second = cli("run", "chains/hold.yaml", "--input", other, "--run-id", "sig-2", "--json",
                 env=env, cwd=chains.parent)  # fmt: skip
    assert second.returncode == 0, second.stderr
    result = json.loads(second.stdout)
    assert result["status"] == "completed"  # got the slot: `rejected` had it still been held

    resumed = cli("resume", "sig-1", "--no-wait", "--json", env=env, cwd=chains.parent)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["output"] == "quick"
