"""A runner-like OS process that takes a concurrency key (for the multiprocess tests).

Usage: ``python limiter_worker.py MODE --url URL --key KEY [options]``

``URL`` is a Redis URL, or a ``sqlite:///`` file (the embedded store's limiter, which must hold
across processes too); with SQLite the start signal is a file (``--start-file``) and the
``wait`` mode is not available.

Modes:
  contend  wait for the start signal, then N times: acquire, note (enter, exit) of the hold, release
  hold     acquire, print ``held``, then hold until killed
  wait     acquire (long timeout), RPUSH --name onto --order-list, hold 20 ms, release
  rate     wait for the start signal, then acquire + release as fast as allowed for --seconds

Timestamps are ``time.monotonic()`` (CLOCK_MONOTONIC: one clock for every process of the host),
written one JSON object per line to --out. Nothing here trusts the limiter's own counters.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import redis.asyncio as aredis

from chainrt._errors import ConcurrencyRejected
from chainrt.concurrency import KeyRequest, Limiter, RedisLimiter, open_limiter

START_LIST = "test:limiter:start"
"""Redis list the test pushes one token per worker onto: the start signal."""


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["contend", "hold", "wait", "rate"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--limit", type=int, default=1)
    parser.add_argument("--ttl", type=float, default=10.0)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--hold-ms", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=None)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--name", default="worker")
    parser.add_argument("--order-list", default="test:limiter:order")
    parser.add_argument("--out", default=None)
    parser.add_argument("--start-file", default=None, help="SQLite: start once this file exists")
    return parser.parse_args(argv)


async def _start_signal(client: aredis.Redis | None, start_file: str | None) -> None:
    print("ready", flush=True)
    if client is not None:
        await client.blpop([START_LIST], timeout=60)
        return
    assert start_file is not None, "--start-file is needed without Redis"
    deadline = time.monotonic() + 60
    while not Path(start_file).exists():
        assert time.monotonic() < deadline, "no start signal"
        await asyncio.sleep(0.005)


async def main(args: argparse.Namespace) -> None:
    sqlite = args.url.startswith("sqlite:")
    limiter: Limiter = (
        open_limiter(args.url, lease_ttl_s=args.ttl)
        if sqlite
        else RedisLimiter.from_url(args.url, lease_ttl_s=args.ttl)
    )
    client = None if sqlite else aredis.Redis.from_url(args.url)
    request = KeyRequest(args.key, args.limit, rate_per_s=args.rate)
    holder = f"{args.name}:run"
    lines: list[str] = []
    try:
        if args.mode == "hold":
            await limiter.acquire([request], timeout_s=30, holder=holder)
            print("held", flush=True)
            await asyncio.sleep(3600)
        elif args.mode == "wait":
            assert client is not None, "wait needs Redis"
            print("waiting", flush=True)
            async with await limiter.acquire([request], timeout_s=60, holder=holder):
                await client.rpush(args.order_list, args.name)
                await asyncio.sleep(0.02)
        elif args.mode == "contend":
            await _start_signal(client, args.start_file)
            for _ in range(args.iterations):
                async with await limiter.acquire([request], timeout_s=60, holder=holder):
                    enter = time.monotonic()
                    await asyncio.sleep(args.hold_ms / 1000)
                    lines.append(json.dumps({"enter": enter, "exit": time.monotonic()}))
        else:  # rate
            await _start_signal(client, args.start_file)
            stop = time.monotonic() + args.seconds
            while time.monotonic() < stop:
                try:
                    holding = await limiter.acquire([request], timeout_s=2.0, holder=holder)
                except ConcurrencyRejected:
                    continue
                lines.append(json.dumps({"grant": time.monotonic()}))
                await holding.release()
    finally:
        await limiter.close()
        if client is not None:
            await client.aclose()
    if args.out:
        with open(args.out, "w", encoding="utf-8") as out:
            out.write("".join(line + "\n" for line in lines))


if __name__ == "__main__":
    asyncio.run(main(_parse(sys.argv[1:])))
