"""Throughput of ``chainrt serve`` through its HTTP API, with 1 and with N runners.

    .venv/bin/python bench/serve_throughput.py [--runs 300] [--runners 1 3] [--clients 32]

For each fleet size: a private redis-server, that many ``chainrt serve`` processes, and
``--clients`` concurrent HTTP clients submitting ``--runs`` runs of a 5-step no-op chain (spread
over the runners). Prints runs/s (first submit to last final) and the p50/p99 latency from submit
(the client's clock) to final (the run record's last update; same host, same clock). This machine
may have few cores: N runners on 2 cores cannot be N times faster, and the ratio is printed as
measured. ``--with-reuse`` also runs ``bench/runtime_reuse.py`` (Runtime.run against the
open-per-run path of chain.arun before) in the same process.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chainrt.testing.redis_server import RedisServer
from chainrt.testing.serve_process import ServeProcess

CHAINS = Path(__file__).resolve().parent.parent / "tests" / "data" / "serve"


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _drive(urls: list[str], runs: int, clients: int) -> tuple[float, list[float]]:
    ids = iter(range(runs))
    submitted: dict[str, float] = {}
    finals: dict[str, float] = {}
    targets = itertools.cycle(urls)

    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=clients)) as c:

        async def client() -> None:
            for n in ids:
                run_id = f"tp-{n}"
                url = next(targets)
                t = time.time()
                body = {"chain": "five", "input": {}, "run_id": run_id}
                answer = await c.post(f"{url}/v1/runs", json=body)
                assert answer.status_code == 202, answer.text
                submitted[run_id] = t
                while True:
                    got = (await c.get(f"{url}/v1/runs/{run_id}", params={"wait": "30s"})).json()
                    if got["status"] not in ("queued", "running"):
                        break
                assert got["status"] == "completed", got

        started = time.time()
        await asyncio.gather(*(client() for _ in range(clients)))
        # The final time of each run is its record's last update (read after the fact).
        listed = await c.get(f"{urls[0]}/v1/runs", params={"limit": 1000})
        for run in listed.json():
            finals[run["run_id"]] = run["updated_at"]
    latencies = [(finals[r] - submitted[r]) * 1000 for r in submitted if r in finals]
    span = max(finals.values()) - started
    return runs / span, latencies


def main() -> None:
    """Run the benchmark for each fleet size."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--runners", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--max-runs", type=int, default=32)
    parser.add_argument("--with-reuse", action="store_true")
    args = parser.parse_args()
    print(
        f"{args.runs} runs of a 5-step no-op chain, {args.clients} concurrent clients, "
        f"--max-runs {args.max_runs}, {os.cpu_count()} CPU cores"
    )
    rates: dict[int, float] = {}
    for n in args.runners:
        with RedisServer() as redis:
            fleet = [
                ServeProcess(store=redis.url, chains=CHAINS, max_runs=args.max_runs).start()
                for _ in range(n)
            ]
            try:
                rate, lat = asyncio.run(_drive([r.url for r in fleet], args.runs, args.clients))
            finally:
                for r in fleet:
                    r.stop()
        rates[n] = rate
        print(
            f"{n} runner(s): {rate:7.1f} runs/s   submit->final p50 {_pct(lat, 0.5):7.1f} ms"
            f"   p99 {_pct(lat, 0.99):7.1f} ms"
        )
    if len(rates) > 1:
        base = rates[min(rates)]
        for n, rate in sorted(rates.items()):
            print(f"  {n} runner(s) / {min(rates)}: {rate / base:.2f}x")
    if args.with_reuse:
        import runtime_reuse

        sys.argv = [sys.argv[0]]
        runtime_reuse.main()


if __name__ == "__main__":
    main()
