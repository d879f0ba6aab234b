"""The runtime's own cost per durable step: no-op async tools, every step checkpointed.

    .venv/bin/python bench/overhead.py [--store sqlite:///tmp/x.db | redis://...] [--steps 100]
        [--runs 30] [--trace] [--concurrency 1,8,64] [--delay-us D]

Prints p50/p99 of the time per step (from one step's start to the next one's: budget decision,
template rendering, the tool call, the atomic checkpoint write) and durable steps/s, plus the
store's raw round trip measured in the same run (the physical floor). Step-to-step figures leave
out what a run costs once, so the whole run is reported beside them: its p50/p99 wall time, the
run's start (from the call to its first step: run record creation, lease, budget set-up) and its
end (from the last step's start to the return: that step, the final commit, lease release).
Without --store it uses a fresh SQLite file; with `--store redis` it starts a private
redis-server (AOF, fsync every second, as docker-compose runs it; `--no-persistence` turns it
off). `--store redis-cluster` compares single-node Redis with a private local Redis Cluster in
one run (see bench/_cluster.py: one run at a time, the three backends interleaved round by round
with the median of per-round ratios, `?wait_replicas=1`, concurrency pairs/s, and total durable
steps/s over `--processes` runner processes).

With ``--concurrency N[,N...]`` it runs N runs at once in one process instead, for each N, and
prints durable steps/s (every step of every run, over the wall time of the whole batch) and the
per-step p50/p99 across all runs, next to the raw round trip's p50/p99 in the same run; each N
repeats batches until about ``--runs x --steps`` steps have run (at least 3 batches).

With ``--interleave K`` (one run at a time) it runs K rounds of one run then ``--raw-per-round`` raw
round trips, interleaved, and prints the median of the per-round step/raw ratios (p50 and p99)
with a 95 % interval and how many rounds met issue 18's goals (``bench/_rounds.py``).

Both modes stand in for a runner process, so after the warm-up run they tune the garbage
collector as ``chainrt run``/``serve`` do (``chainrt/_gc.py``) and say so; ``--no-gc-tuning``
leaves Python's defaults. The last line gives the process's RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import itertools

from _gc_flag import add_gc_flag, apply_gc, memory_label
from _redis import add_delay_flag, add_persistence_flag
from _step_samples import SOURCE, Samples, chain, levels, one_run, pct, report

from chainrt._hooks import NO_HOOKS, Hooks
from chainrt._runtime import open_runtime
from chainrt.spec import spec_from_dict


async def _raw_round_trip(url: str, n: int = 2000) -> tuple[float, str]:
    samples, name = await _raw_samples(url, n)
    return statistics.median(samples), name


async def _raw_samples(url: str, n: int = 2000) -> tuple[list[float], str]:
    if url.startswith(("redis://", "rediss://")):
        import redis.asyncio as aioredis

        from chainrt.redis import split_options

        # One node, no keys: on a cluster, the round trip to the node the URL names.
        client = aioredis.Redis.from_url(split_options(url)[0])
        sha = await client.script_load("return 1")
        samples = []
        for _ in range(n):
            t = time.perf_counter()
            await client.evalsha(sha, 0)
            samples.append((time.perf_counter() - t) * 1e3)
        await client.aclose()
        return samples, "raw EVALSHA round trip"
    import sqlite3

    path = url.removeprefix("sqlite:///")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("CREATE TABLE IF NOT EXISTS raw (k INTEGER PRIMARY KEY, v TEXT)")
    samples = []
    for i in range(n):
        t = time.perf_counter()
        conn.execute("BEGIN")
        conn.execute("INSERT OR REPLACE INTO raw VALUES (?, ?)", (i % 50, "x" * 200))
        conn.execute("COMMIT")
        samples.append((time.perf_counter() - t) * 1e3)
    conn.close()
    return samples, "raw SQLite write transaction"


async def _bench(
    store_url: str, steps: int, runs: int, hooks: Hooks | None, args: argparse.Namespace
) -> None:
    spec = spec_from_dict(chain(steps))
    samples = Samples()
    async with open_runtime(store=store_url, hooks=hooks) as runtime:
        await runtime.runner.run(spec, {}, source_dir=SOURCE)  # warm-up: imports, caches, tables
        gc_line = apply_gc(args)
        if args.interleave:
            from _rounds import rounds

            await rounds(
                runtime, spec, store_url, steps, args.interleave, args.raw_per_round, _raw_samples
            )
            print(f"{gc_line}; {memory_label()}")
            return
        for _ in range(runs):
            await one_run(runtime, spec, steps, samples)
        raw = await _raw_round_trip(store_url)
    tracing = hooks is not NO_HOOKS and hooks is not None
    report(runtime.store.url, tracing, runs, steps, samples, raw)
    print(f"{gc_line}; {memory_label()}")


async def _concurrent(
    store_url: str, steps: int, runs: int, levels: list[int], args: argparse.Namespace
) -> None:
    spec = spec_from_dict(chain(steps))
    source = SOURCE
    rows = []
    async with open_runtime(store=store_url) as runtime:
        await runtime.runner.run(spec, {}, source_dir=source)  # warm-up: imports, caches, tables
        gc_line = apply_gc(args)
        for level in levels:
            batches = max(3, runs * steps // (level * steps))
            gaps: list[float] = []
            done = 0
            wall = 0.0
            for _ in range(batches):
                t = time.perf_counter()
                results = await asyncio.gather(
                    *(runtime.runner.run(spec, {}, source_dir=source) for _ in range(level))
                )
                wall += time.perf_counter() - t
                for result in results:
                    assert result.status == "completed", result.error
                    records = await runtime.store.get_steps(result.run_id)
                    starts = sorted(r.started_at for r in records.values())
                    gaps += [(b - a) * 1e3 for a, b in itertools.pairwise(starts)]
                    done += len(records)
            rows.append((level, batches, done / wall, pct(gaps, 0.5), pct(gaps, 0.99)))
        raw, raw_name = await _raw_samples(store_url)
    raw50, raw99 = pct(raw, 0.5), pct(raw, 0.99)
    print(f"store            {runtime.store.url}")
    print(f"chain            {steps} no-op tool steps, every one checkpointed")
    print(f"{raw_name:<32} p50 {raw50:.3f} ms   p99 {raw99:.3f} ms")
    print(
        f"{'runs at once':>12} {'batches':>8} {'steps/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'p50/raw':>8} {'p99/raw':>8} {'steps/s vs N=1':>15}"
    )
    base = rows[0][2]
    for level, batches, rate, p50, p99 in rows:
        print(
            f"{level:>12} {batches:>8} {rate:>9,.0f} {p50:>8.3f} {p99:>8.3f} "
            f"{p50 / raw50:>7.2f}x {p99 / raw99:>7.2f}x {rate / base:>14.2f}x"
        )
    print(f"{gc_line}; {memory_label()}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--store", help="store URL; 'redis' starts a private redis-server")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument(
        "--trace", action="store_true", help="measure with tracing hooks on (in-memory exporter)"
    )
    parser.add_argument(
        "--concurrency",
        type=levels,
        help="runs at once in one process, e.g. 1,8,64 (steps/s and per-step p50/p99 for each); "
        "with --store redis-cluster, runs at once per runner process (its last value, default 8)",
    )
    parser.add_argument(
        "--interleave",
        type=int,
        default=0,
        help="one run at a time: K interleaved rounds of one run and --raw-per-round raw round "
        "trips, with the median per-round step/raw ratios and their 95%% interval (bench/_rounds.py)",
    )
    parser.add_argument("--raw-per-round", type=int, default=300, help="raw round trips per round")
    add_persistence_flag(parser)
    add_delay_flag(parser)
    add_gc_flag(parser)  # not used with --store redis-cluster
    from _cluster import add_cluster_flags

    add_cluster_flags(parser)  # used with --store redis-cluster (see bench/_cluster.py)
    args = parser.parse_args()
    if args.delay_us and args.store != "redis":  # not redis-cluster either: six servers
        parser.error("--delay-us needs --store redis (the private server it sits in front of)")
    hooks: Hooks | None = None
    if args.trace:
        from chainrt.tracing import in_memory_hooks

        hooks = in_memory_hooks()
    if args.store == "redis-cluster":
        import _cluster

        # single node, cluster, wait_replicas=1 (interleaved), limiter, load
        _cluster.run(args, _raw_round_trip)
        return
    if args.store == "redis":
        from _redis import delay_label, persistence_label, private_server, reached

        print(f"private redis-server, {persistence_label(args)}; {delay_label(args)}")
        with private_server(args) as server, reached(server, args) as url:
            asyncio.run(_measure(args, url, hooks))
        return
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(_measure(args, args.store or f"sqlite:///{tmp}/overhead.db", hooks))


async def _measure(args: argparse.Namespace, url: str, hooks: Hooks | None) -> None:
    if args.concurrency:
        await _concurrent(url, args.steps, args.runs, args.concurrency, args)
    else:
        await _bench(url, args.steps, args.runs, hooks, args)


if __name__ == "__main__":
    main()
