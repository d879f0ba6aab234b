"""Fleet drill: runners killed with kill -9 while they work; every run must still finish right.

    .venv/bin/python bench/fleet.py [--runs 500] [--runners 3] [--kill-every 2] [--steps-ms 20]

Starts a private redis-server and ``--runners`` ``chainrt serve`` processes, submits ``--runs``
runs of a 10-step chain (each step sleeps ``--steps-ms`` and adds its index: the right output is
45) over HTTP, and every ``--kill-every`` seconds kills one runner with SIGKILL and starts it
again. Then it checks every run: completed with output 45; each step ran once, except the step in
flight at a kill, which may run once more (0 recorded steps re-run); no run left for a person.
It prints the time from each kill to the takeover of the killed runner's runs (the next step of
such a run starting on another process) as p50/max, and the submit-to-final latency.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chainrt.testing.redis_server import RedisServer
from chainrt.testing.serve_process import ServeProcess

CHAINS = Path(__file__).resolve().parent.parent / "tests" / "data" / "serve"


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _submit_all(runners: list[ServeProcess], ids: list[str], seconds: float) -> dict[str, float]:
    submitted: dict[str, float] = {}
    with httpx.Client(timeout=30) as client:
        for n, run_id in enumerate(ids):
            body = {"chain": "ten", "input": {"seconds": seconds}, "run_id": run_id}
            for attempt in range(len(runners) * 3):  # a runner may be down right now
                target = runners[(n + attempt) % len(runners)]
                try:
                    answer = client.post(f"{target.url}/v1/runs", json=body)
                except httpx.HTTPError:
                    continue
                if answer.status_code in (200, 202):
                    submitted[run_id] = time.time()
                    break
            else:
                raise SystemExit(f"could not submit {run_id}")
    return submitted


def _final(runners: list[ServeProcess], run_id: str, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for r in runners:
            try:
                got = r.get(f"/v1/runs/{run_id}", params={"wait": "5s"}).json()
            except (httpx.HTTPError, ValueError):
                continue
            if got.get("status") not in ("queued", "running"):
                return dict(got)
            break
    return {"status": "not final", "run_id": run_id}


def main() -> None:
    """Run the drill and print its figures."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--runners", type=int, default=3)
    parser.add_argument("--kill-every", type=float, default=2.0)
    parser.add_argument("--steps-ms", type=float, default=20.0)
    parser.add_argument("--max-runs", type=int, default=16)
    parser.add_argument("--lease-ttl", type=float, default=10.0)
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="chainrt-fleet-"))
    log_path = tmp / "calls.jsonl"
    env = {"CHAINRT_TEST_LOG": str(log_path), "CHAINRT_LEASE_TTL_S": str(args.lease_ttl)}
    kills: list[tuple[float, int]] = []
    with RedisServer() as redis:
        runners = [
            ServeProcess(store=redis.url, chains=CHAINS, max_runs=args.max_runs, env=env).start()
            for _ in range(args.runners)
        ]
        stop = threading.Event()

        def killer() -> None:
            n = 0
            while not stop.wait(args.kill_every):
                victim = runners[n % len(runners)]
                n += 1
                if victim.process is None or victim.process.poll() is not None:
                    continue
                pid = victim.pid
                victim.kill()
                kills.append((time.time(), pid))
                victim.start()

        ids = [f"fleet-{i}" for i in range(args.runs)]
        started = time.time()
        thread = threading.Thread(target=killer, daemon=True)
        thread.start()
        try:
            submitted = _submit_all(runners, ids, args.steps_ms / 1000)
            results = {run_id: _final(runners, run_id, 300) for run_id in ids}
        finally:
            stop.set()
            thread.join()
            for r in runners:
                r.stop()
        took = time.time() - started

    log = [json.loads(line) for line in log_path.read_text().splitlines()]
    per_step = Counter((c["run"], c["step"]) for c in log)
    again = {key: n for key, n in per_step.items() if n > 1}
    killed_pids = {pid for _, pid in kills}
    # A repeat is the in-flight step of a kill when its first call ran in a killed process and
    # it ran exactly once more; anything else is a recorded step run again.
    first_call: dict[tuple[str, str], dict[str, Any]] = {}
    for c in log:
        first_call.setdefault((c["run"], c["step"]), c)
    recorded_rerun = [
        key for key, n in again.items() if n > 2 or first_call[key]["pid"] not in killed_pids
    ]
    wrong = {rid: (r.get("status"), r.get("output")) for rid, r in results.items()}
    wrong = {rid: v for rid, v in wrong.items() if v != ("completed", 45)}

    by_pid_run: dict[int, set[str]] = defaultdict(set)
    for c in log:
        by_pid_run[c["pid"]].add(c["run"])
    takeovers: list[float] = []
    for killed_at, pid in kills:
        for run in by_pid_run.get(pid, set()):
            before = [c for c in log if c["run"] == run and c["pid"] == pid and c["t"] <= killed_at]
            if not before:
                continue
            last_here = max(c["t"] for c in before)
            after = [c["t"] for c in log if c["run"] == run and c["t"] > killed_at]
            steps_done = {c["step"] for c in log if c["run"] == run and c["t"] <= killed_at}
            if after and len(steps_done) < 10 and last_here > killed_at - 5:
                takeovers.append(min(after) - killed_at)
    latencies = [
        float(results[rid].get("budget", {}).get("used_ms", 0)) for rid in ids if rid in results
    ]
    print(
        f"runners {args.runners}, runs {args.runs} x 10 steps of {args.steps_ms:g} ms, "
        f"kill -9 every {args.kill_every:g}s, lease TTL {args.lease_ttl:g}s"
    )
    print(f"wall time             {took:.1f} s   ({len(kills)} kills)")
    print(f"completed right       {args.runs - len(wrong)} / {args.runs}")
    if wrong:
        print(f"  wrong or unfinished: {dict(list(wrong.items())[:5])}")
    print(f"steps run             {len(log)} calls for {len(per_step)} steps")
    print(f"in-flight steps again {len(again) - len(recorded_rerun)}  (allowed: at most once more)")
    print(f"recorded steps re-run {len(recorded_rerun)}")
    print(f"runs needing a person {sum(1 for r in results.values() if r['status'] == 'not final')}")
    if takeovers:
        print(
            f"kill -> takeover      p50 {statistics.median(takeovers):.2f} s   "
            f"max {max(takeovers):.2f} s   ({len(takeovers)} runs taken over)"
        )
    print(
        f"budget used per run   p50 {_pct(latencies, 0.5):.0f} ms   p99 {_pct(latencies, 0.99):.0f} ms"
    )
    first_submit = min(submitted.values())
    print(f"submit span           {max(submitted.values()) - first_submit:.1f} s")


if __name__ == "__main__":
    main()
