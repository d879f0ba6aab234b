"""Two decisions of issue 14 (a hung primary must not starve the local fallback): timed-out
attempts refresh a model's latency figures (under load only the local model's quick attempts
answered and were recorded), and an attempt too short to answer is not started."""

from __future__ import annotations

import pytest

from chainrt.dispatch._latency import (
    LatencyTracker,
    Sample,
    censored_sample,
    work_units,
)
from chainrt.dispatch._policy import MIN_USEFUL_ATTEMPT_S, worth_starting

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


@pytest.mark.parametrize(
    ("span", "own_p50", "fallback_next", "expected"),
    [
        (0.005, None, True, False),  # the reserve took the step: 5 ms cannot answer
        (0.005, None, False, True),  # the last candidate is always tried
        (MIN_USEFUL_ATTEMPT_S, None, True, True),
        (0.15, 0.4, True, False),  # under half its median: it would only time out
        (0.2, 0.4, True, True),  # half its median: it may still answer
        (0.3, 0.4, True, True),
        (0.3, 0.4, False, True),
    ],
)
def test_worth_starting(
    span: float, own_p50: float | None, fallback_next: bool, expected: bool
) -> None:
    assert worth_starting(span, own_p50, fallback_next=fallback_next) is expected


def test_censored_sample_counts_the_queue_apart() -> None:
    # 0.66 s behind two attempts in flight: its own share is at least 0.22 s, over its usual.
    got = censored_sample([QUICK], 0.66, 20, 16, ahead=2)
    assert got is not None
    assert got.seconds == pytest.approx(0.22)
    assert (got.prompt_tokens, got.completion_tokens) == (20, 16)
    # 0.3 s behind two: 0.1 s of its own, quicker than usual: no news.
    assert censored_sample([QUICK], 0.3, 20, 16, ahead=2) is None
