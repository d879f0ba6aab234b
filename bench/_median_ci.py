"""A 95 % interval of a median from paired rounds: how far a median ratio can be trusted.

``bench/overhead.py --store redis-cluster`` judges the cluster against one server by the median of
per-round ratios (one run on each backend per round, interleaved). On a shared 2-CPU machine single
rounds range from a fifth to five times, so the median of a few rounds moves from pass to pass.
Two intervals say how far it can be from the true median of the rounds' distribution:

- :func:`order_interval`: distribution-free. With ``n`` independent rounds, the number below the
  true median is Binomial(n, 1/2); the interval between the ``j``-th and the ``(n+1-j)``-th
  smallest covers it with probability ``1 - 2 P(B < j)``, exactly. ``j`` is the largest rank for
  which that coverage is still at least the level asked for; the coverage reached is returned.
- :func:`bootstrap_interval`: the percentile bootstrap of the median (resampled rounds, seeded, so
  a pass prints the same interval for the same samples).

Both assume independent rounds; a stretch of load that lasts many rounds breaks that for both.
"""

from __future__ import annotations

import math
import random
import statistics

__all__ = ["bootstrap_interval", "order_interval"]


def order_interval(values: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """``(low, high, coverage)``: order statistics around the median of ``values`` covering the
    true median with probability ``coverage >= level`` (binomial, exact). With too few values for
    ``level`` (fewer than 6 at 95 %) the whole range is returned with the coverage it has."""
    if not values:
        raise ValueError("no values")
    if not 0 < level < 1:
        raise ValueError(f"level must be between 0 and 1, got {level}")
    ordered = sorted(values)
    n = len(ordered)

    def coverage(rank: int) -> float:  # 1 - 2 P(B < rank), B ~ Binomial(n, 1/2)
        return 1 - 2 * sum(math.comb(n, i) for i in range(rank)) / float(2**n)

    rank = 1  # the low end's 1-based rank; the high end's is n + 1 - rank
    while rank + 1 <= (n + 1) // 2 and coverage(rank + 1) >= level:
        rank += 1
    return float(ordered[rank - 1]), float(ordered[n - rank]), coverage(rank)


def bootstrap_interval(
    values: list[float], level: float = 0.95, *, resamples: int = 10_000, seed: int = 16
) -> tuple[float, float]:
    """``(low, high)``: the percentile bootstrap interval of the median of ``values``."""
    if not values:
        raise ValueError("no values")
    rng = random.Random(seed)
    n = len(values)
    medians = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(resamples))
    tail = (1 - level) / 2
    return medians[int(tail * resamples)], medians[min(resamples - 1, int((1 - tail) * resamples))]
