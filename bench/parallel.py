"""What control flow costs: a `parallel` group's overhead, and a `map`'s cost per item.

    .venv/bin/python bench/parallel.py [--store sqlite|redis|both] [--runs 30] [--items 1000]

1. A `parallel` group of 8 branches, each one tool sleeping 100 ms: the group's time (from its
   record: allotment start to its end, every branch's step checkpointed) minus the 100 ms sleep
   is its overhead. Goal: p50 at most 3 ms.
2. A `parallel` group whose second branch sleeps 5 s, on a 200 ms budget: how late past the
   group's deadline (its allotment) the group ends, the sleeping branch cut. Goal: 20 ms.
3. A `map` over `--items` items of a no-op tool at `max_concurrency: 64`: the group's time per
   item, against a straight chain's time per durable step (100 no-op steps, measured in the same
   process, same store). Goal: at most 2x.

Each store is fresh: a SQLite file in a temporary folder, or a private redis-server (AOF,
fsync every second, as docker-compose runs it).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chainrt._runtime import open_runtime
from chainrt.spec import spec_from_dict
from chainrt.testing.redis_server import RedisServer

SOURCE = Path(__file__).resolve().parent
TOOLS = "_flow_tools.py"


def parallel_chain(branches: int, sleep_ms: float) -> dict[str, Any]:
    return {
        "name": "bench-parallel",
        "budget": "10s",
        "steps": [
            {
                "id": "fan",
                "parallel": {
                    f"b{i}": [
                        {"id": f"s{i}", "tool": f"{TOOLS}:sleep_ms", "args": {"ms": sleep_ms}}
                    ]
                    for i in range(branches)
                },
            }
        ],
    }


def cut_chain() -> dict[str, Any]:
    return {
        "name": "bench-cut",
        "budget": "200ms",
        "steps": [
            {
                "id": "fan",
                "parallel": {
                    "quick": [{"id": "quick", "tool": f"{TOOLS}:sleep_ms", "args": {"ms": 1}}],
                    "slow": [{"id": "slow", "tool": f"{TOOLS}:sleep_ms", "args": {"ms": 5000}}],
                },
            }
        ],
    }


def map_chain(concurrency: int) -> dict[str, Any]:
    return {
        "name": "bench-map",
        "budget": "120s",
        "inputs": {"items": "list"},
        "steps": [
            {
                "id": "each",
                "map": "{{ input.items }}",
                "max_concurrency": concurrency,
                "steps": [{"id": "work", "tool": f"{TOOLS}:noop", "args": {"value": "{{ item }}"}}],
            }
        ],
    }


def straight_chain(steps: int) -> dict[str, Any]:
    return {
        "name": "bench-straight",
        "budget": "120s",
        "steps": [
            {"id": f"s{i}", "tool": f"{TOOLS}:noop", "args": {"value": i}} for i in range(steps)
        ],
    }


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(url: str, runs: int, items: int) -> None:
    fan = spec_from_dict(parallel_chain(8, 100.0))
    fan_map = spec_from_dict(map_chain(64))
    straight = spec_from_dict(straight_chain(100))
    cut = spec_from_dict(cut_chain())
    async with open_runtime(store=url) as runtime:
        runner = runtime.runner
        for spec, inputs in ((fan, {}), (fan_map, {"items": [1, 2]}), (straight, {})):
            await runner.run(spec, inputs, source_dir=SOURCE)  # warm-up
        overheads = []
        for _ in range(runs):
            result = await runner.run(fan, {}, source_dir=SOURCE)
            assert result.status == "completed", result.error
            overheads.append(result.steps[0].elapsed_ms - 100.0)
        late = []
        for _ in range(max(5, runs // 3)):
            result = await runner.run(cut, {}, source_dir=SOURCE)
            assert result.status == "partial", result.status
            late.append(result.steps[0].elapsed_ms - result.steps[0].allotted_ms)
        per_item = []
        per_step = []
        for _ in range(max(3, runs // 10)):
            result = await runner.run(fan_map, {"items": list(range(items))}, source_dir=SOURCE)
            assert result.status == "completed", result.error
            per_item.append(result.steps[0].elapsed_ms / items)
            t = time.perf_counter()
            result = await runner.run(straight, {}, source_dir=SOURCE)
            assert result.status == "completed", result.error
            per_step.append((time.perf_counter() - t) * 1000 / 100)
    print(f"store {runtime.store.url}")
    print(
        f"  parallel, 8 branches x 100 ms sleep: overhead p50 {pct(overheads, 0.5):.2f} ms, "
        f"p99 {pct(overheads, 0.99):.2f} ms ({runs} runs; goal p50 <= 3 ms)"
    )
    print(
        f"  parallel cut at its deadline: ends {pct(late, 0.5):.2f} ms after it (p50), "
        f"{pct(late, 0.99):.2f} ms (p99) ({len(late)} runs; goal 20 ms)"
    )
    item, step = statistics.median(per_item), statistics.median(per_step)
    print(
        f"  map, {items} no-op items at max_concurrency 64: {item:.3f} ms an item; "
        f"straight durable step {step:.3f} ms; ratio {item / step:.2f}x (goal <= 2x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--store", choices=["sqlite", "redis", "both"], default="both")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--items", type=int, default=1000)
    args = parser.parse_args()
    if args.store in ("sqlite", "both"):
        with tempfile.TemporaryDirectory() as folder:
            asyncio.run(measure(f"sqlite:///{folder}/runs.db", args.runs, args.items))
    if args.store in ("redis", "both"):
        server = RedisServer(durable=True, appendfsync="everysec")
        server.start()
        try:
            asyncio.run(measure(server.url, args.runs, args.items))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
