"""Hedged attempts (``llm.hedge``) against one endpoint with hiccups: tail latency with and without.

    .venv/bin/python bench/hedge.py [--n 1000] [--after p95] [--slow-fraction 0.03]
        [--slow-ms 500] [--delay-ms 20] [--concurrency 4]

Two stub OpenAI servers (bench/_stub_openai.py, each in its own process) serve one pool model:
both answer after ``--delay-ms``; endpoint A makes a random ``--slow-fraction`` of its requests
wait ``--slow-ms`` instead. The dispatcher learns both endpoints' recent answer times from a
warm-up, then ``--n`` requests alternate between a plain step and a hedged one (``hedge:
{after: P}``), so that both modes see the same endpoints and the same load in the same run.

Printed per mode: p50 / p90 / p99 / max latency of the dispatch, how many hedges fired, and the
extra load — requests the endpoints received beyond one per request, as a share of the
requests (each hedge sends one; a hedge's loser is cancelled and the stub counts its client
leaving).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _workers import percentiles, stub_server  # noqa: E402

from chainrt.dispatch import Dispatcher, LlmCall, make_dispatcher, parse_pool_config  # noqa: E402
from chainrt.spec._hedge import PERCENTILES  # noqa: E402

WARMUP = 100


async def _stats(client: httpx.AsyncClient, url: str) -> dict[str, int]:
    response = await client.get(f"{url}/stats")
    return dict(response.json())


async def _bench(urls: list[str], args: argparse.Namespace) -> None:
    endpoints = ", ".join(f"{{url: '{u}'}}" for u in urls)
    pool = parse_pool_config(
        f"models:\n  primary:\n    served_model: stub\n    endpoints: [{endpoints}]\n"
        "latency_window: 100\n"
    )
    dispatcher: Dispatcher = make_dispatcher(pool)
    quantile = PERCENTILES.get(args.after)
    delay_ms = None if quantile is not None else float(args.after.removesuffix("ms"))

    def call(hedged: bool) -> LlmCall:
        return LlmCall(
            model="primary",
            messages=[("user", "Say OK")],
            max_tokens=1,
            run_id="bench",
            step_id="s",
            hedge_quantile=quantile if hedged else None,
            hedge_after_ms=delay_ms if hedged else None,
        )

    results: dict[bool, list[float]] = {False: [], True: []}
    hedges = {False: 0, True: 0}
    failures = {False: 0, True: 0}

    async def one(hedged: bool) -> None:
        started = time.perf_counter()
        try:
            answer = await dispatcher.complete(call(hedged), time.time() + 10)
        except Exception:  # a failure is counted, and its time kept: it is the tail too
            failures[hedged] += 1
            results[hedged].append((time.perf_counter() - started) * 1000)
            return
        results[hedged].append((time.perf_counter() - started) * 1000)
        if any(record.hedge is not None for record in answer.attempts):
            hedges[hedged] += 1

    async def runner(offset: int, count: int) -> None:
        for i in range(count):
            await one((i + offset) % 2 == 1)

    client = httpx.AsyncClient(timeout=10)
    try:
        for _ in range(WARMUP):
            await dispatcher.complete(call(False), time.time() + 10)
        before = [await _stats(client, u) for u in urls]
        per = args.n // args.concurrency
        await asyncio.gather(*(runner(k, per) for k in range(args.concurrency)))
        await asyncio.sleep(0.2)  # the last losers' disconnects reach the stubs
        after = [await _stats(client, u) for u in urls]
    finally:
        await client.aclose()
        await dispatcher.close()
    sent = sum(len(v) for v in results.values())
    received = sum(a["started"] - b["started"] for a, b in zip(after, before, strict=True))
    dropped = sum(a["disconnected"] - b["disconnected"] for a, b in zip(after, before, strict=True))
    print(
        f"endpoints        A: {args.delay_ms:g} ms, {args.slow_fraction:.0%} of requests "
        f"{args.slow_ms:g} ms; B: {args.delay_ms:g} ms   (latency_window 100)"
    )
    print(f"requests         {sent} ({args.concurrency} at a time), plain and hedged alternating")
    for hedged in (False, True):
        ms = results[hedged]
        name = f"hedge after {args.after}" if hedged else "no hedge        "
        print(
            f"{name}  {percentiles(ms, 'p50', 'p90', 'p99', 'max', width=7, digits=1)}   "
            f"hedges {hedges[hedged]} ({hedges[hedged] / len(ms):.1%})   "
            f"failed {failures[hedged]}"
        )
    hedged_n = len(results[True])
    print(
        f"extra load       {received - sent} requests beyond one per request "
        f"({(received - sent) / hedged_n:.1%} of the hedged requests, "
        f"{(received - sent) / sent:.1%} of all); {dropped} losers seen leaving by the stubs"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=1000, help="requests in all (half hedged)")
    parser.add_argument("--after", default="p95", help="p50|p90|p95|p99 or e.g. 100ms")
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--slow-ms", type=float, default=500.0)
    parser.add_argument("--slow-fraction", type=float, default=0.03)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    if args.after not in PERCENTILES and not args.after.endswith("ms"):
        parser.error("--after must be p50, p90, p95, p99 or a number of ms such as 100ms")
    slow = [
        f"--delay-ms={args.delay_ms}",
        f"--slow-ms={args.slow_ms}",
        f"--slow-fraction={args.slow_fraction}",
    ]
    with stub_server(*slow) as a, stub_server(f"--delay-ms={args.delay_ms}") as b:
        asyncio.run(_bench([a, b], args))


if __name__ == "__main__":
    main()
