"""The service path against the runtime: one 3-step no-op chain in process and through a real
``chainrt serve`` on a real Redis, in the same run (issue 39).

    .venv/bin/python bench/serve.py [--runs 200] [--burst 400] [--max-runs 64] [--no-persistence]
    .venv/bin/python bench/serve.py --servers 1,2,4,8 [--cluster] [--per-server 32] [--seconds 5]
    .venv/bin/python bench/serve.py --ttft [--n 200] [--target worker|stub] [--max-tokens 4]

``--servers`` (N servers on one Redis, and on a Redis Cluster with ``--cluster``) is
``bench/_serve_scaling.py``; ``--ttft`` (a streaming LLM step, its first token through the
server's SSE against in process) is ``bench/_serve_ttft.py``; their docstrings say what they
measure. Without either:

One private redis-server (AOF, fsync every second, as docker-compose runs it; see
``bench/_redis.py``), one ``chainrt serve`` process on it, and this process as the client:

* in process: ``Runtime.run`` of the chain, one run at a time: the wall time p50/p99; the
  serial rate (runs/s) is measured just before and just after the burst (their mean is used);
* through the server, one run at a time, taking turns with the runs in process (a shared
  machine's load then weighs on both alike): ``POST /v1/runs`` then ``GET /v1/runs/{id}?wait=10s``;
  submit+wait p50/p99 and its ratio to the in-process p50 (goal <= 3x); submit-to-start (the
  ``POST`` sent to the first step's start, from its step record; same host, same clock; goal
  <= 2 ms) against the same figure in process (the call to the first step's start);
* a burst: ``--burst`` submits from ``--clients`` concurrent connections to a server started with
  ``--max-runs``, then every run waited for: runs/s from the first submit to the last final write
  (the records' ``updated_at``), and its ratio to the in-process serial rate (goal >= 0.5);
* what a served run costs whatever the machine's load: the server's CPU time per run in the
  burst (``/proc``) and the Redis commands per run (``INFO stats``, less the bench's own reads);
* where the time of one served run goes, from timestamps: the client's (``POST`` sent and
  answered, the wait answered), the run record's (``created_at``: set once the body is parsed and
  validated; ``updated_at``: its final write) and the step records' (start and end); and the
  pieces of a submit timed alone in this process against the same Redis (the body's parsing and
  validation with the server's own models, the record's ``create_run``, the queue's ``XADD``, a
  raw ``PING``).

The machine may be shared and loaded: compare figures of one run of this script only.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _redis import add_persistence_flag, persistence_label, private_server
from _serve_scaling import add_scaling_flags, scaling
from _serve_ttft import add_ttft_flags, ttft

import chainrt
from chainrt._records import RunRecord
from chainrt._runner import check_inputs
from chainrt._runtime import Runtime
from chainrt.serve._models import SubmitRequest
from chainrt.serve._queue import Entry, RedisQueue
from chainrt.spec import spec_from_dict
from chainrt.spec._dump import spec_dump, spec_json
from chainrt.testing.serve_process import ServeProcess

HERE = Path(__file__).resolve().parent
CHAIN = {
    "name": "three",
    "description": "Three no-op tool steps (bench/serve.py)",
    "budget": "1m",
    "steps": [{"id": f"s{i}", "tool": "tools.py:noop"} for i in range(3)],
}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _p50(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _chains_dir(root: Path) -> Path:
    """A chains directory holding the chain and its tool module."""
    import yaml

    folder = root / "chains"
    folder.mkdir()
    (folder / "three.yaml").write_text(yaml.safe_dump(CHAIN, sort_keys=False))
    shutil.copy(HERE / "_noop_tools.py", folder / "tools.py")
    return folder


async def _timed(label: str, call: Callable[[], Awaitable[Any]], n: int) -> tuple[str, float]:
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - t) * 1e3)
    return label, _p50(samples)


async def _first_start(rt: Runtime, run_id: str) -> float:
    steps = await rt.store.get_steps(run_id)
    return min(s.started_at for s in steps.values())


async def _one_at_a_time(
    server: str, rt: Runtime, folder: Path, runs: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """``runs`` pairs, taking turns: one run in process (``Runtime.run``), then one through the
    server, so that both see the same load of a shared machine. Returns (in process, served)."""
    chain = chainrt.Chain(spec_from_dict(CHAIN), source_dir=folder)
    local: dict[str, list[float]] = {"walls": [], "starts": []}
    out: dict[str, list[float]] = {
        k: [] for k in ("total", "post", "start", "in", "after", "queue", "run", "final", "notify")
    }
    async with httpx.AsyncClient(base_url=server, timeout=30) as c:
        for n in range(-5, runs):  # the first 5 pairs: warm-up
            called = time.time()
            t = time.perf_counter()
            result = await rt.run(chain, {})
            wall = (time.perf_counter() - t) * 1e3
            assert result.status == "completed", result.error
            if n >= 0:
                local["walls"].append(wall)
                local["starts"].append((await _first_start(rt, result.run_id) - called) * 1e3)
            run_id = f"one-{n + 5}"
            body = {"chain": "three", "input": {}, "run_id": run_id}
            t0 = time.time()
            posted = await c.post("/v1/runs", json=body)
            t1 = time.time()
            assert posted.status_code == 202, posted.text
            got = (await c.get(f"/v1/runs/{run_id}", params={"wait": "10s"})).json()
            t2 = time.time()
            assert got["status"] == "completed", got
            if n < 0:
                continue
            record = await rt.store.get_run(run_id)
            steps = list((await rt.store.get_steps(run_id)).values())
            first = min(s.started_at for s in steps)
            last = max(s.finished_at for s in steps)
            for key, value in (
                ("total", t2 - t0),
                ("post", t1 - t0),
                ("start", first - t0),
                ("in", record.created_at - t0),  # HTTP in, parse and validate
                ("after", t1 - record.created_at),  # record write, XADD, answer
                ("queue", first - record.created_at),  # XADD, wake, take, read, start
                ("run", last - first),
                ("final", record.updated_at - last),
                ("notify", t2 - record.updated_at),
            ):
                out[key].append(value * 1e3)
    return local, out


async def _serial_rate(rt: Runtime, folder: Path, runs: int) -> tuple[float, float]:
    """Runs per second of ``Runtime.run``, one run at a time (nothing else in the loop), and
    this process's CPU seconds per run meanwhile."""
    chain = chainrt.Chain(spec_from_dict(CHAIN), source_dir=folder)
    # This process holds the served phase's garbage: a full collection it is due for would land
    # in these few hundred runs (one of ~95,000 objects took ~60 ms here, 0.6 ms a run over 100).
    gc.collect()
    began, cpu = time.perf_counter(), time.process_time()
    for _ in range(runs):
        await rt.run(chain, {})
    return runs / (time.perf_counter() - began), (time.process_time() - cpu) / runs


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _commands(url: str) -> int:
    """Commands the Redis server has processed so far."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    try:
        return int((await client.info("stats"))["total_commands_processed"])
    finally:
        await client.aclose()


async def _burst(server: str, rt: Runtime, n: int, clients: int) -> tuple[float, float]:
    """Submit ``n`` runs from ``clients`` connections, wait for all; (runs/s, submit seconds)."""
    ids = iter(range(n))
    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(base_url=server, timeout=60, limits=limits) as c:

        async def submitter() -> None:
            for i in ids:
                body = {"chain": "three", "input": {}, "run_id": f"burst-{i}"}
                answer = await c.post("/v1/runs", json=body)
                assert answer.status_code == 202, answer.text

        began = time.time()
        await asyncio.gather(*(submitter() for _ in range(clients)))
        submitted = time.time() - began

        async def waiter(i: int) -> float:
            while True:
                got = (await c.get(f"/v1/runs/burst-{i}", params={"wait": "30s"})).json()
                if got["status"] not in ("queued", "running"):
                    break
            assert got["status"] == "completed", got
            return (await rt.store.get_run(f"burst-{i}")).updated_at

        sem = asyncio.Semaphore(clients)

        async def bounded(i: int) -> float:
            async with sem:
                return await waiter(i)

        finals = await asyncio.gather(*(bounded(i) for i in range(n)))
    return n / (max(finals) - began), submitted


async def _pieces(url: str, folder: Path, n: int) -> list[tuple[str, float]]:
    """A submit's pieces, each timed alone in this process against the same Redis."""
    chain = chainrt.Chain(spec_from_dict(CHAIN), source_dir=folder)
    body = b'{"chain": "three", "input": {}, "run_id": "piece"}'
    async with Runtime(store=url) as rt:
        store = rt.store
        counter = iter(range(10**9))

        def record() -> RunRecord:
            request = SubmitRequest.model_validate_json(body)
            inputs = check_inputs(chain.spec, request.input)
            made = RunRecord(
                run_id=f"piece-{next(counter)}",
                chain=chain.name,
                spec=spec_dump(chain.spec),
                source=str(folder),
                input=inputs,
                status="queued",
                budget_total_ms=chain.spec.budget,
            )
            made = rt.runner.trust.sign(made)
            made.attach_spec_json(spec_json(chain.spec))
            return made

        async def parse() -> None:
            record()

        async def create() -> None:
            await store.create_run(record())

        queue = RedisQueue(url, "bench", prefix="bench-pieces", chains=["three"])
        client = queue._client

        async def put() -> None:
            await queue.put(Entry("piece", chain="three"), "normal")

        async def ping() -> None:
            await client.ping()

        await ping()
        await put()
        rows = [
            await _timed("body parse + validate + record built (in process)", parse, n),
            await _timed("record write (create_run, parse included)", create, n),
            await _timed("queue append (XADD)", put, n),
            await _timed("raw PING round trip", ping, n),
        ]
        await queue.close()
    return rows


async def _bench(args: argparse.Namespace, url: str, folder: Path) -> None:
    print(
        f"3-step no-op tool chain; {persistence_label(args)}; {os.cpu_count()} CPU cores; "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    pieces = await _pieces(url, folder, args.runs)
    with ServeProcess(store=url, chains=folder, max_runs=args.max_runs) as server:
        async with Runtime(store=url) as rt:
            local, served = await _one_at_a_time(server.url, rt, folder, args.runs)
            before, local_cpu = await _serial_rate(rt, folder, args.runs)
            cpu, commands = _cpu_s(server.pid), await _commands(url)
            rate, submit_s = await _burst(server.url, rt, args.burst, args.clients)
            # Less the bench's own: 1 read of each run's record, and INFO itself.
            commands = await _commands(url) - commands - args.burst - 1
            cpu = _cpu_s(server.pid) - cpu
            after, _ = await _serial_rate(rt, folder, args.runs)
    serial = (before + after) / 2
    p50 = _p50(local["walls"])
    total = _p50(served["total"])
    print(
        f"\nin process (Runtime.run), {args.runs} runs one at a time (taking turns with the served ones):"
    )
    print(
        f"  run p50 {p50:.2f} ms  p99 {_pct(local['walls'], 0.99):.2f} ms; "
        f"call to first step p50 {_p50(local['starts']):.2f} ms; "
        f"serial rate {serial:.0f} runs/s (just before the burst {before:.0f}, just after "
        f"{after:.0f})"
    )
    print(f"\nthrough chainrt serve (POST, then GET ?wait=10s), {args.runs} runs one at a time:")
    print(
        f"  submit+wait p50 {total:.2f} ms  p99 {_pct(served['total'], 0.99):.2f} ms   "
        f"ratio to in process p50: {total / p50:.1f}x (goal <= 3x)"
    )
    start = _p50(served["start"])
    print(f"  submit-to-start p50 {start:.2f} ms (goal <= 2 ms)")
    print(f"  POST answered p50 {_p50(served['post']):.2f} ms")
    print(
        f"\nburst: {args.burst} submits from {args.clients} connections, --max-runs "
        f"{args.max_runs}: {rate:.0f} runs/s (submits took {submit_s:.2f} s); "
        f"ratio to the in-process serial rate: {rate / serial:.2f} (goal >= 0.5)"
    )
    print(
        f"  the server's CPU per run in the burst {cpu / args.burst * 1e3:.2f} ms (so at most "
        f"{args.burst / cpu:.0f} runs/s on one whole core); Redis commands per run "
        f"{commands / args.burst:.1f}"
    )
    per_run = cpu / args.burst
    print(
        f"  in process, a run takes {local_cpu * 1e3:.2f} ms of CPU: the server's CPU per run is "
        f"{per_run / local_cpu:.1f}x that (a load-free reading of the throughput goal: <= 2x)"
    )
    print("\nwhere one served run's time goes (p50 of each segment, ms; timestamps):")
    for key, label in (
        ("in", "POST sent -> record built (HTTP in, parse, validate)"),
        ("after", "record built -> POST answered (record write, XADD, answer)"),
        ("queue", "record built -> first step starts (XADD, wake, take, read, start)"),
        ("run", "first step starts -> last step ends (3 steps)"),
        ("final", "last step ends -> final record write"),
        ("notify", "final write -> ?wait answered (notify waiter, read, answer)"),
    ):
        print(f"  {label:66} {_p50(served[key]):7.2f}")
    print("a submit's pieces alone, in this process, same Redis (p50, ms):")
    for label, value in pieces:
        print(f"  {label:66} {value:7.3f}")


def main() -> None:
    """Parse the arguments and run the benchmark."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=200, help="runs one at a time (each way)")
    parser.add_argument("--burst", type=int, default=400, help="submits of the burst")
    parser.add_argument("--clients", type=int, default=16, help="connections of the burst")
    parser.add_argument("--max-runs", type=int, default=64, help="the server's --max-runs")
    add_persistence_flag(parser)
    add_scaling_flags(parser)
    add_ttft_flags(parser)
    args = parser.parse_args()
    if args.servers:
        with tempfile.TemporaryDirectory() as tmp:
            scaling(args, _chains_dir(Path(tmp)))
        return
    if args.ttft:
        ttft(args)
        return
    with tempfile.TemporaryDirectory() as tmp, private_server(args) as redis:
        asyncio.run(_bench(args, redis.url, _chains_dir(Path(tmp))))


if __name__ == "__main__":
    main()
