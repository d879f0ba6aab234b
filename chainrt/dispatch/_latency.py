"""Recent latency of each candidate model: the median of its last N answers (DESIGN §7).

Dispatch uses it twice: a model whose median cannot fit the time left is skipped, and a primary's
attempt is cut short to leave the next fallback the time it needs (its 90th percentile: a
fallback is used in bursts, when its queue is longest). Only answers are
recorded (a timeout says "at least this long", which a median cannot use), and samples older than
``max_age_s`` are forgotten, so a model skipped for being slow is tried again once its old figures
age out. Time is passed in; nothing here reads a clock.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

__all__ = ["LatencyTracker", "median", "too_slow"]


def median(values: list[float]) -> float:
    """The median (mean of the two middle values for an even count); values must not be empty."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def too_slow(p50_s: float | None, left_s: float, *, keep_partial: bool) -> bool:
    """True when a candidate should be skipped: its median answer takes longer than the time left.

    Unknown latency never skips. A step that keeps partial output (``on_timeout: partial``) still
    tries: some tokens before the deadline are worth more than none.
    """
    return p50_s is not None and not keep_partial and p50_s > left_s


@dataclass(slots=True)
class _Window:
    samples: deque[tuple[float, float]]
    """(when, seconds)"""


class LatencyTracker:
    """The last ``size`` answer latencies of each key (a model name)."""

    def __init__(self, *, size: int = 20, min_samples: int = 3, max_age_s: float = 60.0) -> None:
        if size < 1 or not 1 <= min_samples <= size:
            raise ValueError(
                f"need size >= 1 and 1 <= min_samples <= size, got {size=}, {min_samples=}"
            )
        self.size = size
        self.min_samples = min_samples
        self.max_age_s = max_age_s
        self._windows: dict[str, _Window] = {}

    def record(self, key: str, seconds: float, now: float) -> None:
        """Remember one answer of ``key`` that took ``seconds``, finished at ``now``."""
        window = self._windows.get(key)
        if window is None:
            window = self._windows[key] = _Window(deque(maxlen=self.size))
        window.samples.append((now, seconds))

    def p50(self, key: str, now: float) -> float | None:
        """Median seconds of ``key``'s recent answers; None with fewer than ``min_samples``."""
        values = self._recent(key, now)
        return None if values is None else median(values)

    def p90(self, key: str, now: float) -> float | None:
        """90th percentile (nearest rank) of ``key``'s recent answers; None like :meth:`p50`."""
        values = self._recent(key, now)
        if values is None:
            return None
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]

    def _recent(self, key: str, now: float) -> list[float] | None:
        window = self._windows.get(key)
        if window is None:
            return None
        while window.samples and now - window.samples[0][0] > self.max_age_s:
            window.samples.popleft()
        if len(window.samples) < self.min_samples:
            return None
        return [seconds for _, seconds in window.samples]
