"""Concurrency keys through the runner: several runner processes on one Redis, rejections."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import chainrt
from chainrt.concurrency import KeyRequest, open_limiter

CHAINS = Path(__file__).parent / "data" / "chains"

pytestmark = pytest.mark.redis

_DRIVER = """
import asyncio, json, sys
import chainrt

async def main() -> None:
    chain = chainrt.load(sys.argv[1])
    results = []
    for i in range(int(sys.argv[3])):
        result = await chain.arun({"group": "g", "session": f"s-{sys.argv[2]}-{i}"}, store=sys.argv[4])
        results.append(result.status)
    print(json.dumps(results))

asyncio.run(main())
"""


def _max_overlap(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    current = peak = 0
    for _, delta in events:
        current += delta
        peak = max(peak, current)
    return peak


@pytest.fixture(params=["redis", pytest.param("cluster", marks=pytest.mark.cluster)])
def backend_url(request: pytest.FixtureRequest) -> str:
    """The session's single Redis, then the session's Redis Cluster (both flushed)."""
    name = "redis_url" if request.param == "redis" else "cluster_url"
    url: str = request.getfixturevalue(name)
    return url


def test_four_runner_processes_never_exceed_the_key_limit(backend_url: str, tmp_path: Path) -> None:
    redis_url = backend_url
    log = tmp_path / "holds.jsonl"
    env = {**os.environ, "CHAINRT_TEST_LOG": str(log)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _DRIVER, str(CHAINS / "limited.yaml"), str(n), "4", redis_url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for n in range(4)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, err
        assert json.loads(out) == ["completed"] * 4
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(entries) == 16
    assert len({e["pid"] for e in entries}) == 4  # four runner processes took part
    overlap = _max_overlap([(e["entered"], e["left"]) for e in entries])
    assert overlap <= 2, f"{overlap} runs held a limit-2 key at once"
    assert overlap == 2, "the runs never overlapped: the test proved nothing"


async def test_run_that_cannot_get_its_key_in_time_is_rejected(redis_url: str) -> None:
    limiter = open_limiter(redis_url, lease_ttl_s=5)
    holding = await limiter.acquire([KeyRequest("user:u9", 1)], timeout_s=1, holder="someone-else")
    try:
        result = await chainrt.load(CHAINS / "tight_key.yaml").arun(
            {"user": "u9"}, run_id="rejected-1", store=redis_url
        )
    finally:
        await holding.release()
        await limiter.close()
    assert result.status == "rejected"
    assert result.error is not None
    assert "user:u9" in result.error
    assert "waited" in result.error
    assert result.steps == []  # nothing ran
    assert result.budget.used_ms <= 300 + 50
    # The key is free again: nothing was left half-held by the rejected run.
    again = await chainrt.load(CHAINS / "tight_key.yaml").arun({"user": "u9"}, store=redis_url)
    assert again.status == "completed"


def test_inspect_shows_the_wait_per_key(redis_url: str, tmp_path: Path) -> None:
    env = {**os.environ, "CHAINRT_STORE": redis_url, "CHAINRT_TEST_LOG": str(tmp_path / "l.jsonl")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "chainrt",
            "run",
            str(CHAINS / "limited.yaml"),
            "--run-id",
            "waits-1",
            "--input",
            '{"group": "g", "session": "s"}',
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    shown = subprocess.run(
        [sys.executable, "-m", "chainrt", "inspect", "waits-1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert "for key group:g" in shown.stdout
    assert "for key session:s" in shown.stdout
