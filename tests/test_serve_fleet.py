"""A fleet of ``chainrt serve`` processes on one real Redis: priority, kill -9 takeover, drain."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from chainrt._records import RunRecord, StepRecord
from chainrt.store import open_store
from chainrt.testing.serve_process import ServeProcess

CHAINS = Path(__file__).parent / "data" / "serve"

pytestmark = pytest.mark.redis


@pytest.fixture
def call_log(tmp_path: Path) -> Path:
    return tmp_path / "calls.jsonl"


def calls(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


LEASE_TTL_S = 3.0


def runner(redis_url: str, call_log: Path, **kw: object) -> ServeProcess:
    env = {"CHAINRT_TEST_LOG": str(call_log), "CHAINRT_LEASE_TTL_S": f"{LEASE_TTL_S:g}"}
    return ServeProcess(store=redis_url, chains=CHAINS, env=env, **kw)  # type: ignore[arg-type]


def wait_final(r: ServeProcess, run_id: str, timeout_s: float = 120) -> dict[str, object]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            got = r.get(f"/v1/runs/{run_id}", params={"wait": "10s"}).json()
        except httpx.HTTPError:
            time.sleep(0.2)
            continue
        if got["status"] not in ("queued", "running"):
            return dict(got)
    raise AssertionError(f"run {run_id} not final in {timeout_s}s")


def test_critical_runs_start_before_the_low_runs_still_queued(
    redis_url: str, call_log: Path
) -> None:
    with runner(redis_url, call_log, max_runs=1) as r:
        for i in range(20):
            # The first low run holds the one slot for 3 s: the three criticals must all be queued
            # before a slot frees, and three POSTs on a busy machine can take longer than a 0.1 s
            # nap (a low run then slips in between two criticals).
            body = {
                "chain": "nap",
                "input": {"seconds": 3.0 if i == 0 else 0.1, "label": f"low-{i}"},
                "run_id": f"low-{i}",
                "priority": "low",
            }
            assert r.post("/v1/runs", json=body).status_code == 202
        while not calls(call_log):
            time.sleep(0.01)
        for i in range(3):
            body = {
                "chain": "nap",
                "input": {"seconds": 0.1, "label": f"crit-{i}"},
                "run_id": f"crit-{i}",
                "priority": "critical",
            }
            assert r.post("/v1/runs", json=body).status_code == 202
        started_before = {c["run"] for c in calls(call_log)}
        for i in range(20):
            assert wait_final(r, f"low-{i}")["status"] == "completed"
    order = [str(c["run"]) for c in calls(call_log)]
    assert len(order) == 23
    # One slot: at most the low run taken as the criticals were submitted goes before them.
    first_crit = min(order.index(f"crit-{i}") for i in range(3))
    last_crit = max(order.index(f"crit-{i}") for i in range(3))
    assert last_crit - first_crit == 2  # the three criticals back to back...
    assert first_crit <= len(started_before) + 1  # ...right after what had already started
    assert all(o.startswith("low-") for o in order[last_crit + 1 :])
    assert len(order[last_crit + 1 :]) >= 20 - len(started_before) - 1


@pytest.mark.slow
def test_fleet_drill_kill_9_runner_and_every_run_completes_once(
    redis_url: str, call_log: Path
) -> None:
    runners = [runner(redis_url, call_log, max_runs=8).start() for _ in range(3)]
    try:
        ids = [f"fleet-{i}" for i in range(50)]
        for n, run_id in enumerate(ids):
            body = {"chain": "ten", "input": {"seconds": 0.02}, "run_id": run_id}
            assert runners[n % 3].post("/v1/runs", json=body).status_code == 202
        while len(calls(call_log)) < 100:  # the fleet is busy: kill one mid-run
            time.sleep(0.01)
        victim = runners[1]
        victim_pid = victim.pid
        victim.kill()
        time.sleep(0.5)
        victim.start()
        results = [wait_final(runners[0], run_id) for run_id in ids]
    finally:
        for r in runners:
            r.stop()
    assert [(res["status"], res["output"]) for res in results] == [("completed", 45)] * 50
    log = calls(call_log)
    per_step = Counter((c["run"], c["step"]) for c in log)
    assert len(per_step) == 500  # every step of every run ran
    twice = [key for key, n in per_step.items() if n > 1]
    assert all(per_step[key] == 2 for key in twice)  # never more than once more...
    # ...and only the step in flight when its runner was killed: one per run at most, first
    # run by the killed process.
    assert len({run for run, _ in twice}) == len(twice)
    for run, step in twice:
        first = next(c for c in log if (c["run"], c["step"]) == (run, step))
        assert first["pid"] == victim_pid


async def stored(url: str, run_id: str) -> tuple[RunRecord, dict[str, StepRecord]]:
    store = open_store(url)
    try:
        return await store.get_run(run_id), await store.get_steps(run_id)
    finally:
        await store.close()


@pytest.mark.slow
def test_a_run_whose_runner_is_killed_is_resumed_within_lease_ttl_plus_2s(
    redis_url: str, call_log: Path
) -> None:
    a = runner(redis_url, call_log, max_runs=2).start()
    b = runner(redis_url, call_log, max_runs=2).start()
    try:
        body = {"chain": "ten", "input": {"seconds": 0.4}, "run_id": "orphaned"}
        assert a.post("/v1/runs", json=body).status_code == 202
        while len(calls(call_log)) < 3:  # two steps recorded, the third in flight
            time.sleep(0.01)
        victim_pid = calls(call_log)[0]["pid"]
        victim, other = (a, b) if victim_pid == a.pid else (b, a)
        killed_at = time.time()  # taken before the signal: the interval measured is not shorter
        victim.kill()
        result = wait_final(other, "orphaned")
    finally:
        a.stop()
        b.stop()
    assert (result["status"], result["output"]) == ("completed", 45)
    record, steps = asyncio.run(stored(redis_url, "orphaned"))
    assert record.fencing_token == 2  # taken over once
    assert len(steps) == 10
    # Start and resume from the store: the first step's start, and the first step started after
    # the kill (the killed runner's in-flight step wrote nothing, so it is the taker's).
    started_at = min(s.started_at for s in steps.values())
    resumed_at = min(s.started_at for s in steps.values() if s.started_at > killed_at)
    by_victim = [s for s in steps.values() if s.started_at < killed_at]
    assert len(by_victim) >= 2
    detection_s = resumed_at - killed_at
    print(
        f"run started {killed_at - started_at:.2f} s before the kill; resumed {detection_s:.2f} s after"
    )
    # Same host: the dead pid is seen at once, so the run waits for its queue entry to go
    # untouched for orphan_idle_s (3 s, touched every 1 s until the kill) plus at most one
    # orphan scan (every 1 s): about 2-4 s, within the goal of TTL (3 s) + 2 s. The 3 s more
    # are for a loaded 2-core machine, where the scan, the claim and the first step's start
    # all wait for a CPU; a runner that never looked for orphans would not resume it at all.
    assert detection_s < LEASE_TTL_S + 2.0 + 3.0


def can_unshare_uts() -> bool:
    try:
        return subprocess.run(["unshare", "-u", "true"], capture_output=True).returncode == 0
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not can_unshare_uts(), reason="needs `unshare -u` (root on Linux)")
def test_a_run_whose_runner_on_another_host_is_killed_is_resumed_when_its_lease_expires(
    redis_url: str, call_log: Path
) -> None:
    # The taker cannot see the other host's pid, so it waits for the lease. With a TTL of 5 s the
    # lease ends between two orphan scans of the entry (~3 s and ~6.5 s after the kill).
    ttl_s = 5.0
    env = {"CHAINRT_TEST_LOG": str(call_log), "CHAINRT_LEASE_TTL_S": f"{ttl_s:g}"}
    far = ServeProcess(store=redis_url, chains=CHAINS, max_runs=2, env=env, hostname="far-host")
    near = ServeProcess(store=redis_url, chains=CHAINS, max_runs=2, env=env)
    far.start()
    near.start()
    try:
        body = {"chain": "ten", "input": {"seconds": 0.4}, "run_id": "far"}
        assert far.post("/v1/runs", json=body).status_code == 202
        while len(calls(call_log)) < 3:  # two steps recorded, the third in flight
            time.sleep(0.01)
        victim, taker = (far, near) if calls(call_log)[0]["pid"] == far.pid else (near, far)
        renewed = asyncio.run(stored(redis_url, "far"))[0].owner
        while (now := asyncio.run(stored(redis_url, "far"))[0].owner) == renewed:
            time.sleep(0.01)  # kill just after a renewal: the lease then runs ~TTL past the kill
        assert now is not None
        killed_at = time.time()
        victim.kill()
        owner = asyncio.run(stored(redis_url, "far"))[0].owner  # the victim's last lease
        result = wait_final(taker, "far")
    finally:
        far.stop()
        near.stop()
    assert owner is not None
    assert (owner.host == "far-host") == (victim is far)  # the taker is on the other host
    assert (result["status"], result["output"]) == ("completed", 45)
    record, steps = asyncio.run(stored(redis_url, "far"))
    assert record.fencing_token == 2
    resumed_at = min(s.started_at for s in steps.values() if s.started_at > killed_at)
    print(
        f"lease expired {owner.expires_at - killed_at:.2f} s after the kill; "
        f"resumed {resumed_at - killed_at:.2f} s after the kill"
    )
    assert resumed_at > owner.expires_at  # never while the lease ran
    # The taker holds the orphaned entry until the lease's end, then resumes (~0.06 s after it
    # here) rather than at its next orphan scan (~1.5 s later here, up to 4 s). 1 s
    # leaves 15x that for a loaded 2-core machine (a timer, a read, the claim and the first
    # step's start waiting for a CPU) and still fails most runs of a taker that waits for its
    # next scan. The goal, TTL + 2 s from the kill, follows: a lease ends at most TTL after the
    # kill; the 1 s more there is the same margin.
    assert resumed_at - owner.expires_at < 1.0
    assert resumed_at - killed_at < ttl_s + 2.0 + 1.0


@pytest.mark.slow
def test_sigterm_drains_and_another_runner_finishes_the_run(redis_url: str, call_log: Path) -> None:
    a = runner(redis_url, call_log, max_runs=4, drain="1s").start()
    b = runner(redis_url, call_log, max_runs=4, drain="1s").start()
    try:
        body = {"chain": "ten", "input": {"seconds": 0.3}, "run_id": "drained"}
        assert a.post("/v1/runs", json=body).status_code == 202
        while len(calls(call_log)) < 3:
            time.sleep(0.01)
        owner_pid = calls(call_log)[0]["pid"]
        owner, other = (a, b) if owner_pid == a.pid else (b, a)
        stopped_at = time.time()
        owner.terminate()
        assert owner.wait(timeout=20) == 0
        result = wait_final(other, "drained")
    finally:
        a.stop()
        b.stop()
    assert (result["status"], result["output"]) == ("completed", 45)
    log = calls(call_log)
    assert sorted(str(c["step"]) for c in log) == sorted(f"s{i}" for i in range(10))  # no re-run
    handed = [c for c in log if c["pid"] != owner_pid]
    assert handed, "the other runner continued the run"
    # The next step started on the other runner within the drain (1 s) plus about a second;
    # 4 s more leaves room for a loaded 2-core machine.
    assert float(str(handed[0]["t"])) - stopped_at < 1.0 + 2.0 + 4.0


def test_events_of_a_run_on_one_runner_stream_from_another(redis_url: str, call_log: Path) -> None:
    with runner(redis_url, call_log, max_runs=2) as a:
        body = {"chain": "ten", "input": {"seconds": 0.6}, "run_id": "watched"}
        assert a.post("/v1/runs", json=body).status_code == 202
        while not calls(call_log):  # a owns the run before b exists
            time.sleep(0.02)
        with runner(redis_url, call_log, max_runs=2) as b:
            events = []
            with httpx.stream("GET", f"{b.url}/v1/runs/watched/events", timeout=60) as stream:
                connected = time.time()
                for line in stream.iter_lines():
                    if line.startswith("data: "):
                        events.append(json.loads(line[6:]))
    assert {c["pid"] for c in calls(call_log)} == {a.pid}
    kinds = [e["type"] for e in events]
    assert kinds[0] == "run_started"
    assert kinds[-1] == "run_finished"
    assert events[-1]["output"] == 45
    finished = [e for e in events if e["type"] == "step_finished"]
    assert [e["step_id"] for e in finished] == [f"s{i}" for i in range(10)]
    # Steps that ended after b's client connected came live, over pub/sub from a.
    assert any(e["ts"] > connected for e in finished)


def test_resume_through_the_api_gives_a_partial_run_more_budget(
    redis_url: str, call_log: Path
) -> None:
    with runner(redis_url, call_log, max_runs=2) as r:
        body = {"chain": "ten", "input": {"seconds": 0.05}, "run_id": "short", "budget": "120ms"}
        assert r.post("/v1/runs", json=body).status_code == 202
        first = wait_final(r, "short")
        assert first["status"] == "partial"
        steps: list[dict[str, str]] = first["steps"]  # type: ignore[assignment]
        done_before = [s["id"] for s in steps if s["status"] == "completed"]
        answer = r.post("/v1/runs/short/resume", json={"budget": "30s"})
        assert answer.status_code == 202
        deadline = time.monotonic() + 60
        while (got := r.get("/v1/runs/short").json())["status"] != "completed":
            assert time.monotonic() < deadline, got
            time.sleep(0.05)
        assert got["output"] == 45
        assert (
            r.post("/v1/runs/short/resume", json={}).status_code == 409
        )  # completed: nothing left
    per_step = Counter(str(c["step"]) for c in calls(call_log) if c["run"] == "short")
    assert all(per_step[s] == 1 for s in done_before)  # recorded steps were not run again


@pytest.mark.slow
def test_sigterm_to_a_busy_runner_after_a_cancel_exits_within_its_drain(
    redis_url: str, call_log: Path
) -> None:
    r = runner(redis_url, call_log, max_runs=2, drain="1s").start()
    try:
        for i in range(6):  # two run (30 s naps), four wait in the queue
            body = {"chain": "nap", "input": {"seconds": 30, "label": f"n{i}"}, "run_id": f"n{i}"}
            assert r.post("/v1/runs", json=body).status_code == 202
        while len(calls(call_log)) < 2:
            time.sleep(0.01)
        cancelled = str(calls(call_log)[0]["run"])
        assert r.post(f"/v1/runs/{cancelled}/cancel").json()["status"] == "cancelled"
        while len(calls(call_log)) < 3:  # the freed slot took the next queued run
            time.sleep(0.01)
        stopped_at = time.monotonic()
        r.terminate()
        assert r.wait(timeout=30) == 0
        took = time.monotonic() - stopped_at
    finally:
        r.stop()
    # Drain 1 s; the rest is closing the store, the bus and the HTTP server. 5 s more leaves
    # room for a loaded 2-core machine; a runner whose take loop survives the drain never exits.
    assert took < 1.0 + 5.0
    runs = [str(c["run"]) for c in calls(call_log)]
    assert len(runs) == 3
    assert runs.count(cancelled) == 1
