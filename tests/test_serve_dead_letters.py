"""Poison in the queue: entries whose handling fails for good go to the dead letters after three
deliveries (real ``chainrt serve`` processes, a real Redis, the poison written straight into it),
``chainrt dlq`` shows, drops and retries them, and old poison never starves newer orphans."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from chainrt.redis.keys import StoreKeys
from chainrt.serve._queue import stream_key
from chainrt.testing.serve_process import ServeProcess

CHAINS = Path(__file__).parent / "data" / "serve"

pytestmark = pytest.mark.redis


def poison_record(client: redis.Redis, run_id: str, priority: str = "critical") -> None:
    """A run whose record cannot be read back (as a 200-level deep input once made), and its
    queue entry."""
    now = repr(time.time())
    client.hset(
        StoreKeys().run(run_id),
        mapping={"record": "{not json", "status": "queued", "token": "0", "created_at": now},
    )
    client.xadd(stream_key(priority, chain="nap"), {"run_id": run_id, "op": "start"})


def dead_letters(r: ServeProcess) -> list[dict[str, object]]:
    answer = r.get("/v1/dlq")
    assert answer.status_code == 200, answer.text
    return list(answer.json())


def wait_for(check: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what} not seen in {timeout_s}s"
        time.sleep(0.2)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chainrt", *args], capture_output=True, text=True, timeout=60
    )


def test_poison_entries_are_dead_lettered_after_three_deliveries_and_shown(
    redis_url: str,
) -> None:
    client = redis.Redis.from_url(redis_url)
    with ServeProcess(store=redis_url, chains=CHAINS) as r:
        poison_record(client, "poison-1")
        client.xadd(stream_key("critical", chain="nap"), {"garbage": "yes"})  # no entry at all
        wait_for(lambda: len(dead_letters(r)) == 2, 60, "two dead letters")
        letters = {str(d["run_id"]): d for d in dead_letters(r)}
        assert letters["poison-1"]["deliveries"] == 3
        assert "CorruptRecord" in str(letters["poison-1"]["reason"])
        assert "PoisonEntry" in str(letters[""]["reason"])
        # Nothing of them is pending any more: the queue is clean and runs go on.
        pending = client.xpending(stream_key("critical", chain="nap"), "runners")
        assert pending["pending"] == 0
        body = {"chain": "nap", "input": {"seconds": 0.01, "label": "x"}, "run_id": "good"}
        assert r.post("/v1/runs", json=body).status_code == 202
        assert r.get("/v1/runs/good", params={"wait": "30s"}).json()["status"] == "completed"
        metrics = r.get("/metrics").text
        assert "chainrt_queue_dead_letters 2.0" in metrics
        # One warning line per failed delivery, no traceback storm.
        assert r.log().count("Traceback") == 0

        listed = cli("dlq", "list", "--server", r.url)
        assert listed.returncode == 0, listed.stderr
        assert "poison-1" in listed.stdout
        assert "CorruptRecord" in listed.stdout
        dead_id = str(letters["poison-1"]["id"])
        shown = cli("dlq", "show", dead_id, "--server", r.url, "--json")
        assert json.loads(shown.stdout)["run_id"] == "poison-1"
        dropped = cli("dlq", "drop", str(letters[""]["id"]), "--server", r.url)
        assert dropped.returncode == 0, dropped.stderr
        assert [d["run_id"] for d in dead_letters(r)] == ["poison-1"]
        retried = cli("dlq", "retry", dead_id, "--server", r.url)
        assert retried.returncode == 0, retried.stderr
        assert "queued again" in retried.stdout
        # Still poison: back in the dead letters three deliveries later, under a new id.
        wait_for(
            lambda: len(dead_letters(r)) == 1 and dead_letters(r)[0]["id"] != dead_id,
            60,
            "the retried letter",
        )
        missing = cli("dlq", "show", "1-1", "--server", r.url)
        assert missing.returncode == 2
        assert "no dead letter" in missing.stderr
    client.close()


@pytest.mark.slow
def test_old_poison_entries_do_not_starve_the_orphans_of_a_killed_runner(
    redis_url: str, tmp_path: Path
) -> None:
    env = {"CHAINRT_LEASE_TTL_S": "3", "CHAINRT_TEST_LOG": str(tmp_path / "calls.jsonl")}
    client = redis.Redis.from_url(redis_url)
    # The poison first, so that it is the oldest of every stream.
    for i in range(60):
        poison_record(client, f"poison-{i}")
    survivor = ServeProcess(store=redis_url, chains=CHAINS, env=env, max_runs=4).start()
    victim = ServeProcess(store=redis_url, chains=CHAINS, env=env, max_runs=8).start()
    try:
        ids = [f"orphan-{i}" for i in range(6)]
        for run_id in ids:
            body = {"chain": "nap", "input": {"seconds": 1.5, "label": run_id}, "run_id": run_id}
            assert victim.post("/v1/runs", json=body, params={}).status_code == 202
        wait_for(
            lambda: all(victim.get(f"/v1/runs/{i}").json()["status"] != "queued" for i in ids),
            30,
            "the runs started",
        )
        victim.kill()
        killed_at = time.monotonic()
        statuses = [
            survivor.get(f"/v1/runs/{run_id}", params={"wait": "60s"}, timeout=90).json()["status"]
            for run_id in ids
        ]
        took_s = time.monotonic() - killed_at
        assert statuses == ["completed"] * len(ids), survivor.log()
        # Lease TTL 3 s + orphan idle 3 s + the runs' own 1.5 s, with room for a loaded machine;
        # before the fix they were never reached while the poison filled every claim.
        assert took_s < 45
    finally:
        victim.kill()
        survivor.stop()
        client.close()
