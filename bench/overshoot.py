"""Budget overshoot: how far past its allotment a step ends, and past its budget a run ends.

    .venv/bin/python bench/overshoot.py [--tool-steps 2000] [--llm-steps 400] [--concurrency 8]
        [--llm-concurrency 2] [--latency-ms 50] [--no-llm | --no-tools] [--show-worst N]

Tool steps: runs of 10 optional tool steps with a budget of 0.5-2 s (so allotments of about
50-200 ms), each step a random tool — sync (``time.sleep`` in a thread, abandoned at the
deadline), async (``asyncio.sleep``, cancelled at the deadline) or async and stubborn (it takes
50 ms to give up once cancelled) — sleeping a random time: 70 % of them well inside the step's
expected allotment, 30 % one and a half to three times past it.

LLM steps: runs of 8 optional LLM steps (4 tokens each) against a real worker (llama.cpp,
SmolLM2) with ``--latency-ms`` of injected latency, budgets of 1-4 s: a good share of the
steps hit their deadline at the worker or in dispatch.

``--concurrency`` tool runs (``--llm-concurrency`` LLM runs) go at once on one runner, so the event loop is as busy as a runner
serving several runs. Overshoot of a step = ``elapsed_ms - allotted_ms`` (0 when it ended
early), printed as p50/p99/p99.9/max per step kind over the steps that hit their deadline and
over all steps; a run's overshoot = ``used_ms - total_ms``. Goal: p99.9 of step overshoot
<= 20 ms on 2 cores.

Beside each figure the bench prints the event loop's own lateness measured in the same run (a
task that sleeps 1 ms, over and over): a timer cannot fire before the loop gets the CPU back,
so on a loaded machine that lateness is the floor under any overshoot.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

from _workers import local_workers, percentiles  # noqa: E402

from chainrt._result import RunResult  # noqa: E402
from chainrt._runtime import open_runtime  # noqa: E402
from chainrt.dispatch import make_dispatcher, parse_pool_config  # noqa: E402
from chainrt.spec import spec_from_dict  # noqa: E402

TOOLS = ("sync_sleep", "async_sleep", "async_stubborn")
TOOL_STEPS_PER_RUN = 10
LLM_STEPS_PER_RUN = 8


def _tool_chain(rng: random.Random, index: int) -> dict[str, Any]:
    budget_ms = rng.uniform(500, 2000)
    expected = budget_ms / TOOL_STEPS_PER_RUN
    steps = []
    for i in range(TOOL_STEPS_PER_RUN):
        tool = rng.choice(TOOLS)
        late = rng.random() < 0.3
        ms = expected * rng.uniform(1.5, 3.0) if late else expected * rng.uniform(0.0, 0.5)
        steps.append(
            {
                "id": f"s{i}",
                "tool": f"_overshoot_tools.py:{tool}",
                "args": {"ms": round(ms, 1)},
                "optional": True,
            }
        )
    return {"name": f"overshoot-tools-{index}", "budget": f"{budget_ms:.0f}ms", "steps": steps}


def _llm_chain(rng: random.Random, index: int) -> dict[str, Any]:
    budget_ms = rng.uniform(1000, 4000)
    steps = [
        {
            "id": f"s{i}",
            "llm": {"model": "primary", "prompt": f"Say OK {i}", "max_tokens": 4},
            "optional": True,
        }
        for i in range(LLM_STEPS_PER_RUN)
    ]
    return {"name": f"overshoot-llm-{index}", "budget": f"{budget_ms:.0f}ms", "steps": steps}


def _line(label: str, values: list[float]) -> str:
    if not values:
        return f"  {label:<34} (none)"
    return f"  {label:<34} n={len(values):<5} " + percentiles(
        values, "p50", "p99", "p99.9", "max", width=6, digits=2, sep="  "
    )


async def _loop_lag(lags: list[float]) -> None:
    """Record how late a 1 ms sleep wakes up, until cancelled."""
    while True:
        started = time.perf_counter()
        await asyncio.sleep(0.001)
        lags.append(max((time.perf_counter() - started) * 1000 - 1.0, 0.0))


async def _worst(runtime: Any, results: list[RunResult], n: int) -> list[str]:
    """The ``n`` steps that overshot most, each with its attempts (where the time went)."""
    over = sorted(
        ((s.elapsed_ms - s.allotted_ms, r.run_id, s.id) for r in results for s in r.steps),
        reverse=True,
    )[:n]
    lines = []
    for late, run_id, step_id in over:
        rec = (await runtime.store.get_steps(run_id))[step_id]
        attempts = ", ".join(
            f"{a.status} {a.elapsed_ms:.1f}ms" + (f" ({a.detail[:80]})" if a.detail else "")
            for a in rec.attempt_log
        )
        lines.append(
            f"    +{late:.1f} ms  {run_id}/{step_id} {rec.status} allotted {rec.allotted_ms:.1f}"
            f" elapsed {rec.elapsed_ms:.1f}: {attempts or 'no attempts'}"
        )
    return lines


async def _runs(
    specs: list[dict[str, Any]], store: str, pool: Any, concurrency: int, show_worst: int = 0
) -> tuple[list[RunResult], list[float]]:
    gate = asyncio.Semaphore(concurrency)
    results: list[RunResult] = []
    lags: list[float] = []
    async with open_runtime(store=store, pool=pool) as runtime:

        async def one(spec: dict[str, Any], i: int) -> None:
            async with gate:
                results.append(
                    await runtime.runner.run(
                        spec_from_dict(spec), {}, source_dir=BENCH, run_id=f"{spec['name']}-{i}"
                    )
                )

        monitor = asyncio.create_task(_loop_lag(lags))
        try:
            await asyncio.gather(*(one(spec, i) for i, spec in enumerate(specs)))
        finally:
            monitor.cancel()
        if show_worst:
            print("\n".join(["  worst steps:", *await _worst(runtime, results, show_worst)]))
    return results, lags


def _report(
    kind: str,
    results: list[RunResult],
    lags: list[float],
    wall_s: float,
    tools: dict[tuple[str, str], str] | None = None,
) -> None:
    steps = [s for r in results for s in r.steps if s.status != "skipped" or s.elapsed_ms > 0]
    over = [max(s.elapsed_ms - s.allotted_ms, 0.0) for s in steps]
    hit = [
        max(s.elapsed_ms - s.allotted_ms, 0.0)
        for s in steps
        if s.elapsed_ms >= s.allotted_ms * 0.98 or s.status in ("timed_out", "skipped")
    ]
    runs = [max(r.budget.used_ms - r.budget.total_ms, 0.0) for r in results]
    statuses = collections.Counter(s.status for s in steps)
    print(
        f"{kind}: {len(results)} runs, {len(steps)} steps run [{wall_s:.0f}s]; steps: "
        + ", ".join(f"{k} {v}" for k, v in statuses.most_common())
    )
    errors = collections.Counter(s.error[:150] for s in steps if s.error)
    for error, n in errors.most_common(3):
        print(f"    {n}x {error}")
    print(_line("step overshoot, steps at deadline", hit))
    print(_line("step overshoot, all steps", over))
    print(_line("run overshoot (used - budget)", runs))
    print(_line("event loop lateness (1 ms sleeps)", lags))
    if tools:
        for name in TOOLS:
            print(
                _line(
                    f"  {name}, all steps",
                    [
                        max(s.elapsed_ms - s.allotted_ms, 0.0)
                        for r in results
                        for s in r.steps
                        if tools.get((r.chain, s.id)) == name
                    ],
                )
            )


async def _main(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        specs = [_tool_chain(rng, i) for i in range(args.tool_steps // TOOL_STEPS_PER_RUN)]
        if not args.no_tools:
            started = time.perf_counter()
            results, lags = await _runs(specs, f"sqlite:///{tmp}/tools.db", None, args.concurrency)
            tools = {
                (spec["name"], step["id"]): step["tool"].split(":")[1]
                for spec in specs
                for step in spec["steps"]
            }
            _report("tool steps", results, lags, time.perf_counter() - started, tools)
        if args.no_llm:
            return
        with local_workers(1, "--enable-fault-injection", "--health-interval", "600") as workers:
            worker = workers[0]
            worker.faults(latency_ms=args.latency_ms)
            pool = parse_pool_config(
                "models:\n  primary:\n    served_model: smol\n"
                f"    endpoints: [{{url: '{worker.base}'}}]\n"
                # Timeouts are the point here: no breaker may take the worker out of the pool.
                "breakers: {timeout: {window: 100000, min_requests: 100000}}\n"
            )
            dispatcher = make_dispatcher(pool)
            specs = [_llm_chain(rng, i) for i in range(args.llm_steps // LLM_STEPS_PER_RUN)]
            started = time.perf_counter()
            try:
                results, lags = await _runs(
                    specs,
                    f"sqlite:///{tmp}/llm.db",
                    dispatcher,
                    args.llm_concurrency,
                    args.show_worst,
                )
            finally:
                await dispatcher.close()
            _report(
                f"llm steps (worker +{args.latency_ms:g} ms)",
                results,
                lags,
                time.perf_counter() - started,
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tool-steps", type=int, default=2000)
    parser.add_argument("--llm-steps", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument(
        "--llm-concurrency",
        type=int,
        default=2,
        help="runs at once in the LLM part (the worker generates one request at a time)",
    )
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--no-llm", action="store_true", help="tool steps only (no worker)")
    parser.add_argument("--no-tools", action="store_true", help="LLM steps only")
    parser.add_argument(
        "--show-worst", type=int, default=0, help="print the N latest LLM steps' attempts"
    )
    args = parser.parse_args()
    asyncio.run(_main(args))


if __name__ == "__main__":
    main()
