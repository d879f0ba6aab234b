"""``bench/overhead.py --interleave K``: the step-to-raw ratios of issue 18, round by round.

The one-run-at-a-time mode measures the raw round trip once, after all the runs: on a shared
machine the two halves then see different loads, and the printed ratio moved from 1.4x to 1.8x
between passes of the same code. Here every round runs one chain of ``--steps`` steps and then
``--raw-per-round`` raw round trips on the same store, back to back, and takes that round's
ratios (step p50 / raw p50, step p99 / raw p99). The pass prints the median of the per-round
ratios with a 95 % interval (order statistics, ``_median_ci``), so a reader sees how far the
median can be trusted, and how many rounds met each of the issue's goals (p50 <= 1.5x,
p99 <= 3x).
"""

from __future__ import annotations

import statistics
from collections.abc import Awaitable, Callable
from typing import Any

from _median_ci import order_interval
from _step_samples import Samples, one_run, pct

__all__ = ["P50_GOAL", "P99_GOAL", "rounds"]

P50_GOAL = 1.5
"""Issue 18: a durable step's p50 at most this many raw round trips (one run at a time)."""
P99_GOAL = 3.0
"""Issue 18: a durable step's p99 at most this many times the raw p99."""

RawSamples = Callable[[str, int], Awaitable[tuple[list[float], str]]]


async def rounds(
    runtime: Any, spec: Any, url: str, steps: int, count: int, per_round: int, raw: RawSamples
) -> None:
    """Run ``count`` interleaved rounds on ``runtime`` (warmed up) and print the ratios."""
    p50s: list[float] = []
    p99s: list[float] = []
    all_steps = Samples()
    all_raw: list[float] = []
    name = "raw round trip"
    for _ in range(count):
        mine = Samples()
        await one_run(runtime, spec, steps, mine)
        samples, name = await raw(url, per_round)
        p50s.append(pct(mine.per_step, 0.5) / pct(samples, 0.5))
        p99s.append(pct(mine.per_step, 0.99) / pct(samples, 0.99))
        all_steps.per_step += mine.per_step
        all_raw += samples
    print(f"store            {runtime.store.url}")
    print(
        f"rounds           {count} x (one run of {steps} steps, then {per_round} x {name}), "
        "interleaved"
    )
    print(
        f"all rounds       step p50 {pct(all_steps.per_step, 0.5):.3f} ms, "
        f"p99 {pct(all_steps.per_step, 0.99):.3f} ms; raw p50 {pct(all_raw, 0.5):.3f} ms, "
        f"p99 {pct(all_raw, 0.99):.3f} ms"
    )
    for label, values, goal in (("p50", p50s, P50_GOAL), ("p99", p99s, P99_GOAL)):
        low, high, coverage = order_interval(values)
        met = sum(v <= goal for v in values)
        print(
            f"step {label} / raw {label}  median {statistics.median(values):.2f}x "
            f"({coverage:.0%} interval {low:.2f}-{high:.2f}x); "
            f"rounds within {goal:g}x: {met} of {count}"
        )
