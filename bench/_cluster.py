"""``bench/overhead.py --store redis-cluster``: single-node Redis and a local Redis Cluster, one run.

Starts a private redis-server and a private cluster (3 masters + 3 replicas, ``LocalCluster``),
with the same persistence (AOF, fsync every second, unless ``--no-persistence``), and prints:

1. one run at a time (overhead.py's figures): single node, cluster, and cluster with
   ``?wait_replicas=1`` (each write waits for its replica: the cost of that durability). The
   three are interleaved: ``--runs`` rounds, each one run on each backend (the order rotated
   round by round), so that a noisy stretch of the machine falls on all three alike. After the
   three pooled blocks come the ratios to single-node: the median of the per-round ratios of
   the step p50 and of the run time, next to the ratio of the pooled figures, and a 95 %
   interval of each median ratio (order statistics and bootstrap, ``_median_ci``);
   ``--one-run-only`` stops after this part;
2. concurrency keys: acquire + release pairs/s, 100 keys, 64 tasks of one process, best of
   ``--rounds``, single node next to cluster;
3. total durable steps/s with ``--processes`` runner processes (a list, e.g. ``1,4,8,12``: one
   measurement of each backend per count, same servers), each running ``--concurrency`` runs at
   once for ``--seconds``: on the cluster the runs spread over the 3 masters. A table of
   cluster / single-node per process count ends the output.

Every figure comes from this run on this machine; the client processes and all the Redis servers
share its cores (say how many when you quote a figure).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from contextlib import AsyncExitStack
from pathlib import Path

from _median_ci import bootstrap_interval, order_interval
from _redis import persistence_label, private_server
from _step_samples import Samples, chain, one_run, pct, report

from chainrt._runtime import open_runtime
from chainrt.spec import spec_from_dict
from chainrt.testing.redis_cluster import LocalCluster

__all__ = ["add_cluster_flags", "run"]

RawRoundTrip = Callable[[str], Coroutine[None, None, tuple[float, str]]]
"""overhead.py's raw round trip: its p50 (ms) on a store URL, and its name."""

_LOAD = """
import asyncio, json, sys, time
from pathlib import Path
from chainrt._hooks import NO_HOOKS
from chainrt._runtime import open_runtime
from chainrt.spec import spec_from_dict

async def main() -> None:
    url, steps, concurrency, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    spec = spec_from_dict({"name": "load", "budget": "10m",
        "steps": [{"id": f"s{i}", "tool": "_noop_tools.py:noop"} for i in range(steps)]})
    source = Path(sys.argv[5])
    async with open_runtime(store=url, hooks=NO_HOOKS) as rt:
        await rt.runner.run(spec, {}, source_dir=source)  # warm-up
        print("ready", flush=True)
        start = float(sys.stdin.readline())  # every process starts together
        await asyncio.sleep(max(0.0, start - time.time()))
        done = 0
        first = time.time()
        stop = first + seconds
        async def worker() -> None:
            nonlocal done
            while time.time() < stop:
                result = await rt.runner.run(spec, {}, source_dir=source)
                assert result.status == "completed", result.error
                done += steps
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        print(json.dumps({"steps": done, "first": first, "last": time.time()}), flush=True)

asyncio.run(main())
"""


def add_cluster_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of the cluster comparison (used with ``--store redis-cluster``)."""
    parser.add_argument(
        "--processes",
        type=_counts,
        default=[4],
        help="runner processes of part 3, one count or a list (1,4,8,12): each count measured",
    )
    # --concurrency is overhead.py's own (a list); part 3 runs its last value per process, or 8.
    parser.add_argument("--seconds", type=float, default=5.0, help="length of part 3")
    parser.add_argument("--rounds", type=int, default=3, help="best-of rounds of part 2")
    parser.add_argument(
        "--one-run-only", action="store_true", help="part 1 only (one run at a time, interleaved)"
    )


def _counts(text: str) -> list[int]:
    """``--processes``: ``4`` or ``1,4,8,12`` (each at least 1)."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected counts like 1,4,8, got {text!r}") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"expected counts of at least 1, got {text!r}")
    return counts


def _per_process(args: argparse.Namespace) -> int:
    """Runs at once in each runner process of part 3 (``--concurrency``'s last value, or 8)."""
    return int(args.concurrency[-1]) if args.concurrency else 8


def run(args: argparse.Namespace, raw_round_trip: RawRoundTrip) -> None:
    """Print the three comparisons (see the module docstring)."""
    print(f"private redis-server and private Redis Cluster, {persistence_label(args)}")
    print(f"machine: {os.cpu_count()} CPUs shared by the clients and every Redis server")
    with private_server(args) as single, LocalCluster(durable=not args.no_persistence) as cluster:
        backends = [
            ("single-node Redis", single.url),
            ("Redis Cluster, 3 masters + 3 replicas", cluster.url),
            ("Redis Cluster, ?wait_replicas=1", cluster.url + "?wait_replicas=1"),
        ]
        asyncio.run(_one_at_a_time(backends, args.steps, args.runs, raw_round_trip))
        if args.one_run_only:
            return
        print(f"\n== concurrency keys: pairs/s, 100 keys, 64 tasks, best of {args.rounds}")
        for label, url in (("single-node Redis", single.url), ("Redis Cluster", cluster.url)):
            rate = asyncio.run(_pairs_per_s(url, args.rounds))
            print(f"{label:<20} {rate:>10,.0f} pairs/s")
        nodes = {single.url: [single.url], cluster.url: _master_urls(cluster)}
        rows = []
        for processes in args.processes:
            print(
                f"\n== total durable steps/s: {processes} runner processes x "
                f"{_per_process(args)} runs at once, {args.steps}-step runs, {args.seconds:g} s"
            )
            row = [processes]
            for label, url in (("single-node Redis", single.url), ("Redis Cluster", cluster.url)):
                rate, busiest = _load_and_print(label, url, nodes[url], processes, args)
                row += [rate, busiest]
            rows.append(row)
        print(f"\n== summary: {os.cpu_count()} CPUs, {_per_process(args)} runs at once per process")
        print(
            f"{'processes':>9} {'single steps/s':>15} {'busiest':>8} "
            f"{'cluster steps/s':>16} {'busiest':>8} {'cluster/single':>15}"
        )
        for processes, s_rate, s_busy, c_rate, c_busy in rows:
            ratio = c_rate / s_rate if s_rate else 0.0
            print(
                f"{processes:>9} {s_rate:>15,.0f} {s_busy:>7.0f}% "
                f"{c_rate:>16,.0f} {c_busy:>7.0f}% {ratio:>14.2f}x"
            )
        print("(busiest: the busiest Redis server's CPU, % of one core, over the window)")


async def _one_at_a_time(
    backends: list[tuple[str, str]], steps: int, runs: int, raw_round_trip: RawRoundTrip
) -> None:
    """Part 1: ``runs`` rounds of one run on each backend, interleaved (the order rotated each
    round); each backend's pooled block, then its per-round ratios to the first backend's."""
    spec = spec_from_dict(chain(steps))
    samples = [Samples() for _ in backends]
    rounds: list[list[tuple[float, float]]] = [[] for _ in backends]  # (step p50 ms, run s)
    async with AsyncExitStack() as stack:
        runtimes = [
            await stack.enter_async_context(open_runtime(store=url, hooks=None))
            for _, url in backends
        ]
        for runtime in runtimes:
            await one_run(runtime, spec, steps, Samples())  # warm-up: imports, caches, scripts
        for r in range(runs):
            for k in range(len(backends)):
                i = (r + k) % len(backends)
                rounds[i].append(await one_run(runtimes[i], spec, steps, samples[i]))
        raws = [await raw_round_trip(url) for _, url in backends]
        shown = [runtime.store.url for runtime in runtimes]
    for (label, _), url, got, raw in zip(backends, shown, samples, raws, strict=True):
        print(f"\n== one run at a time: {label}")
        report(url, False, runs, steps, got, raw)
    base_label, base = backends[0][0], samples[0]
    print(
        f"\n== one run at a time, interleaved: {runs} rounds of one run per backend (order "
        f"rotated); ratios to {base_label}, > 1 is slower"
    )
    for (label, _), got, per_round in zip(backends[1:], samples[1:], rounds[1:], strict=True):
        step = [c[0] / s[0] for c, s in zip(per_round, rounds[0], strict=True)]
        whole = [c[1] / s[1] for c, s in zip(per_round, rounds[0], strict=True)]
        pooled = pct(got.per_step, 0.5) / pct(base.per_step, 0.5)
        rate = (base.total_steps / base.total_s) / (got.total_steps / got.total_s)
        print(
            f"{label:<38} step p50 {statistics.median(step):.2f}x median of rounds "
            f"({min(step):.2f}-{max(step):.2f}x), pooled {pooled:.2f}x; run time "
            f"{statistics.median(whole):.2f}x median of rounds, steps/s pooled {rate:.2f}x"
        )
        for what, ratios in (("step p50", step), ("run time", whole)):
            low, high, coverage = order_interval(ratios)
            b_low, b_high = bootstrap_interval(ratios)
            print(
                f"{'':<38} {what} median ratio, 95% interval: order statistics "
                f"{low:.2f}-{high:.2f}x (covers {coverage:.1%}), bootstrap {b_low:.2f}-{b_high:.2f}x"
            )


def _load_and_print(
    label: str, url: str, nodes: list[str], processes: int, args: argparse.Namespace
) -> tuple[float, float]:
    """Run part 3 once on ``url`` and print it: steps/s and the busiest server's % of a core."""
    before = [_cpu_s(node) for node in nodes]
    rate, steps = _load(url, processes, args)
    used = [_cpu_s(node) - b for node, b in zip(nodes, before, strict=True)]
    masters = f"  (runs spread over {len(nodes)} masters)" if len(nodes) > 1 else ""
    print(f"{label:<20} {rate:>10,.0f} durable steps/s{masters}")
    # Where the ceiling is: the busiest Redis server saturates when it needs one CPU-s a
    # second, i.e. at about steps / (its CPU-s) steps/s; below that, the clients' cores set
    # the figure above, not Redis.
    window = steps / rate if rate else 0.0
    busiest = max(used)
    share = busiest / window * 100 if window else 0.0
    print(
        f"{'':<20} Redis CPU {sum(used) / max(steps, 1) * 1e6:.1f} us per step; busiest "
        f"server {share:.0f}% of one core; "
        f"Redis-bound ceiling ~{steps / busiest if busiest else 0:,.0f} steps/s"
    )
    return rate, share


async def _pairs_per_s(url: str, rounds: int) -> float:
    from concurrency import _pairs, _rate  # bench/concurrency.py

    from chainrt.concurrency import KeyRequest, RedisLimiter

    limiter = RedisLimiter.from_url(url)
    await (await limiter.acquire([KeyRequest("warm", 1)], timeout_s=1, holder="w")).release()
    best = 0.0
    for _ in range(rounds):
        best = max(best, await _rate(_pairs(limiter, 100), 64, 1.0))
    await limiter.close()
    return best


def _master_urls(cluster: LocalCluster) -> list[str]:
    return [f"redis://127.0.0.1:{port}/0" for port in cluster.masters()]


def _cpu_s(url: str) -> float:
    """CPU seconds (user + system) the Redis server at ``url`` has used since it started."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        info = client.info("cpu")
    finally:
        client.close()
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _load(url: str, processes: int, args: argparse.Namespace) -> tuple[float, int]:
    """Durable steps/s summed over the runner processes (over the window they all ran), steps."""
    source = str(Path(__file__).resolve().parent)
    # Keep the caller's PYTHONPATH after ours: chainrt's dependencies may live there.
    paths = [str(Path(source).parent), source, *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    cmd = [sys.executable, "-c", _LOAD, url, str(args.steps), str(_per_process(args))]
    cmd += [str(args.seconds), source]
    procs = [
        subprocess.Popen(cmd, text=True, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        for _ in range(processes)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError("a load process did not start")
        start = time.time() + 0.5
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(f"{start}\n")
            proc.stdin.flush()
        rows = []
        for proc in procs:
            out, _ = proc.communicate(timeout=args.seconds + 120)
            rows.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    window = max(r["last"] for r in rows) - min(r["first"] for r in rows)
    steps = sum(int(r["steps"]) for r in rows)
    return steps / window, steps
