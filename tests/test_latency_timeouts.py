"""Timed-out attempts refresh a model's latency figures (issue 14: the local fallback's estimate
went stale under load, because only its quick attempts answered and were recorded)."""

from __future__ import annotations

import pytest

from chainrt.dispatch._latency import (
    LatencyTracker,
    Sample,
    censored_sample,
    work_units,
)

# A model answering 16 tokens of a 20-token prompt in 0.2 s.
QUICK = Sample(0.2, 20, 16)
QUICK_RATE = 0.2 / work_units(20, 16)


@pytest.mark.parametrize(
    ("samples", "seconds", "prompt", "max_tokens", "expected"),
    [
        # Nothing known: the timeout is all there is, recorded as an answer of max_tokens.
        ([], 0.5, 20, 8, Sample(0.5, 20, 8)),
        # Cut before the model's usual time for the request: says nothing about the model.
        ([QUICK], 0.05, 20, 16, None),
        # Not answered in exactly its usual time: it counts (repeated slow cuts must add up).
        ([QUICK], 0.2, 20, 16, Sample(0.2, 20, 16)),
        # Ran longer than it usually needs for the whole request: the model has slowed down.
        ([QUICK], 0.6, 20, 16, Sample(0.6, 20, 16)),
        # A smaller request cut at the same time is slower per unit of work: recorded.
        ([QUICK], 0.2, 20, 4, Sample(0.2, 20, 4)),
        # Judged against the median rate of what is known, not the slowest sample.
        ([QUICK, QUICK, Sample(1.0, 20, 16)], 0.3, 20, 16, Sample(0.3, 20, 16)),
        # No time spent: nothing to record.
        ([], 0.0, 20, 8, None),
    ],
)
def test_censored_sample(
    samples: list[Sample], seconds: float, prompt: int, max_tokens: int, expected: Sample | None
) -> None:
    assert censored_sample(samples, seconds, prompt, max_tokens) == expected


def test_timeouts_raise_a_stale_baseline_and_quick_cuts_do_not() -> None:
    tracker = LatencyTracker(size=20, min_samples=3)
    tracker.set_baseline("local", [QUICK])
    before = tracker.expected("local", 0.0, prompt_tokens=20, max_tokens=16, q=0.9)
    assert before == pytest.approx(0.2)
    # A cut shorter than the model's usual time is ignored.
    assert not tracker.record_timeout("local", 0.1, 1.0, prompt_tokens=20, max_tokens=16)
    # Three attempts that ran 0.8 s without answering: the model is now slow.
    for now in (2.0, 3.0, 4.0):
        assert tracker.record_timeout("local", 0.8, now, prompt_tokens=20, max_tokens=16)
    after = tracker.expected("local", 5.0, prompt_tokens=20, max_tokens=16, q=0.5)
    assert after == pytest.approx(0.8)
    assert QUICK_RATE * work_units(20, 16) == pytest.approx(0.2)
