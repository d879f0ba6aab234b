"""Recent latency of each candidate model and endpoint, by request size (docs/dispatch.md).

Dispatch uses it three ways: a model whose expected time cannot fit the time left is skipped; a
primary's attempt is cut short to leave the next fallback the time it is expected to need (its
90th percentile: a fallback is used in bursts, when its queue is longest); a hedged attempt
starts when the first one is slower than its endpoint's recent 95th percentile.

Answers of different sizes take different times, so a sample is kept with its size and turned
into *seconds per unit of work* (:func:`work_units`: a fixed overhead, the prompt at a fraction
of a generated token's cost, and each generated token). A request's expected time is a quantile
of those rates times the request's own work, counted with its ``max_tokens`` (the most it may
generate: a reserve must cover the long answer, not the usual one).

A model with no answers yet may have a *baseline*: samples measured when it was loaded (the
in-process model measures one short generation, see :class:`~._backend.LocalBackend`). The
baseline stands in until enough real answers arrive, then real answers refresh the figure.
A timed-out attempt says "at least this long": :func:`censored_sample` turns it into a sample
(its seconds over the work of its whole ``max_tokens``, a lower bound of its true rate) when that
rate is not quicker than the median of what is known, and only then. Recording only answers made the
figures of a model slowed by load stale: its slow attempts were cut and never counted, so the
reserve kept sizing its fallback from the quick ones (issue 14). Samples older than
``max_age_s`` are forgotten, so a model skipped for being slow is tried again once its old
figures age out. Time is passed in; nothing here reads a clock.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "OVERHEAD_UNITS",
    "PREFILL_WEIGHT",
    "LatencyTracker",
    "Sample",
    "censored_sample",
    "estimate_prompt_tokens",
    "expected_seconds",
    "median",
    "quantile",
    "too_slow",
    "work_units",
]

OVERHEAD_UNITS = 4.0
"""Fixed cost of any request (HTTP, scheduling, the first token), in generated-token units."""
PREFILL_WEIGHT = 0.1
"""Cost of one prompt token relative to one generated token (prompts are processed in batches)."""
CHARS_PER_TOKEN = 4.0
"""Rough characters per token, to size a prompt before it is tokenised."""
TOKENS_PER_MESSAGE = 4
"""Chat-template tokens added around each message."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One answer: how long it took and how big it was."""

    seconds: float
    prompt_tokens: int = 0
    completion_tokens: int = 0


def work_units(prompt_tokens: int, completion_tokens: int) -> float:
    """The work of a request in generated-token units (always > 0)."""
    return OVERHEAD_UNITS + PREFILL_WEIGHT * max(prompt_tokens, 0) + max(completion_tokens, 0)


def estimate_prompt_tokens(messages: Sequence[tuple[str, str]]) -> int:
    """A prompt's size in tokens, estimated from its characters (no tokenizer needed)."""
    chars = sum(len(content) for _, content in messages)
    return math.ceil(chars / CHARS_PER_TOKEN) + TOKENS_PER_MESSAGE * len(messages)


def median(values: Sequence[float]) -> float:
    """The median (mean of the two middle values for an even count); values must not be empty."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (nearest rank; ``q`` = 0.5 is the median); values must not be empty."""
    if q == 0.5:
        return median(values)
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(math.ceil(q * len(ordered)) - 1, 0))]


def expected_seconds(
    samples: Sequence[Sample], prompt_tokens: int, max_tokens: int, q: float
) -> float | None:
    """The ``q`` quantile of the time a request of this size takes, judged from ``samples``.

    None without samples. Each sample's seconds per work unit is one observation; the request's
    work counts all of its ``max_tokens``.
    """
    if not samples:
        return None
    rates = [s.seconds / work_units(s.prompt_tokens, s.completion_tokens) for s in samples]
    return quantile(rates, q) * work_units(prompt_tokens, max_tokens)


def censored_sample(
    samples: Sequence[Sample],
    seconds: float,
    prompt_tokens: int,
    max_tokens: int,
    ahead: int = 0,
) -> Sample | None:
    """The sample a timed-out attempt adds to ``samples``, or None when it tells nothing new.

    The attempt ran ``seconds`` without finishing a request of at most ``max_tokens``, behind
    ``ahead`` attempts already in flight on the same model (one generation at a time): its own
    share is at least ``seconds / (1 + ahead)`` (the queue is counted apart, by the reserve's
    ``in_flight``), so its rate is at least that over ``work_units(prompt_tokens, max_tokens)``.
    That lower bound is
    recorded (as an answer of ``max_tokens``) only when it is not quicker than the median rate of
    ``samples`` (or there are none): an attempt cut before the model's usual time says nothing
    about the model, one cut after it says the model has slowed down.
    """
    seconds /= 1 + max(ahead, 0)
    if seconds <= 0:
        return None
    sample = Sample(seconds, prompt_tokens, max(max_tokens, 0))
    if samples:
        rate = seconds / work_units(prompt_tokens, max_tokens)
        rates = [s.seconds / work_units(s.prompt_tokens, s.completion_tokens) for s in samples]
        if rate < median(rates):
            return None
    return sample


def too_slow(p50_s: float | None, left_s: float, *, keep_partial: bool) -> bool:
    """True when a candidate should be skipped: its median answer takes longer than the time left.

    Unknown latency never skips. A step that keeps partial output (``on_timeout: partial``) still
    tries: some tokens before the deadline are worth more than none.
    """
    return p50_s is not None and not keep_partial and p50_s > left_s


@dataclass(slots=True)
class _Window:
    samples: deque[tuple[float, Sample]]
    """(when, sample)"""


class LatencyTracker:
    """The last ``size`` answers of each key (a model name, or ``model@endpoint``)."""

    def __init__(self, *, size: int = 20, min_samples: int = 3, max_age_s: float = 60.0) -> None:
        if size < 1 or not 1 <= min_samples <= size:
            raise ValueError(
                f"need size >= 1 and 1 <= min_samples <= size, got {size=}, {min_samples=}"
            )
        self.size = size
        self.min_samples = min_samples
        self.max_age_s = max_age_s
        self._windows: dict[str, _Window] = {}
        self._baselines: dict[str, tuple[Sample, ...]] = {}

    def record(
        self,
        key: str,
        seconds: float,
        now: float,
        *,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
    ) -> None:
        """Remember one answer of ``key`` that took ``seconds``, finished at ``now``."""
        window = self._windows.get(key)
        if window is None:
            window = self._windows[key] = _Window(deque(maxlen=self.size))
        window.samples.append((now, Sample(seconds, prompt_tokens, completion_tokens)))

    def record_timeout(
        self,
        key: str,
        seconds: float,
        now: float,
        *,
        prompt_tokens: int,
        max_tokens: int,
        ahead: int = 0,
    ) -> bool:
        """Remember that an attempt of ``key`` ran ``seconds`` without answering a request of
        ``max_tokens`` (see :func:`censored_sample`); True when it was recorded.

        Judged against what :meth:`expected` would use now (recent answers, or the baseline
        while they are too few).
        """
        known = self._young(key, now)
        if len(known) < self.min_samples:
            known += self._baselines.get(key, ())
        sample = censored_sample(known, seconds, prompt_tokens, max_tokens, ahead)
        if sample is None:
            return False
        self.record(
            key,
            sample.seconds,
            now,
            prompt_tokens=sample.prompt_tokens,
            completion_tokens=sample.completion_tokens,
        )
        return True

    def set_baseline(self, key: str, samples: Sequence[Sample]) -> None:
        """Samples measured at load, used while ``key`` has fewer than ``min_samples`` answers."""
        self._baselines[key] = tuple(samples)

    def has_baseline(self, key: str) -> bool:
        """True when :meth:`set_baseline` gave ``key`` samples."""
        return bool(self._baselines.get(key))

    def p50(self, key: str, now: float) -> float | None:
        """Median seconds of ``key``'s recent answers; None with fewer than ``min_samples``."""
        values = self._recent(key, now)
        return None if values is None else median([s.seconds for s in values])

    def p90(self, key: str, now: float) -> float | None:
        """90th percentile (nearest rank) of ``key``'s recent answers; None like :meth:`p50`."""
        values = self._recent(key, now)
        return None if values is None else quantile([s.seconds for s in values], 0.9)

    def seconds_quantile(self, key: str, now: float, q: float) -> float | None:
        """The ``q`` quantile (nearest rank) of ``key``'s recent answer times, whatever their
        size; None like :meth:`p50` (hedging compares an attempt's time with it)."""
        values = self._recent(key, now)
        return None if values is None else quantile([s.seconds for s in values], q)

    def expected(
        self, key: str, now: float, *, prompt_tokens: int, max_tokens: int, q: float
    ) -> float | None:
        """The ``q`` quantile of the time ``key`` needs for a request of this size.

        From its recent answers, with its baseline added while they are fewer than
        ``min_samples``; None when there is nothing to go by (an answer or two without a
        baseline are too few to trust).
        """
        values = self._young(key, now)
        if len(values) < self.min_samples:
            baseline = self._baselines.get(key)
            if not baseline:
                return None
            values += baseline
        return expected_seconds(values, prompt_tokens, max_tokens, q)

    def _recent(self, key: str, now: float) -> list[Sample] | None:
        values = self._young(key, now)
        return values if len(values) >= self.min_samples else None

    def _young(self, key: str, now: float) -> list[Sample]:
        window = self._windows.get(key)
        if window is None:
            return []
        while window.samples and now - window.samples[0][0] > self.max_age_s:
            window.samples.popleft()
        return [sample for _, sample in window.samples]
