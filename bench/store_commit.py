"""Latency and throughput of one checkpoint commit (step record + run progress), store only.

    python bench/store_commit.py --store redis://127.0.0.1:6390/0 [--n 5000]
    python bench/store_commit.py --store sqlite:////tmp/bench.db
    python bench/store_commit.py            # both: a private redis-server and a temp SQLite file
    python bench/store_commit.py --no-persistence   # ... that Redis without its append-only file

Prints p50/p99 per commit from one task, commits/s from one task and from ``--tasks``
concurrent tasks (each committing to its own run), and, for Redis, a raw round trip (PING and a
trivial EVALSHA) measured on the same server in the same run, so the store's own cost shows.
The private redis-server persists as docker-compose runs it (AOF, fsync every second) unless
``--no-persistence``; the output says which. Warning: it writes runs named ``bench-*`` into the
store (they expire with the store's TTL).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _redis import add_persistence_flag, persistence_label, private_server

from chainrt.store import (
    CheckpointStore,
    OwnerLease,
    RedisStore,
    RunProgress,
    RunRecord,
    StepRecord,
    open_store,
)


def _run(run_id: str) -> RunRecord:
    lease = OwnerLease(host="bench", pid=os.getpid(), token=1, expires_at=time.time() + 60)
    spec = {"name": "bench", "steps": [{"id": f"s{i}", "weight": 1} for i in range(60)]}
    return RunRecord(
        run_id=run_id,
        chain="bench",
        spec=spec,
        input={"question": "x" * 200},
        budget_total_ms=8000,
        owner=lease,
        fencing_token=1,
    )


def _step(k: int) -> StepRecord:
    # A typical step: a short LLM answer, two attempts, one concurrency wait (~1 KB of JSON).
    return StepRecord(
        step_id=f"s{k}",
        status="completed",
        output={"answer": "The order #12345 shipped on Monday. " * 12, "tokens": 96},
        attempts=1,
        model="primary",
        allotted_ms=1200.0,
        elapsed_ms=312.5,
        started_at=time.time(),
        finished_at=time.time(),
        waits_ms={"model:primary": 0.4},
    )


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _timed(n: int, op: Callable[[int], Awaitable[object]]) -> list[float]:
    samples = []
    for k in range(n):
        start = time.perf_counter()
        await op(k)
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def _line(label: str, samples: list[float]) -> str:
    return (
        f"{label:<28} p50 {_pct(samples, 0.5):6.3f} ms   p99 {_pct(samples, 0.99):6.3f} ms   "
        f"mean {statistics.fmean(samples):6.3f} ms"
    )


async def bench(url: str, n: int, tasks: int) -> None:
    store: CheckpointStore = open_store(url)
    tag = f"bench-{os.getpid()}-{int(time.time())}"
    try:
        await store.create_run(_run(tag))
        steps = [_step(k) for k in range(60)]

        async def commit(k: int) -> None:
            progress = RunProgress(status="running", budget_used_ms=float(k), stopped_at=f"s{k}")
            await store.commit(tag, 1, progress, steps[k % 60])

        await _timed(min(n, 500), commit)  # warm-up: connections, scripts, page cache
        start = time.perf_counter()
        samples = await _timed(n, commit)
        elapsed = time.perf_counter() - start
        print(f"store: {store.url}")
        print(_line("commit (1 task)", samples) + f"   {n / elapsed:8.0f} commits/s")

        ids = [f"{tag}-c{i}" for i in range(tasks)]
        for run_id in ids:
            await store.create_run(_run(run_id))

        async def drive(run_id: str) -> None:
            for k in range(n // tasks):
                progress = RunProgress(status="running", budget_used_ms=float(k))
                await store.commit(run_id, 1, progress, steps[k % 60])

        start = time.perf_counter()
        await asyncio.gather(*(drive(run_id) for run_id in ids))
        elapsed = time.perf_counter() - start
        total = (n // tasks) * tasks
        print(f"{'commit (' + str(tasks) + ' tasks)':<28} {total / elapsed:8.0f} commits/s")

        for run_id in [tag, *ids]:
            done = RunProgress(status="completed", budget_used_ms=1.0, release_owner=True)
            await store.commit(run_id, 1, done)
        if isinstance(store, RedisStore):
            await _raw_redis(store, n)
    finally:
        await store.close()


async def _raw_redis(store: RedisStore, n: int) -> None:
    """The floor: one round trip to the same server through the same client."""
    client = store._client
    sha = await client.script_load("return 1")
    print(_line("raw PING", await _timed(n, lambda _: client.ping())))
    print(_line("raw EVALSHA 'return 1'", await _timed(n, lambda _: client.evalsha(sha, 0))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", help="store URL (default: a private Redis and a temp SQLite)")
    parser.add_argument("--n", type=int, default=5000, help="commits to time (default 5000)")
    parser.add_argument("--tasks", type=int, default=16, help="concurrent tasks (default 16)")
    add_persistence_flag(parser)
    args = parser.parse_args()
    if args.store:
        asyncio.run(bench(args.store, args.n, args.tasks))
        return
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(bench(f"sqlite:///{tmp}/bench.db", args.n, args.tasks))
    print()
    print(f"private redis-server, {persistence_label(args)}")
    with private_server(args) as server:
        asyncio.run(bench(server.url, args.n, args.tasks))


if __name__ == "__main__":
    main()
