"""Per-run set-up cost: a reused ``chainrt.Runtime`` against a runtime opened for every run.

    .venv/bin/python bench/runtime_reuse.py [--steps 60] [--runs 40] [--store sqlite:///x.db]

Three ways to run the same chain of no-op async tool steps, measured in the same process:

* ``open per run``  — what ``chain.arun`` did before the Runtime existed: open the store, the
  dispatcher and the limiter, run, close them (``open_runtime`` around one run);
* ``Runtime.run``   — one ``chainrt.Runtime`` held for all runs;
* ``chain.arun``    — the public call, which now reuses the process-wide default runtime.

For each it prints the p50/p99 wall time of one run and what the run costs besides its steps
(wall time minus the span from its first step's start to its last step's end, from its records),
split into start (call to first step: run record written, keys, preparation) and end (last step's
end to return: its checkpoint, the final commit with the lease released). Three of those are
durable writes every run makes however it is called; the raw SQLite write transaction measured in
the same process is printed beside them, so what is left is set-up. Goal: ≤ 1 ms of set-up per
run with a reused runtime.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import chainrt
from chainrt._runtime import Runtime, open_runtime
from chainrt.spec import spec_from_dict

HERE = Path(__file__).resolve().parent


def _chain(steps: int) -> chainrt.Chain:
    spec = spec_from_dict(
        {
            "name": "reuse",
            "budget": "10m",
            "steps": [{"id": f"s{i}", "tool": "_noop_tools.py:noop"} for i in range(steps)],
        }
    )
    return chainrt.Chain(spec, source_dir=HERE)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _measure(
    label: str,
    once: Callable[[], Awaitable[chainrt.RunResult]],
    runs: int,
    rt: Runtime,
) -> tuple[str, list[float], list[float], list[float]]:
    await once()  # warm-up: imports, tables, first connections
    walls: list[float] = []
    starts: list[float] = []
    ends: list[float] = []
    for _ in range(runs):
        called = time.time()
        t = time.perf_counter()
        result = await once()
        wall = (time.perf_counter() - t) * 1e3
        returned = time.time()
        assert result.status == "completed", result.error
        steps = await rt.store.get_steps(result.run_id)
        walls.append(wall)
        starts.append((min(r.started_at for r in steps.values()) - called) * 1e3)
        ends.append((returned - max(r.finished_at for r in steps.values())) * 1e3)
    return label, walls, starts, ends


def _raw_write_ms(url: str, n: int = 500) -> float:
    import sqlite3

    conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
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
    return statistics.median(samples)


async def _bench(store_url: str, steps: int, runs: int) -> None:
    chain = _chain(steps)

    async with Runtime(store=store_url) as rt:

        async def open_per_run() -> chainrt.RunResult:
            async with open_runtime(store=store_url) as fresh:
                return await fresh.runner.run(chain.spec, {}, source_dir=HERE)

        async def reused() -> chainrt.RunResult:
            return await rt.run(chain, {})

        async def arun() -> chainrt.RunResult:
            return await chain.arun({}, store=store_url)

        rows = [
            await _measure("open per run (before)", open_per_run, runs, rt),
            await _measure("Runtime.run (reused)", reused, runs, rt),
            await _measure("chain.arun (default rt)", arun, runs, rt),
        ]
    raw = _raw_write_ms(store_url) if store_url.startswith("sqlite:") else 0.0
    print(f"store {rt.store.url}; {runs} runs x {steps} no-op steps each, after one warm-up run")
    print(f"{'':26}{'run p50':>9}{'run p99':>9}{'start p50':>11}{'end p50':>9}{'besides':>9}")
    for label, walls, starts, ends in rows:
        print(
            f"{label:26}{_pct(walls, 0.5):9.2f}{_pct(walls, 0.99):9.2f}"
            f"{_pct(starts, 0.5):11.3f}{_pct(ends, 0.5):9.3f}"
            f"{_pct(starts, 0.5) + _pct(ends, 0.5):9.3f}"
        )
    print("(ms; besides = start + end: what a run costs besides its steps)")
    if raw:
        print(f"raw SQLite write transaction p50 {raw:.3f} ms; a run makes 3 besides its steps")
        for label, _, starts, ends in rows:
            left = _pct(starts, 0.5) + _pct(ends, 0.5) - 3 * raw
            print(f"  set-up beyond those writes, {label:26} {left:7.3f} ms")


def main() -> None:
    """Parse the arguments and run the benchmark."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--store", help="store URL (default: a fresh SQLite file)")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = args.store or f"sqlite:///{tmp}/reuse.db"
        asyncio.run(_bench(url, args.steps, args.runs))


if __name__ == "__main__":
    main()
