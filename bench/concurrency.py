"""Throughput of concurrency keys: acquire + release pairs per second, next to raw EVALSHA.

Usage::

    python bench/concurrency.py [--redis redis://host:port/db] [--seconds 2] [--no-persistence]
    python bench/concurrency.py --sqlite [--processes 4] [--seconds 2]

Without ``--redis`` a private redis-server is started (AOF with fsync every second, as
docker-compose runs it; ``--no-persistence`` turns that off). For 1 key
and for 100 keys, at 1, 8 and 64 concurrent tasks of one process, it prints the pairs/s of the
Redis limiter (uncontended: limit far above the task count, so every acquire takes the one-call
fast path), the same for the in-process limiter, one contended line (1 key, limit 1: hand-over
from holder to waiter), and a raw ``EVALSHA`` of a one-line script measured in the same run, plus
the limiter's two scripts called bare (what separates script cost from limiter code).
``x raw`` is (raw round trips/s) / (pairs/s): 2.0 means a pair costs exactly two round trips.
The ``as the runner`` lines give the keys back as the runner gives back a step's keys
(``Holding.release_unconfirmed``: the release is sent and not waited for; the next acquire goes
out behind it on the same connection), the others await each release.
The machine running it is often shared: every case runs ``--rounds`` interleaved rounds and the
best round is shown (best-of-N, said in the output): it estimates what the code can do, not what
a busy machine gives.

``--sqlite`` measures the embedded store's limiter instead (no Redis): pairs/s of
:class:`SQLiteLimiter` on a temporary file at 1, 8 and 64 tasks next to the in-process limiter,
then ``--processes`` OS processes doing pairs on one key of the same file at once (their pairs
summed over the common window), uncontended and with limit 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator

import redis.asyncio as aredis
from _redis import add_persistence_flag, persistence_label, private_server

from chainrt.concurrency import KeyRequest, Limiter, LocalLimiter, RedisLimiter, SQLiteLimiter
from chainrt.concurrency._redis import _SHA, _Call
from chainrt.redis.keys import LIMITER_PREFIX

TASKS = (1, 8, 64)
RAW = "raw EVALSHA round trip ('return 1')"
BIG_LIMIT = 1_000_000
RUNNER_1 = "redis, as the runner releases, 1 key"
RUNNER_100 = "redis, as the runner releases, 100 keys"
RUNNER_LIMIT_1 = "redis, as the runner, 1 key, limit 1"
Op = Callable[[int, int], Awaitable[None]]
"""One operation of task ``t`` at iteration ``i``."""


async def _rate(op: Op, tasks: int, seconds: float) -> float:
    """Operations per second of ``tasks`` tasks running ``op`` in a loop for ``seconds``."""
    stop = 0.0
    counts = [0] * tasks

    async def worker(t: int) -> None:
        i = 0
        while time.perf_counter() < stop:
            await op(t, i)
            i += 1
        counts[t] = i

    stop = time.perf_counter() + min(0.3, seconds / 4)  # warm-up: connections, script cache
    await asyncio.gather(*(worker(t) for t in range(tasks)))
    start = time.perf_counter()
    stop = start + seconds
    await asyncio.gather(*(worker(t) for t in range(tasks)))
    return sum(counts) / (time.perf_counter() - start)


def _pairs(limiter: Limiter, nkeys: int, limit: int = BIG_LIMIT, *, runner: bool = False) -> Op:
    """Acquire + release; ``runner``: released as the runner gives back a step's keys
    (``release_unconfirmed``: not waiting for Redis to confirm it), else awaited."""
    requests = [[KeyRequest(f"bench:{k}", limit)] for k in range(nkeys)]

    async def op(t: int, i: int) -> None:
        holding = await limiter.acquire(requests[(t + i) % nkeys], timeout_s=30, holder=f"t{t}")
        await holding.release()

    async def runner_op(t: int, i: int) -> None:
        holding = await limiter.acquire(requests[(t + i) % nkeys], timeout_s=30, holder=f"t{t}")
        await holding.release_unconfirmed()

    return runner_op if runner else op


def _row(case: str, tasks: int, rate: float, raw: float | None = None) -> None:
    extra = f"{raw / rate:8.2f}" if raw else ""
    print(f"{case:<40} {tasks:>5} {rate:>11,.0f} {1e6 / rate:>9.1f} {extra}")


@contextlib.contextmanager
def _server(args: argparse.Namespace) -> Iterator[str]:
    if args.redis:
        print(f"redis at {args.redis} (persistence as that server is configured)")
        yield args.redis
        return
    print(f"private redis-server, {persistence_label(args)}")
    with private_server(args) as server:
        yield server.url


async def bench(url: str, seconds: float, rounds: int) -> None:
    # The same client settings as RedisLimiter.from_url, so that "raw" is the same road.
    client = aredis.Redis.from_url(url, socket_timeout=None)
    info = await client.info("server")
    print(
        f"redis {info['redis_version']} at {url}; one process; best of {rounds} rounds of "
        f"{seconds:g} s per case, cases interleaved"
    )
    sha = await client.script_load("return 1")

    async def raw_op(t: int, i: int) -> None:
        await client.evalsha(sha, 1, "bench:raw")

    # The limiter's two scripts called bare (no limiter code around them): what the Python of
    # the limiter adds is the difference between this line and the limiter's.
    try_forget = _Call.build(KeyRequest("bench:bare", BIG_LIMIT), LIMITER_PREFIX, 10_000.0, "x:")

    async def scripts_op(t: int, i: int) -> None:
        member = f"bench:{t}:{i}".encode()
        await client.evalsha(_SHA["TRY"], 5, *try_forget.try_keys, member, *try_forget.try_args)
        await client.evalsha(
            _SHA["FORGET"], 4, *try_forget.forget_keys, member, b"0", *try_forget.forget_args
        )

    redis_limiter = RedisLimiter.from_url(url)
    await (await redis_limiter.acquire([KeyRequest("warm", 1)], timeout_s=1, holder="w")).release()
    local = LocalLimiter()
    cases: dict[str, Callable[[], Op]] = {
        RAW: lambda: raw_op,
        "redis TRY+FORGET scripts alone, 1 key": lambda: scripts_op,
        "redis limiter pairs, 1 key": lambda: _pairs(redis_limiter, 1),
        "redis limiter pairs, 100 keys": lambda: _pairs(redis_limiter, 100),
        "redis limiter pairs, 1 key, limit 1": lambda: _pairs(redis_limiter, 1, limit=1),
        RUNNER_1: lambda: _pairs(redis_limiter, 1, runner=True),
        RUNNER_100: lambda: _pairs(redis_limiter, 100, runner=True),
        RUNNER_LIMIT_1: lambda: _pairs(redis_limiter, 1, limit=1, runner=True),
        "local limiter pairs, 1 key": lambda: _pairs(local, 1),
        "local limiter pairs, 100 keys": lambda: _pairs(local, 100),
        "local limiter pairs, 1 key, limit 1": lambda: _pairs(local, 1, limit=1),
    }
    best: dict[tuple[str, int], float] = {}
    for n in TASKS:
        for _ in range(rounds):  # interleaved, so a burst of load elsewhere hits every case
            for case, make in cases.items():
                if n == 1 and "limit 1" in case:
                    continue  # one task never contends
                rate = await _rate(make(), n, seconds)
                best[case, n] = max(best.get((case, n), 0.0), rate)
    print(f"{'case':<40} {'tasks':>5} {'ops/s':>11} {'us/op':>9} {'x raw':>8}")
    for case in cases:
        for n in TASKS:
            if (case, n) in best:
                raw = best[RAW, n] if case.startswith("redis") else None
                _row(case, n, best[case, n], raw)
    await redis_limiter.close()
    await client.aclose()


async def bench_sqlite(seconds: float, rounds: int, processes: int) -> None:
    """Pairs/s of the SQLite limiter: one process, then ``processes`` processes on one file."""
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/bench.db"
        sqlite = SQLiteLimiter(path)
        local = LocalLimiter()
        print(
            f"SQLite limiter on {path} (WAL, synchronous=NORMAL); best of {rounds} rounds of "
            f"{seconds:g} s per case, cases interleaved"
        )
        cases: dict[str, Callable[[], Op]] = {
            "sqlite limiter pairs, 1 key": lambda: _pairs(sqlite, 1),
            "sqlite limiter pairs, 100 keys": lambda: _pairs(sqlite, 100),
            "sqlite limiter pairs, 1 key, limit 1": lambda: _pairs(sqlite, 1, limit=1),
            "local limiter pairs, 1 key": lambda: _pairs(local, 1),
        }
        best: dict[tuple[str, int], float] = {}
        for n in TASKS:
            for _ in range(rounds):
                for case, make in cases.items():
                    if n == 1 and "limit 1" in case:
                        continue
                    rate = await _rate(make(), n, seconds)
                    best[case, n] = max(best.get((case, n), 0.0), rate)
        await sqlite.close()
        print(f"{'case':<40} {'tasks':>5} {'ops/s':>11} {'us/op':>9}")
        for case in cases:
            for n in TASKS:
                if (case, n) in best:
                    _row(case, n, best[case, n])
        for limit in (BIG_LIMIT, 1):
            total = _across_processes(path, processes, seconds, limit)
            what = "limit 1" if limit == 1 else "uncontended"
            _row(f"sqlite, {processes} processes x 1 task, {what}", processes, total)


def _across_processes(path: str, processes: int, seconds: float, limit: int) -> float:
    """Pairs/s summed over ``processes`` child processes sharing one key of ``path``."""
    start_at = time.time() + 3.0  # every child is up and warm before the common window opens
    argv = [sys.executable, __file__, "--sqlite-child", path, "--seconds", str(seconds),
            "--start-at", str(start_at), "--limit", str(limit)]  # fmt: skip
    children = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) for _ in range(processes)]
    pairs = 0
    for child in children:
        out, _ = child.communicate(timeout=seconds + 120)
        if child.returncode != 0:
            raise SystemExit(f"a bench child failed (exit {child.returncode})")
        pairs += int(out.strip())
    return pairs / seconds


async def _child(path: str, seconds: float, start_at: float, limit: int) -> None:
    limiter = SQLiteLimiter(path)
    op = _pairs(limiter, 1, limit=limit)
    i = 0
    while time.time() < start_at - 1.0:  # warm: connection, statements
        await op(0, i)
        i += 1
    await asyncio.sleep(max(0.0, start_at - time.time()))
    stop, count = start_at + seconds, 0
    while time.time() < stop:
        await op(0, count)
        count += 1
    await limiter.close()
    print(count)


def main() -> None:
    """Parse the arguments and run the bench."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--redis", default=None, help="redis:// URL (default: a private server)")
    parser.add_argument("--seconds", type=float, default=1.0, help="measuring time per case")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per case (best is shown)")
    parser.add_argument("--sqlite", action="store_true", help="bench the SQLite limiter instead")
    parser.add_argument("--processes", type=int, default=4, help="processes of the --sqlite case")
    parser.add_argument("--sqlite-child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--limit", type=int, default=BIG_LIMIT, help=argparse.SUPPRESS)
    add_persistence_flag(parser)
    args = parser.parse_args()
    if args.sqlite_child:
        asyncio.run(_child(args.sqlite_child, args.seconds, args.start_at, args.limit))
        return
    if args.sqlite:
        asyncio.run(bench_sqlite(args.seconds, args.rounds, args.processes))
        return
    with _server(args) as url:
        asyncio.run(bench(url, args.seconds, args.rounds))


if __name__ == "__main__":
    main()
