"""Many runs waiting at once under ``chainrt serve``: they hold no runner slot and no key.

    .venv/bin/python bench/waits.py [--runs 1000] [--max-runs 4] [--clients 32] [--no-persistence]

A private redis-server, two ``chainrt serve`` runners with ``--max-runs`` slots each, and a chain
whose one chain-scoped concurrency key allows ``--max-runs`` holders: a lookup step, a ``wait``,
then a step that uses the payload. ``--runs`` runs are submitted; each parks at its wait. If a
parked run kept its runner slot or its key, at most ``2 x --max-runs`` runs could ever be
waiting and the rest would stay queued (or be rejected when the key cannot be had): the bench
checks that every run is ``waiting``, that the runners report no run in flight, and that no
holder of the key is left in Redis. Then every run is signalled (half through one runner, half
through the other) and the bench waits until all are ``completed``. Prints: the time to park all
runs, the runs in flight and key holders while they wait, and signal->completed latency
(p50/p99, from the client's clock at the signal to the run record's last update; one host, one
clock) and throughput of the continuations.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _redis import add_persistence_flag, persistence_label, private_server

from chainrt.testing.serve_process import ServeProcess

TOOLS = """
def lookup(n: int) -> dict:
    return {"n": n, "amount": 100 + n}


def act(order: dict, decision: dict) -> dict:
    return {"refunded": order["amount"] if decision["approved"] else 0}
"""

CHAIN = """
name: bench-wait
budget: 30s
inputs: {n: int}
concurrency:
  - {key: "bench-wait-global", limit: %d}
steps:
  - id: order
    tool: benchwaittools.py:lookup
    args: {n: "{{ input.n }}"}
  - id: approve
    weight: 0.1
    wait: {signal: ok, schema: {approved: bool}}
  - id: act
    tool: benchwaittools.py:act
    args: {order: "{{ steps.order.output }}", decision: "{{ steps.approve.output }}"}
"""


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _all(
    urls: list[str],
    runs: int,
    clients: int,
    fn: Callable[[httpx.AsyncClient, str, int], Awaitable[None]],
) -> None:
    ids = iter(range(runs))
    targets = itertools.cycle(urls)
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=clients)) as c:

        async def client() -> None:
            for n in ids:
                await fn(c, next(targets), n)

        await asyncio.gather(*(client() for _ in range(clients)))


async def _count(url: str, status: str) -> int:
    seen = 0
    cursor = None
    async with httpx.AsyncClient(timeout=60) as c:
        while True:
            params: dict[str, str | int] = {"status": status, "limit": 500}
            if cursor:
                params["cursor"] = cursor
            answer = await c.get(f"{url}/v1/runs", params=params)
            seen += len(answer.json())
            cursor = answer.headers.get("X-Next-Cursor")
            if not cursor:
                return seen


async def _drive(urls: list[str], redis_url: str, args: argparse.Namespace) -> None:
    import redis.asyncio as aioredis

    runs = args.runs

    async def submit(c: httpx.AsyncClient, url: str, n: int) -> None:
        body = {"chain": "bench-wait", "input": {"n": n}, "run_id": f"bw-{n}"}
        answer = await c.post(f"{url}/v1/runs", json=body)
        assert answer.status_code == 202, answer.text

    t0 = time.monotonic()
    await _all(urls, runs, args.clients, submit)
    while (waiting := await _count(urls[0], "waiting")) < runs:
        assert time.monotonic() - t0 < 600, f"only {waiting} of {runs} waiting after 600 s"
        await asyncio.sleep(0.2)
    parked_s = time.monotonic() - t0
    in_flight = []
    async with httpx.AsyncClient(timeout=30) as c:
        for url in urls:
            for line in (await c.get(f"{url}/metrics")).text.splitlines():
                if line.startswith("chainrt_runs_in_flight "):
                    in_flight.append(float(line.split()[1]))
    client = aioredis.from_url(redis_url)
    try:
        holders = 0
        # The limiter's holders of the run key (chainrt/redis/keys.py): none while the
        # runs wait (a held slot is a member with its lease's expiry).
        async for key in client.scan_iter(match="*{bench-wait-global}:holders"):
            holders += await client.zcard(key)
    finally:
        await client.aclose()
    print(
        f"parked: {runs} runs waiting after {parked_s:.1f} s "
        f"({runs / parked_s:.0f} runs/s submitted and parked); "
        f"runs in flight per runner {in_flight}; holders left on the run key: {holders}"
    )
    assert all(x == 0 for x in in_flight), in_flight
    assert holders == 0, holders

    sent: dict[str, float] = {}

    async def signal(c: httpx.AsyncClient, url: str, n: int) -> None:
        run_id = f"bw-{n}"
        sent[run_id] = time.time()
        body = {"name": "ok", "payload": {"approved": n % 2 == 0}}
        answer = await c.post(f"{url}/v1/runs/{run_id}/signal", json=body)
        assert answer.status_code == 202, answer.text
        assert answer.json()["queued"], answer.text

    t1 = time.monotonic()
    await _all(urls, runs, args.clients, signal)
    while (done := await _count(urls[0], "completed")) < runs:
        assert time.monotonic() - t1 < 600, f"only {done} of {runs} completed after 600 s"
        await asyncio.sleep(0.2)
    span = time.monotonic() - t1
    finals: dict[str, float] = {}
    cursor = None
    async with httpx.AsyncClient(timeout=60) as c:
        while True:
            params: dict[str, str | int] = {"status": "completed", "limit": 500}
            if cursor:
                params["cursor"] = cursor
            answer = await c.get(f"{urls[0]}/v1/runs", params=params)
            for run in answer.json():
                finals[run["run_id"]] = run["updated_at"]
            cursor = answer.headers.get("X-Next-Cursor")
            if not cursor:
                break
    latencies = [(finals[r] - sent[r]) * 1000 for r in sent if r in finals]
    print(
        f"continued: {runs} signals -> completed in {span:.1f} s ({runs / span:.0f} runs/s); "
        f"signal->completed p50 {_pct(latencies, 0.5):.0f} ms, p99 {_pct(latencies, 0.99):.0f} ms"
    )


def main() -> None:
    """Run the benchmark."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--max-runs", type=int, default=4)
    parser.add_argument("--clients", type=int, default=32)
    add_persistence_flag(parser)
    args = parser.parse_args()
    print(
        f"{args.runs} runs that wait, 2 runners with --max-runs {args.max_runs}, a chain key of "
        f"limit {args.max_runs}, {args.clients} clients, {os.cpu_count()} CPU cores; "
        f"Redis {persistence_label(args)}"
    )
    with tempfile.TemporaryDirectory() as folder:
        chains = Path(folder)
        (chains / "benchwaittools.py").write_text(TOOLS)
        (chains / "bench_wait.yaml").write_text(CHAIN % args.max_runs)
        with private_server(args) as redis:
            fleet = [
                ServeProcess(store=redis.url, chains=chains, max_runs=args.max_runs).start()
                for _ in range(2)
            ]
            try:
                asyncio.run(_drive([r.url for r in fleet], redis.url, args))
            finally:
                for runner in fleet:
                    runner.stop()


if __name__ == "__main__":
    main()
