"""``bench/serve.py --servers 1,2,4,8``: N ``chainrt serve`` processes on one Redis (issue 39).

For each N of ``--servers``: N servers (``--max-runs`` each) on the same private redis-server
(AOF, fsync every second, unless ``--no-persistence``), and closed-loop HTTP clients, ``--per-server``
of them per server: each submits a run of the 3-step no-op chain (``POST /v1/runs``), waits for it
(``GET /v1/runs/{id}?wait=30s``) and submits the next. The clients live in ``--client-procs``
processes of their own (default: one per server), so that one Python client's CPU is not
the limit. After ``--warmup`` seconds, the runs whose wait was answered in the next
``--seconds`` are counted: runs/s per N, and its ratio to N x the one-server figure (the issue's
goal: >= 0.8 N up to N = 8 on a host with 16 or more cores).

Beside each row, measured over the same window: the Redis server's CPU (``INFO cpu`` before
and after, % of one core; on a cluster the busiest master's, and the masters' sum), the Redis
commands per run, the servers' CPU (``/proc``, cores in all), the clients' CPU (cores), and how
busy the whole host was (``/proc/stat``, cores). A row whose Redis is near 100 % of a core is
Redis-bound; one whose host is near all its cores is bound by the machine.

``--cluster`` runs the same table on a private Redis Cluster too (3 masters + 3 replicas,
``chainrt.testing.redis_cluster.LocalCluster``, same persistence), same servers and clients.

``bench/_serve_scaling.py --client JSON`` is one client process (internal).
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
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chainrt.testing.serve_process import ServeProcess

__all__ = ["add_scaling_flags", "scaling"]


def add_scaling_flags(parser: argparse.ArgumentParser) -> None:
    """Add ``--servers`` and its options to bench/serve.py's arguments."""
    parser.add_argument(
        "--servers",
        type=lambda s: [int(x) for x in s.split(",")],
        default=None,
        help="run the N-server scaling table instead (e.g. 1,2,4,8)",
    )
    parser.add_argument("--per-server", type=int, default=32, help="closed-loop clients per server")
    parser.add_argument(
        "--client-procs", type=int, default=0, help="client processes (default: one per server)"
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="measured window per row")
    parser.add_argument("--warmup", type=float, default=1.5, help="seconds before the window")
    parser.add_argument(
        "--cluster", action="store_true", help="the same table on a Redis Cluster too"
    )
    parser.add_argument(
        "--cluster-only", action="store_true", help="the table on a Redis Cluster only"
    )


# -- measurements of the host, the servers and Redis ------------------------------------------


def _proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _host_busy_s() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole host so far, all cores (``/proc/stat``)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(values[:8]) - idle) / tick, sum(values[:8]) / tick


def _redis_info(urls: list[str]) -> list[tuple[float, int]]:
    """(CPU seconds, commands processed) of each Redis server."""
    import redis

    out = []
    for url in urls:
        client = redis.Redis.from_url(url)
        try:
            cpu = client.info("cpu")
            stats = client.info("stats")
        finally:
            client.close()
        used = float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])
        out.append((used, int(stats["total_commands_processed"])))
    return out


# -- one client process -------------------------------------------------------------------------


async def _client_main(spec: dict[str, Any]) -> dict[str, Any]:
    """Closed-loop clients: each submits, waits for the answer, submits again, until stop_at."""
    start_at, stop_at = float(spec["start_at"]), float(spec["stop_at"])
    done: list[float] = []
    latencies: list[tuple[float, float]] = []
    errors: list[str] = []
    counter = iter(range(10**9))
    clients = {
        url: httpx.AsyncClient(
            base_url=url,
            timeout=60,
            limits=httpx.Limits(max_connections=n, max_keepalive_connections=n),
        )
        for url, n in spec["servers"].items()
    }

    async def loop(c: httpx.AsyncClient) -> None:
        while time.time() < stop_at:
            run_id = f"{spec['prefix']}-{next(counter)}"
            sent = time.time()
            try:
                posted = await c.post(
                    "/v1/runs", json={"chain": "three", "input": {}, "run_id": run_id}
                )
                if posted.status_code != 202:
                    errors.append(f"POST {posted.status_code} {posted.text[:200]}")
                    await asyncio.sleep(0.01)
                    continue
                while True:
                    got = (await c.get(f"/v1/runs/{run_id}", params={"wait": "30s"})).json()
                    if got["status"] not in ("queued", "running"):
                        break
            except httpx.HTTPError as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                continue
            now = time.time()
            if got["status"] != "completed":
                errors.append(f"run {run_id} {got['status']}")
            done.append(now)
            latencies.append((now, now - sent))

    await asyncio.sleep(max(0.0, start_at - time.time()))
    cpu = time.process_time()
    tasks = [loop(c) for url, c in clients.items() for _ in range(spec["servers"][url])]
    await asyncio.gather(*tasks)
    cpu = time.process_time() - cpu
    for c in clients.values():
        await c.aclose()
    return {"done": done, "latencies": latencies, "errors": errors[:20], "n_errors": len(errors),
            "cpu_s": cpu, "wall_s": time.time() - start_at}  # fmt: skip


def _client_entry(raw: str) -> None:
    result = asyncio.run(_client_main(json.loads(raw)))
    sys.stdout.write(json.dumps(result) + "\n")


# -- one row of the table -----------------------------------------------------------------------


@contextmanager
def _servers(store: str, folder: Path, n: int, max_runs: int) -> Iterator[list[ServeProcess]]:
    with ExitStack() as stack:
        procs = [ServeProcess(store=store, chains=folder, max_runs=max_runs) for _ in range(n)]
        for proc in procs:
            stack.callback(proc.stop)
        with ThreadPoolExecutor(max_workers=n) as pool:
            list(pool.map(lambda p: p.start(), procs))
        yield procs


def _row(
    args: argparse.Namespace, store: str, redis_urls: list[str], folder: Path, n: int, tag: str
) -> dict[str, Any]:
    procs_n = args.client_procs or n
    with _servers(store, folder, n, args.max_runs) as servers:
        slots: list[dict[str, int]] = [{} for _ in range(procs_n)]
        for k in range(n * args.per_server):
            url = servers[k % n].url
            slot = slots[k % procs_n]
            slot[url] = slot.get(url, 0) + 1
        start_at = time.time() + 2.0 + 0.2 * procs_n  # the client processes' imports
        window_from = start_at + args.warmup
        window_to = window_from + args.seconds
        clients = []
        for i, slot in enumerate(slots):
            spec = {"servers": slot, "start_at": start_at, "stop_at": window_to,
                    "prefix": f"{tag}-n{n}-c{i}"}  # fmt: skip
            clients.append(
                subprocess.Popen(
                    [sys.executable, __file__, "--client", json.dumps(spec)],
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        time.sleep(max(0.0, window_from - time.time()))
        redis0, host0 = _redis_info(redis_urls), _host_busy_s()
        serve0 = [_proc_cpu_s(s.pid) for s in servers]
        time.sleep(max(0.0, window_to - time.time()))
        redis1, host1 = _redis_info(redis_urls), _host_busy_s()
        serve1 = [_proc_cpu_s(s.pid) for s in servers]
        results = []
        for proc in clients:
            out, _ = proc.communicate(timeout=120)
            if proc.returncode != 0:
                raise RuntimeError(f"a client process failed ({proc.returncode})")
            results.append(json.loads(out.strip().splitlines()[-1]))
    window = window_to - window_from
    done = [t for r in results for t in r["done"] if window_from <= t < window_to]
    latencies = [lat for r in results for t, lat in r["latencies"] if window_from <= t < window_to]
    redis_cpu = [(b[0] - a[0]) / window for a, b in zip(redis0, redis1, strict=True)]
    commands = sum(b[1] - a[1] for a, b in zip(redis0, redis1, strict=True))
    client_cpu = sum(r["cpu_s"] / max(r["wall_s"], 1e-9) for r in results)
    errors = sum(r["n_errors"] for r in results)
    for r in results:
        for line in r["errors"][:3]:
            print(f"    client error: {line}")
    return {
        "n": n,
        "runs_s": len(done) / window,
        "p50_ms": statistics.median(latencies) * 1e3 if latencies else float("nan"),
        "redis_busiest": max(redis_cpu) * 100,
        "redis_sum": sum(redis_cpu) * 100,
        "commands_per_run": commands / max(1, len(done)),
        "serve_cores": sum(b - a for a, b in zip(serve0, serve1, strict=True)) / window,
        "client_cores": client_cpu,
        "client_busiest": max(r["cpu_s"] / max(r["wall_s"], 1e-9) for r in results),
        "client_procs": procs_n,
        "host_cores": (host1[0] - host0[0]) / ((host1[1] - host0[1]) / (os.cpu_count() or 1)),
        "errors": errors,
    }


def _table(
    args: argparse.Namespace, label: str, store: str, redis_urls: list[str], folder: Path
) -> None:
    print(
        f"\n== {label}: {args.per_server} closed-loop clients per server, --max-runs "
        f"{args.max_runs}, {args.warmup:g} s warm-up then a {args.seconds:g} s window",
        flush=True,
    )
    rows: list[dict[str, Any]] = []
    for n in args.servers:
        tag = f"{'cl' if len(redis_urls) > 1 else 'one'}-{time.time():.0f}"
        row = _row(args, store, redis_urls, folder, n, tag=tag)
        rows.append(row)
        print(
            f"  N={n}: {row['runs_s']:.0f} runs/s, p50 {row['p50_ms']:.1f} ms, "
            f"Redis busiest {row['redis_busiest']:.0f}% (sum {row['redis_sum']:.0f}%), "
            f"{row['commands_per_run']:.1f} commands/run, servers {row['serve_cores']:.2f} cores, "
            f"clients {row['client_cores']:.2f} cores in {row['client_procs']} procs (busiest "
            f"{row['client_busiest']:.2f}), host "
            f"{row['host_cores']:.1f} of {os.cpu_count()} cores busy, errors {row['errors']}",
            flush=True,
        )
    one = next((r["runs_s"] for r in rows if r["n"] == 1), None)
    print(f"\n  {label}")
    print(
        "  | servers | runs/s | ratio to N x one server | p50 submit+wait | Redis busiest "
        "| Redis cmds/run | servers' CPU | clients' CPU | host busy |"
    )
    print("  | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        ratio = f"{r['runs_s'] / (r['n'] * one):.2f}" if one else "-"
        redis = f"{r['redis_busiest']:.0f}%"
        if len(redis_urls) > 1:
            redis += f" (sum {r['redis_sum']:.0f}%)"
        print(
            f"  | {r['n']} | {r['runs_s']:,.0f} | {ratio} | {r['p50_ms']:.1f} ms | {redis} | "
            f"{r['commands_per_run']:.1f} | {r['serve_cores']:.2f} cores | "
            f"{r['client_cores']:.2f} cores | {r['host_cores']:.1f} / {os.cpu_count()} cores |"
        )


def scaling(args: argparse.Namespace, folder: Path) -> None:
    """The scaling table(s) (see the module docstring)."""
    from _redis import persistence_label, private_server

    print(
        f"N-server scaling: 3-step no-op tool chain; {persistence_label(args)}; "
        f"{os.cpu_count()} CPU cores; load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
        flush=True,
    )
    if not args.cluster_only:
        with private_server(args) as redis:
            _table(args, "one redis-server", redis.url, [redis.url], folder)
    if args.cluster or args.cluster_only:
        from chainrt.testing.redis_cluster import LocalCluster

        with LocalCluster(durable=not args.no_persistence) as cluster:
            masters = [f"redis://127.0.0.1:{port}/0" for port in cluster.masters()]
            _table(args, "Redis Cluster, 3 masters + 3 replicas", cluster.url, masters, folder)
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--client":
    _client_entry(sys.argv[2])
