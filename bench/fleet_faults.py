"""Fleet fault drill: Redis faults, a killed runner and poison while runs are submitted.

    .venv/bin/python bench/fleet_faults.py [--runs 1000] [--runners 3] [--steps-ms 10]
        [--client-kill-every 5] [--restart-at 12] [--kill-at 20] [--poison 60] [--lease-ttl 3]

Starts a private redis-server with its append-only file fsynced on every write (a restart keeps
what Redis acknowledged) and ``--runners`` ``chainrt serve`` processes, then submits ``--runs``
runs of a 10-step chain (the right output is 45) over HTTP while a drill thread

- runs ``CLIENT KILL TYPE normal`` every ``--client-kill-every`` seconds,
- restarts Redis once (``kill -9`` and start on the same port) at ``--restart-at`` s,
- kills one runner with ``kill -9`` at ``--kill-at`` s (started again 1 s later),
- sends ``--poison`` submits whose input is nested 200 levels deep (the API refuses them with 422
  or takes them; either way the queue must stay healthy), and writes as many poison entries
  (a run record that cannot be read back) straight into Redis.

Then it checks that every run reached a final status with the right output, counts recorded
steps run again (0 expected), the dead letters, and prints for each fault the time until the
fleet takes runs again: the first run started (its first step called) after the fault, counted
from the moment Redis answers again for the restart. For the killed runner: the time from the
kill to the first step of one of its runs on another runner (goal: lease TTL + 2 s).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import httpx
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chainrt.redis.keys import StoreKeys
from chainrt.serve._queue import stream_key
from chainrt.testing.redis_server import RedisServer
from chainrt.testing.serve_process import ServeProcess

CHAINS = Path(__file__).resolve().parent.parent / "tests" / "data" / "serve"


def _post(runners: list[ServeProcess], body: dict[str, Any], n: int) -> int:
    """POST a run, trying the runners in turn while some are down or Redis is away; the
    status of the answer taken (0 if none answered)."""
    deadline = time.monotonic() + 120
    attempt = 0
    while time.monotonic() < deadline:
        target = runners[(n + attempt) % len(runners)]
        attempt += 1
        try:
            answer = httpx.post(f"{target.url}/v1/runs", json=body, timeout=30)
        except httpx.HTTPError:
            time.sleep(0.1)
            continue
        if answer.status_code in (200, 202, 422):
            return answer.status_code
        time.sleep(0.1)  # 503 while Redis restarts: again
    return 0


def _final(runners: list[ServeProcess], run_id: str, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for r in runners:
            try:
                got = r.get(f"/v1/runs/{run_id}", params={"wait": "5s"}).json()
            except (httpx.HTTPError, ValueError):
                continue
            if got.get("status") not in ("queued", "running", None):
                return dict(got)
            break
    return {"status": "not final", "run_id": run_id}


def _nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = {"a": value}
    return value


def main() -> None:
    """Run the drill and print its figures."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--runners", type=int, default=3)
    parser.add_argument("--steps-ms", type=float, default=10.0)
    parser.add_argument("--max-runs", type=int, default=16)
    parser.add_argument("--client-kill-every", type=float, default=5.0)
    parser.add_argument("--restart-at", type=float, default=12.0)
    parser.add_argument("--kill-at", type=float, default=20.0)
    parser.add_argument("--poison", type=int, default=60)
    parser.add_argument("--lease-ttl", type=float, default=3.0)
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="chainrt-faults-"))
    log_path = tmp / "calls.jsonl"
    env = {"CHAINRT_TEST_LOG": str(log_path), "CHAINRT_LEASE_TTL_S": str(args.lease_ttl)}
    faults: list[tuple[str, float]] = []  # (what, when the fleet could work again)
    killed: list[tuple[float, int]] = []
    poison_answers: Counter[int] = Counter()
    with RedisServer(durable=True) as server:
        runners = [
            ServeProcess(store=server.url, chains=CHAINS, max_runs=args.max_runs, env=env).start()
            for _ in range(args.runners)
        ]
        stop = threading.Event()
        t0 = time.time()

        def drill() -> None:
            next_kill = args.client_kill_every
            restarted = victim_killed = False
            while not stop.wait(0.05):
                now = time.time() - t0
                if now >= next_kill:
                    next_kill += args.client_kill_every
                    try:
                        client = redis.Redis.from_url(server.url)
                        client.client_kill_filter(_type="normal", skipme=True)
                        client.close()
                        faults.append(("CLIENT KILL", time.time()))
                    except redis.RedisError:
                        pass
                if not restarted and now >= args.restart_at:
                    restarted = True
                    server.kill()
                    time.sleep(0.5)
                    server.start()
                    faults.append(("Redis restart (AOF)", time.time()))  # answers again now
                if not victim_killed and now >= args.kill_at:
                    victim_killed = True
                    victim = runners[-1]
                    pid = victim.pid
                    victim.kill()
                    killed.append((time.time(), pid))
                    faults.append(("kill -9 runner", time.time()))
                    time.sleep(1.0)
                    victim.start()

        def poison() -> None:
            time.sleep(2.0)
            client = redis.Redis.from_url(server.url)
            for i in range(args.poison):
                body = {"chain": "ten", "input": {"seconds": _nested(200)}, "priority": "critical"}
                poison_answers[_post(runners, body, i)] += 1
                run_id = f"poison-{i}"
                try:
                    client.hset(
                        StoreKeys().run(run_id),
                        mapping={"record": "{", "status": "queued", "token": "0"},
                    )
                    client.xadd(stream_key("critical", chain="ten"), {"run_id": run_id})
                except redis.RedisError:
                    pass
            client.close()

        threads = [threading.Thread(target=f, daemon=True) for f in (drill, poison)]
        for thread in threads:
            thread.start()
        ids = [f"faults-{i}" for i in range(args.runs)]
        try:
            for n, run_id in enumerate(ids):
                body = {
                    "chain": "ten",
                    "input": {"seconds": args.steps_ms / 1000},
                    "run_id": run_id,
                }
                if _post(runners, body, n) == 0:
                    raise SystemExit(f"could not submit {run_id}")
            results = {run_id: _final(runners, run_id, 300) for run_id in ids}
            dead = httpx.get(f"{runners[0].url}/v1/dlq", params={"limit": 1000}, timeout=30).json()
        finally:
            stop.set()
            for thread in threads:
                thread.join()
            for r in runners:
                r.stop()
        took = time.time() - t0

    log = [json.loads(line) for line in log_path.read_text().splitlines()]
    per_step = Counter((c["run"], c["step"]) for c in log)
    killed_pids = {pid for _, pid in killed}
    first_call: dict[tuple[str, str], dict[str, Any]] = {}
    for c in log:
        first_call.setdefault((c["run"], c["step"]), c)
    # Steps are recorded before the next one starts, so a step run twice is a recorded step run
    # again, unless it was the step in flight in a killed runner (at most once more), or in
    # flight when Redis was killed (its record may not have been written).
    recorded_rerun = [
        key
        for key, n in per_step.items()
        if n > 2 or (n == 2 and first_call[key]["pid"] not in killed_pids)
    ]
    wrong = {rid: (r.get("status"), r.get("output")) for rid, r in results.items()}
    wrong = {rid: v for rid, v in wrong.items() if v != ("completed", 45)}
    starts = sorted(c["t"] for c in log if c["step"] == "s0")

    print(
        f"runners {args.runners}, runs {args.runs} x 10 steps of {args.steps_ms:g} ms, "
        f"CLIENT KILL every {args.client_kill_every:g}s, Redis restart at {args.restart_at:g}s, "
        f"kill -9 at {args.kill_at:g}s, {args.poison} poison submits + entries, "
        f"lease TTL {args.lease_ttl:g}s"
    )
    print(f"wall time               {took:.1f} s")
    print(
        f"final status            {sum(1 for r in results.values() if r['status'] != 'not final')} / {args.runs}"
    )
    print(f"completed right         {args.runs - len(wrong)} / {args.runs}")
    if wrong:
        print(f"  wrong or unfinished:  {dict(list(wrong.items())[:5])}")
    print(f"recorded steps re-run   {len(recorded_rerun)}  {recorded_rerun[:5]}")
    print(f"poison submits answered {dict(poison_answers)}")
    print(f"dead letters            {len(dead)}")
    last_start = starts[-1] if starts else t0
    gaps = []
    for what, at in faults:
        if at > last_start:
            continue  # every run had started: nothing left to show the fleet taking runs
        after = [t for t in starts if t > at]
        gaps.append(after[0] - at)
        print(f"{what:<24}at {at - t0:5.1f} s: next run started {after[0] - at:.2f} s later")
    if gaps:
        print(f"fault -> taking runs    max {max(gaps):.2f} s over {len(gaps)} faults (goal 2 s)")
    by_pid_run: dict[int, set[str]] = defaultdict(set)
    for c in log:
        by_pid_run[c["pid"]].add(c["run"])
    for killed_at, pid in killed:
        resumed = [
            min((c["t"] for c in log if c["run"] == run and c["t"] > killed_at), default=None)
            for run in by_pid_run.get(pid, set())
            if per_step_count(log, run, killed_at) < 10
        ]
        times = sorted(t - killed_at for t in resumed if t is not None)
        if times:
            print(
                f"orphans of the killed runner resumed after p50 {times[len(times) // 2]:.2f} s, "
                f"max {times[-1]:.2f} s ({len(times)} runs; goal lease TTL + 2 s = "
                f"{args.lease_ttl + 2:g} s)"
            )


def per_step_count(log: list[dict[str, Any]], run: str, before: float) -> int:
    """Steps of ``run`` called before ``before``."""
    return len({c["step"] for c in log if c["run"] == run and c["t"] <= before})


if __name__ == "__main__":
    main()
