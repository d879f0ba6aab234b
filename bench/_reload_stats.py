"""Statistics for ``bench/reload.py``: percentiles, pooled changes and bootstrap intervals.

A 10-second window holds ~100 requests on the H200, so its p99 is about its largest request, and
the p99 change between two adjacent windows moves by tens of percent with nothing happening.
These helpers pool the windows of many episodes (each side then holds hundreds of requests) and
give a percentile bootstrap interval over *episodes* (an episode is resampled whole, so the
requests of one window, which share the load of their moment, stay together).
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Sequence

__all__ = ["Pair", "bootstrap", "change", "p99", "pooled_change", "quantiles", "ratio"]

Pair = tuple[list[float], list[float]]
"""One episode's latencies (seconds): the window before and the window after."""

ROUNDS = 2000
"""Bootstrap resamples."""


def p99(latencies: Sequence[float]) -> float:
    """The 99th percentile (inclusive method: with few samples, close to the largest)."""
    return statistics.quantiles(latencies, n=100, method="inclusive")[98]


def quantiles(latencies: Sequence[float]) -> str:
    """``n=…, p50=… ms, p99=… ms``."""
    if len(latencies) < 2:
        return f"n={len(latencies)} (too few for percentiles)"
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    return f"n={len(latencies)}, p50={cuts[49] * 1000:.0f} ms, p99={cuts[98] * 1000:.0f} ms"


def change(before: Sequence[float], after: Sequence[float]) -> float | None:
    """The p99 change after/before in percent (None with fewer than 2 requests a side)."""
    if len(before) < 2 or len(after) < 2:
        return None
    return 100 * (p99(after) / p99(before) - 1)


def pooled_change(pairs: Sequence[Pair]) -> float | None:
    """The p99 change of all episodes' after windows pooled against their before windows."""
    return change([x for b, _ in pairs for x in b], [x for _, a in pairs for x in a])


def ratio(tested: Sequence[list[float]], control: Sequence[list[float]]) -> float | None:
    """How much the pooled p99 of ``tested`` windows exceeds that of ``control`` ones (%)."""
    return change([x for w in control for x in w], [x for w in tested for x in w])


def bootstrap(
    statistic: Callable[[list[int]], float | None], count: int, *, seed: int = 0
) -> tuple[float, float] | None:
    """The 2.5th and 97.5th percentiles of ``statistic`` over ``ROUNDS`` resamples of
    ``count`` episode indices drawn with replacement (None with fewer than 3 episodes; with
    few, the interval is rough: 5 or more make it worth reading)."""
    if count < 3:
        return None
    draw = random.Random(seed)
    values = []
    for _ in range(ROUNDS):
        value = statistic([draw.randrange(count) for _ in range(count)])
        if value is not None:
            values.append(value)
    if len(values) < 2:
        return None
    cuts = statistics.quantiles(values, n=40, method="inclusive")
    return cuts[0], cuts[-1]
