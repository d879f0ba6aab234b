"""Many SSE clients against one ``chainrt serve`` under a small open-files limit (issue 36).

Starts a redis-server and one ``chainrt serve`` on it, sets the server's ``ulimit -n`` (default
1024), submits a few long runs and opens ``--clients`` event streams on them at once, then checks
``/health/ready`` while they are all open. Prints what the streams got (200 / 429 / failed), the
health answers and their latency, the server's memory and descriptors before and with the
streams open (so the memory per open stream), its Redis pub/sub connections, and how many
"Too many open files" lines and tracebacks its log holds.

    .venv/bin/python bench/sse_streams.py [--clients 1000] [--nofile 1024] [--max-streams N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import httpx
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from chainrt.testing.redis_server import RedisServer  # noqa: E402
from chainrt.testing.serve_process import ServeProcess  # noqa: E402

CHAINS = ROOT / "tests" / "data" / "dashboard"
_BODIES: dict[str, str] = {}
"""The body of the first answer of each refusing status."""


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def _open(port: int, run_id: str) -> tuple[str, asyncio.StreamWriter | None]:
    """One event stream by hand (a raw socket each, as a browser holds it): its status."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"GET /v1/runs/{run_id}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), 30)
    except (OSError, TimeoutError) as exc:
        return f"failed ({type(exc).__name__})", None
    parts = line.split()
    code = parts[1].decode() if len(parts) > 1 else "closed"
    if code != "200":
        with contextlib.suppress(OSError, TimeoutError, asyncio.IncompleteReadError, ValueError):
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            length = 0
            for header in head.split(b"\r\n"):
                name, _, value = header.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            body = await asyncio.wait_for(reader.readexactly(min(length, 2000)), 5)
            retry = b"retry-after" in head.lower()
            said = body[:300].decode(errors="replace") + (" (Retry-After)" if retry else "")
            _BODIES.setdefault(code, said)
        writer.close()
        return code, None
    return code, writer


async def _drive(server: ServeProcess, clients: int, runs: list[str]) -> None:
    pid = server.pid
    rss0, fds0 = _rss_kib(pid), _fds(pid)
    started = time.perf_counter()
    results = await asyncio.gather(
        *(_open(server.port, runs[i % len(runs)]) for i in range(clients))
    )
    opened_s = time.perf_counter() - started
    await asyncio.sleep(1.0)  # let the streams settle (history sent, subscriptions made)
    rss1, fds1 = _rss_kib(pid), _fds(pid)
    health: list[int] = []
    latency: list[float] = []
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        for _ in range(20):
            t0 = time.perf_counter()
            try:
                health.append((await client.get("/health/ready")).status_code)
            except httpx.HTTPError:
                health.append(0)
            latency.append((time.perf_counter() - t0) * 1000)
            await asyncio.sleep(0.1)
    codes: dict[str, int] = {}
    for code, _ in results:
        codes[code] = codes.get(code, 0) + 1
    open_streams = codes.get("200", 0)
    print(f"clients                    {clients} (opened in {opened_s:.2f} s)")
    print(f"stream answers             {dict(sorted(codes.items()))}")
    for code, body in sorted(_BODIES.items()):
        print(f"  a {code} said            {body.strip()}")
    print(f"health /ready answers      {dict((c, health.count(c)) for c in sorted(set(health)))}")
    print(
        f"health latency ms          p50 {statistics.median(latency):.1f}, max {max(latency):.1f}"
    )
    print(f"server RSS MiB             {rss0 / 1024:.1f} -> {rss1 / 1024:.1f} with streams open")
    if open_streams:
        print(f"memory per open stream     {(rss1 - rss0) / open_streams:.1f} KiB")
    print(f"server descriptors         {fds0} -> {fds1}")
    for _, writer in results:
        if writer is not None:
            writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--nofile", type=int, default=1024, help="the server's ulimit -n")
    parser.add_argument("--max-streams", type=int, help="the server's --max-streams")
    parser.add_argument("--runs", type=int, default=10, help="runs the streams watch")
    parser.add_argument("--show-log", action="store_true", help="print the server's log tail")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, args.clients * 2 + 256))  # this process holds the clients
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    extra = [] if args.max_streams is None else ["--max-streams", str(args.max_streams)]
    with RedisServer() as rserver:
        # The server inherits `ulimit -n` from this process at its start (its default
        # --max-streams is read from it then); this process takes its own limit back after.
        resource.setrlimit(resource.RLIMIT_NOFILE, (args.nofile, hard))
        server = ServeProcess(store=rserver.url, chains=CHAINS, drain="1s", args=extra)
        try:
            server.start()
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        try:
            _run(server, rserver, args)
        finally:
            server.stop()


def _run(server: ServeProcess, rserver: RedisServer, args: argparse.Namespace) -> None:
    """Long runs, the clients on them, then what Redis and the server's log say."""
    print(f"server ulimit -n           {args.nofile}")
    runs = [f"sse-{i}" for i in range(args.runs)]
    for run_id in runs:
        body = {"chain": "steps", "run_id": run_id, "input": {"a": 120, "b": 0, "c": 0}}
        server.post("/v1/runs", json=body).raise_for_status()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        statuses = {server.get(f"/v1/runs/{r}").json()["status"] for r in runs}
        if statuses == {"running"}:
            break
        time.sleep(0.1)
    asyncio.run(_drive(server, args.clients, runs))
    client = redis.Redis.from_url(rserver.url)
    pubsub = [c for c in client.client_list() if int(c.get("sub", 0)) > 0]
    client.close()
    print(f"Redis pub/sub connections  {len(pubsub)} (all processes)")
    for run_id in runs:
        server.post(f"/v1/runs/{run_id}/cancel")
    log = server._log.read_text(errors="replace")
    print(f"'Too many open files' lines {log.count('Too many open files')}")
    print(f"tracebacks in the log      {log.count('Traceback')}")
    if args.show_log:
        print(log[:8000])


if __name__ == "__main__":
    main()
