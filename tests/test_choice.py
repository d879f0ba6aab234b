"""Endpoint choice (pure, table-tested) and the pure retry / reserve / latency decisions."""

from __future__ import annotations

import time

import pytest

from chainrt.dispatch._choice import Candidate, choose, weight
from chainrt.dispatch._latency import (
    LatencyTracker,
    Sample,
    estimate_prompt_tokens,
    expected_seconds,
    median,
    too_slow,
    work_units,
)
from chainrt.dispatch._policy import (
    ContextFit,
    Failure,
    MoveOn,
    NextCandidate,
    Retry,
    attempt_end,
    attempt_plan,
    decide_retry,
    fallback_need,
    fit_context,
    judged_after,
    next_tried,
    queued_out,
    reserve_for,
    retry_fits,
    trial_span,
)

A = Candidate("a", capacity=3.0)
B = Candidate("b", capacity=1.0)


@pytest.mark.parametrize(
    ("candidates", "r", "expected"),
    [
        ([A, B], 0.0, 0),
        ([A, B], 0.74, 0),  # a has 3/4 of the weight
        ([A, B], 0.75, 1),
        ([A, B], 0.999, 1),
        # In-flight load shrinks a's share: 3/(1+2)=1 vs 1 → half each.
        ([Candidate("a", 3.0, in_flight=2), B], 0.49, 0),
        ([Candidate("a", 3.0, in_flight=2), B], 0.5, 1),
        # Unusable endpoints (not ready, circuit open, Retry-After) never win.
        ([Candidate("a", 3.0, usable=False), B], 0.0, 1),
        ([Candidate("a", 3.0, usable=False), Candidate("b", 1.0, usable=False)], 0.3, None),
        ([], 0.3, None),
        # An endpoint that failed in this step is a last resort only.
        ([Candidate("a", 3.0, avoided=True), B], 0.0, 1),
        ([Candidate("a", 3.0, avoided=True), Candidate("b", 1.0, usable=False)], 0.9, 0),
        # Zero capacity is never chosen.
        ([Candidate("a", 0.0), B], 0.0, 1),
    ],
)
def test_choose(candidates: list[Candidate], r: float, expected: int | None) -> None:
    assert choose(candidates, r) == expected


def test_choice_shares_follow_capacity() -> None:
    picks = [choose([A, B], i / 1000) for i in range(1000)]
    assert picks.count(0) == 750
    assert picks.count(1) == 250


@pytest.mark.parametrize("r", [-0.1, 1.0, 2.0])
def test_choose_rejects_r_outside_unit_interval(r: float) -> None:
    with pytest.raises(ValueError, match="r must be in"):
        choose([A], r)


def test_weight() -> None:
    assert weight(Candidate("x", 8.0, in_flight=3)) == 2.0
    assert weight(Candidate("x", 8.0, usable=False)) == 0.0


# ------------------------------------------------------------------ latency


def test_median_and_tracker_window_and_age() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 2.0, 3.0]) == 2.5
    tracker = LatencyTracker(size=3, min_samples=2, max_age_s=10.0)
    tracker.record("m", 1.0, now=0.0)
    assert tracker.p50("m", now=0.0) is None  # below min_samples
    tracker.record("m", 3.0, now=1.0)
    assert tracker.p50("m", now=1.0) == 2.0
    for now in (2.0, 3.0, 4.0):
        tracker.record("m", 0.5, now=now)
    assert tracker.p50("m", now=4.0) == 0.5  # only the last 3 are kept
    assert tracker.p90("m", now=4.0) == 0.5
    assert tracker.p50("m", now=12.5) == 0.5  # the samples from 3.0 and 4.0 are still young
    assert tracker.p50("m", now=15.0) is None  # all aged out
    assert tracker.p50("other", now=0.0) is None


@pytest.mark.parametrize(
    ("p50", "left", "keep_partial", "expected"),
    [
        (None, 0.1, False, False),
        (0.5, 1.0, False, False),
        (1.5, 1.0, False, True),
        (1.5, 1.0, True, False),  # partial output beats none
    ],
)
def test_too_slow(p50: float | None, left: float, keep_partial: bool, expected: bool) -> None:
    assert too_slow(p50, left, keep_partial=keep_partial) is expected


# ------------------------------------------------------------------ reserve and attempt end


@pytest.mark.parametrize(
    ("rest", "left", "expected"),
    [
        ([], 2.0, 0.0),
        ([NextCandidate("static", static=True)], 2.0, 0.0),
        ([NextCandidate("local", 0.2, 0.3)], 2.0, 0.6),  # its p90 × 2
        ([NextCandidate("local", 0.25)], 2.0, 0.5),  # no p90: its p50 × 2
        ([NextCandidate("local", None)], 2.0, 0.5),  # unknown: a quarter of the time left
        # The margin is trimmed to leave half the time left; the expected 1.5 s is kept whole
        # (issue 14: a hung primary must not starve the fallback that answers in time).
        ([NextCandidate("local", 0.9, 1.5)], 2.0, 1.5),
        ([NextCandidate("local", 0.4, 0.6)], 2.0, 1.0),  # 2 × 0.6 trimmed to half of 2 s
        ([NextCandidate("local", 1.5, 2.5)], 2.0, 2.0),  # p90 past the time left: all of it
        ([NextCandidate("local", 3.0, 4.0)], 2.0, 0.0),  # cannot fit anyway: no reserve for it
        ([NextCandidate("down", 0.1, usable=False), NextCandidate("local", 0.2, 0.3)], 2.0, 0.6),
        ([NextCandidate("local", 3.0), NextCandidate("static", static=True)], 2.0, 0.0),
        # Three attempts already wait at the fallback: each costs its median more.
        ([NextCandidate("local", 0.1, 0.2, in_flight=3)], 2.0, 0.7),
        # Figures that say the fallback is quick still leave it 15 % of the time left: they
        # were taken on a quiet moment, and a loaded machine slows it several times (issue 14).
        ([NextCandidate("local", 0.02, 0.035)], 6.0, 0.9),
        ([NextCandidate("local", 0.02, 0.035)], 0.2, 0.07),  # 2 × its p90 is above 15 %
        ([NextCandidate("local", 0.02, 0.035, in_flight=2)], 6.0, 0.9),
        ([NextCandidate("down", usable=False), NextCandidate("local", 0.01)], 1.0, 0.15),
    ],
)
def test_reserve_for(rest: list[NextCandidate], left: float, expected: float) -> None:
    assert reserve_for(rest, left, keep_partial=False) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("rest", "left", "expected"),
    [
        ([], 2.0, 0.0),
        ([NextCandidate("local", None)], 2.0, 0.0),  # unknown: nothing is known to be needed
        ([NextCandidate("local", 0.2, 0.3)], 2.0, 0.3),  # its p90, no margin
        ([NextCandidate("local", 0.2)], 2.0, 0.2),  # no p90: its median
        ([NextCandidate("local", 0.1, 0.2, in_flight=3)], 2.0, 0.5),  # + 3 medians of queue
        ([NextCandidate("local", 0.9, 2.5)], 2.0, 2.0),  # never more than the time left
        # Queued so deep that 4 medians (3 waiting + its own) pass the time left: it cannot make
        # it, so no time is kept for it (issue 14: a congested fallback starved a healthy primary).
        ([NextCandidate("local", 0.6, 0.8, in_flight=3)], 2.0, 0.0),
        ([NextCandidate("local", 0.5, 0.8, in_flight=3)], 2.0, 2.0),  # 4 medians just fit
        ([NextCandidate("static", static=True), NextCandidate("local", 0.2, 0.3)], 2.0, 0.0),
        ([NextCandidate("down", 0.1, usable=False), NextCandidate("local", 0.2, 0.3)], 2.0, 0.3),
    ],
)
def test_fallback_need(rest: list[NextCandidate], left: float, expected: float) -> None:
    assert fallback_need(rest, left, keep_partial=False) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("own_p90", "expected"),
    [
        (None, 1.0),  # unknown: only an attempt that ran a full second counts
        (0.8, 0.8),  # its usual 90th percentile for this request
    ],
)
def test_judged_after(own_p90: float | None, expected: float) -> None:
    assert judged_after(own_p90) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("own_p90", "something_after", "expected"),
    [
        (0.6, True, 0.6),  # the model's usual 90th percentile tells whether it answers again
        (0.05, True, 0.25),  # never below MIN_STUCK_S: tiny answers' figures are noisy
        (0.6, False, None),  # the trial is the step's last chance: not capped
        (None, True, None),  # nothing known of the model: not capped
    ],
)
def test_trial_span(own_p90: float | None, something_after: bool, expected: float | None) -> None:
    got = trial_span(own_p90, something_after=something_after)
    assert got == (None if expected is None else pytest.approx(expected))


LOCAL = NextCandidate("local", 0.3, 0.5)


@pytest.mark.parametrize(
    ("queue", "own_p50", "span", "fallback", "left", "expected"),
    [
        # Two requests ahead of a 0.4 s primary: its answer in ~1.2 s misses a 1.0 s cut, and
        # the free local model answers in ~0.5 s: go there at once.
        (2, 0.4, 1.0, LOCAL, 2.0, True),
        (1, 0.4, 1.0, LOCAL, 2.0, False),  # one ahead: ~0.8 s fits the cut; wait for it
        (0, 0.4, 0.3, LOCAL, 2.0, False),  # nothing queued: an ordinary attempt
        (2, None, 1.0, LOCAL, 2.0, False),  # primary's latency unknown: nothing is skipped
        (2, 0.4, 1.0, NextCandidate("local", 0.3, 0.5, in_flight=1), 2.0, False),  # busy too
        (2, 0.4, 1.0, NextCandidate("local", None), 2.0, False),  # fallback unknown
        (2, 0.4, 1.0, None, 2.0, False),  # no fallback
        (2, 0.4, 1.0, NextCandidate("local", 0.3, 1.4), 2.0, False),  # its p90 is no sooner
        (2, 0.4, 0.2, NextCandidate("local", 0.3, 0.5), 0.4, False),  # it does not fit the time
        (5, 0.4, 1.0, NextCandidate("local", 0.3), 2.0, True),  # its median when no p90
    ],
)
def test_queued_out(
    queue: int,
    own_p50: float | None,
    span: float,
    fallback: NextCandidate | None,
    left: float,
    expected: bool,
) -> None:
    assert queued_out(queue, own_p50, span, fallback, left) is expected


def test_next_tried_skips_unusable_and_stops_at_static() -> None:
    down = NextCandidate("down", 0.1, usable=False)
    static = NextCandidate("static", static=True)
    assert next_tried([down, LOCAL], 2.0, keep_partial=False) == LOCAL
    assert next_tried([static, LOCAL], 2.0, keep_partial=False) is None
    assert next_tried([], 2.0, keep_partial=False) is None


@pytest.mark.parametrize(
    ("reserve", "own_p50", "keep", "expected"),
    [
        (5.0, 3.0, 0.0, 6.0),  # 2 × its own p50 beats the reserve's margin ...
        (5.0, 4.5, 2.0, 8.0),  # ... but stops where the fallback's expected need begins
        (5.0, 3.0, 5.0, 5.0),  # ... which it never eats into
        (1.0, None, 1.0, 9.0),  # unknown own latency: the reserve rules
    ],
)
def test_attempt_end_keeps_the_fallbacks_need(
    reserve: float, own_p50: float | None, keep: float, expected: float
) -> None:
    end = attempt_end(
        0.0, 10.0, reserve_s=reserve, own_p50_s=own_p50, attempt_timeout_s=None, keep_s=keep
    )
    assert end == pytest.approx(expected)


@pytest.mark.parametrize(
    ("samples", "prompt", "max_tokens", "q", "expected"),
    [
        ([], 10, 10, 0.9, None),
        # 1 s for 4 + 0.1 × 60 + 10 = 20 units: 50 ms a unit; 20 + 0.1 × 60 + 4 = 30 units.
        ([Sample(1.0, 60, 10)], 60, 20, 0.9, 1.5),
        ([Sample(1.0, 60, 10)], 0, 16, 0.5, 1.0),  # a shorter prompt, more tokens: same work
        # Rates 10, 20, 30 ms a unit (20 units each): median 20 ms, p90 30 ms; 50 units asked.
        ([Sample(0.2, 60, 10), Sample(0.4, 60, 10), Sample(0.6, 60, 10)], 60, 40, 0.5, 1.0),
        ([Sample(0.2, 60, 10), Sample(0.4, 60, 10), Sample(0.6, 60, 10)], 60, 40, 0.9, 1.5),
    ],
)
def test_expected_seconds_scales_with_the_request(
    samples: list[Sample], prompt: int, max_tokens: int, q: float, expected: float | None
) -> None:
    got = expected_seconds(samples, prompt, max_tokens, q)
    assert got == (None if expected is None else pytest.approx(expected))


def test_tracker_baseline_stands_in_until_answers_arrive() -> None:
    tracker = LatencyTracker(size=5, min_samples=2, max_age_s=10.0)
    size = {"prompt_tokens": 60, "max_tokens": 10}
    assert tracker.expected("local", 0.0, q=0.9, **size) is None
    tracker.record("local", 4.0, now=0.0, prompt_tokens=60, completion_tokens=10)
    assert tracker.expected("local", 0.0, q=0.9, **size) is None  # one answer is too few
    tracker.set_baseline("local", [Sample(1.0, 60, 10)])
    assert tracker.has_baseline("local")
    # One answer and the baseline together: the slower one is the 90th percentile.
    assert tracker.expected("local", 0.0, q=0.9, **size) == pytest.approx(4.0)
    tracker.record("local", 2.0, now=1.0, prompt_tokens=60, completion_tokens=10)
    # Enough answers: the baseline no longer counts.
    assert tracker.expected("local", 1.0, q=0.5, **size) == pytest.approx(3.0)
    # The answers age out: the baseline stands in again.
    assert tracker.expected("local", 12.0, q=0.5, **size) == pytest.approx(1.0)


def test_prompt_tokens_estimate() -> None:
    assert estimate_prompt_tokens([]) == 0
    assert estimate_prompt_tokens([("user", "x" * 40)]) == 14  # 10 + 4 for the template
    assert work_units(0, 0) == pytest.approx(4.0)


@pytest.mark.parametrize(
    ("reserve", "own_p50", "timeout", "expected"),
    [
        (0.0, None, None, 10.0),  # the whole allotment
        (0.5, None, None, 9.5),  # the fallback's reserve is kept
        (5.0, 3.0, None, 6.0),  # never below 2 × its own p50 (from now=0)
        (0.5, 6.0, None, 10.0),  # ... nor past the deadline
        (0.5, None, 2.0, 2.0),  # attempt_timeout caps it
    ],
)
def test_attempt_end_plain(
    reserve: float, own_p50: float | None, timeout: float | None, expected: float
) -> None:
    end = attempt_end(0.0, 10.0, reserve_s=reserve, own_p50_s=own_p50, attempt_timeout_s=timeout)
    assert end == pytest.approx(expected)


@pytest.mark.parametrize(
    ("own_p50", "elsewhere", "fallback", "expected"),
    [
        (0.2, True, False, 0.6),  # 3 × its median: stuck, retry on the other endpoint
        (0.2, False, False, 10.0),  # nowhere else to go: it keeps the whole allotment
        (0.01, True, False, 0.25),  # tiny medians are noisy: never cut before 250 ms
        (None, False, True, 10.0),  # unknown latency, nowhere else to retry: no cut
        (None, True, True, 5.0),  # unknown, a retry elsewhere: half, so the retry fits
        (None, True, False, 5.0),
        (4.0, True, False, 10.0),  # 3 × 4 s is past the deadline anyway
        (0.2, False, True, 1.0),  # only a fallback model waits: cut at 5 × its median
        (0.2, True, True, 0.6),  # another endpoint comes first: 3 ×
    ],
)
def test_attempt_end_cuts_a_stuck_model(
    own_p50: float | None, elsewhere: bool, fallback: bool, expected: float
) -> None:
    end = attempt_end(
        0.0,
        10.0,
        reserve_s=0.0,
        own_p50_s=own_p50,
        attempt_timeout_s=None,
        retry_elsewhere=elsewhere,
        fallback_next=fallback,
    )
    assert end == pytest.approx(expected)


@pytest.mark.parametrize(
    ("cut", "keep", "own_p50", "expected"),
    [
        (0.5, 0.4, 0.2, False),  # 100 ms between the cut and the fallback's time: no retry fits
        (0.3, 0.4, 0.2, True),  # 300 ms: the retry's median fits
        (0.5, 0.0, 0.2, True),  # nothing kept for a fallback
        (0.9, 0.4, None, True),  # median unknown: the retry keeps its chance
    ],
)
def test_retry_fits(cut: float, keep: float, own_p50: float | None, expected: bool) -> None:
    assert retry_fits(cut, 1.0, keep_s=keep, own_p50_s=own_p50) is expected


@pytest.mark.parametrize(
    ("deadline", "reserve", "keep", "own_p50", "elsewhere", "streamed", "expected"),
    [
        # 1 s step, the fallback keeps 500 ms: cut at 500 ms, no retry fits behind it, so none
        # follows (the attempt runs on beside the fallback)
        (1.0, 0.5, 0.4, 0.2, True, False, (0.5, False)),
        # 3 s step: the stuck cut at 3 x 200 ms leaves the retry elsewhere room
        (3.0, 0.5, 0.4, 0.2, True, False, (0.6, True)),
        # a streamed attempt keeps its cut and its retry (its tokens cannot be taken back)
        (1.0, 0.5, 0.4, 0.2, True, True, (0.5, True)),
        # no fallback after this model: the retry is all there is
        (1.0, 0.0, 0.0, 0.2, True, False, (0.6, True)),
        # the model's median unknown: half the usable time, the retry keeps its chance
        (1.0, 0.5, 0.4, None, True, False, (0.25, True)),
        # no retry elsewhere to begin with: the fallback's cut (5 x the median, the reserve)
        (1.0, 0.5, 0.4, 0.2, False, False, (0.5, False)),
    ],
)
def test_attempt_plan(
    deadline: float,
    reserve: float,
    keep: float,
    own_p50: float | None,
    elsewhere: bool,
    streamed: bool,
    expected: tuple[float, bool],
) -> None:
    end, retry = attempt_plan(
        0.0,
        deadline,
        reserve_s=reserve,
        own_p50_s=own_p50,
        attempt_timeout_s=None,
        retry_elsewhere=elsewhere,
        keep_s=keep,
        streamed=streamed,
    )
    assert end == pytest.approx(expected[0])
    assert retry is expected[1]


# ------------------------------------------------------------------ retry decisions


def decide(failure: Failure, **kw: float | int | bool) -> Retry | MoveOn:
    args: dict[str, float | int | bool] = {
        "now": 0.0,
        "deadline": 10.0,
        "reserve_s": 0.0,
        "tries_used": 1,
        "max_tries": 3,
        "backoff_s": 0.1,
        "max_backoff_s": 5.0,
        "max_tokens": 64,
        "shrink": False,
    }
    args.update(kw)
    return decide_retry(failure, **args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("failure", "kw", "expected"),
    [
        # Plain retryable error, tries left: back off.
        (Failure("5xx"), {}, Retry(0.1, 64, True, "retrying in 100ms")),
        # Another endpoint is usable: go there at once.
        (Failure("5xx", elsewhere=True), {}, Retry(0.0, 64, True, "retrying on another endpoint")),
        # Retry-After is honoured when it fits ...
        (Failure("oom", retry_after_s=2.0), {}, Retry(2.0, 64, True, "retrying in 2000ms")),
        # ... and not when it does not: next fallback at once.
        (
            Failure("oom", retry_after_s=20.0),
            {},
            MoveOn("a retry in 20000ms (Retry-After) does not fit the 10000ms left; next fallback"),
        ),
        # The reserve kept for the next fallback counts as not available.
        (
            Failure("5xx"),
            {"reserve_s": 9.95},
            MoveOn("a retry in 100ms does not fit the 50ms left; next fallback"),
        ),
        # Tries used up.
        (Failure("5xx"), {"tries_used": 3}, MoveOn("no tries left (3 of 3 used); next fallback")),
        # Not retryable.
        (Failure("5xx", retryable=False), {}, MoveOn("5xx is not retried; next fallback")),
        # A timeout is retried only on another endpoint (the same one would time out again).
        (
            Failure("timeout"),
            {},
            MoveOn("timed out and no other endpoint is usable; next fallback"),
        ),
        (
            Failure("timeout", elsewhere=True),
            {},
            Retry(0.0, 64, True, "retrying on another endpoint"),
        ),
        # A refused connection with another endpoint: free failover even with no tries left.
        (
            Failure("connect", elsewhere=True),
            {"tries_used": 3},
            Retry(0.0, 64, False, "endpoint unreachable; trying another endpoint"),
        ),
        (
            Failure("connect"),
            {"tries_used": 1, "max_tries": 1},
            MoveOn("no tries left (1 of 1 used); next fallback"),
        ),
        # 429 with advice and on_memory_pressure: shrink → at once, smaller, free.
        (
            Failure("overloaded", advice_max_tokens=16, retry_after_s=3.0),
            {"shrink": True, "tries_used": 1, "max_tries": 1},
            Retry(0.0, 16, False, "retrying at once with the advised max_tokens=16"),
        ),
        # ... but only when the advice is smaller than what was asked.
        (
            Failure("overloaded", advice_max_tokens=64, retry_after_s=3.0),
            {"shrink": True, "tries_used": 1, "max_tries": 1},
            MoveOn("no tries left (1 of 1 used); next fallback"),
        ),
        # Without shrink the advice is ignored; Retry-After still applies.
        (
            Failure("overloaded", advice_max_tokens=16, retry_after_s=3.0),
            {},
            Retry(3.0, 64, True, "retrying in 3000ms"),
        ),
        # Backoff is bounded by max_backoff.
        (
            Failure("5xx"),
            {"backoff_s": 8.0, "max_backoff_s": 0.5},
            Retry(0.5, 64, True, "retrying in 500ms"),
        ),
    ],
)
def test_decide_retry(failure: Failure, kw: dict[str, float], expected: Retry | MoveOn) -> None:
    assert decide(failure, **kw) == expected


def test_p90_is_the_nearest_rank() -> None:
    tracker = LatencyTracker(size=10, min_samples=1)
    for i, seconds in enumerate([0.1 * n for n in range(1, 11)]):
        tracker.record("m", seconds, now=float(i))
    assert tracker.p90("m", now=10.0) == pytest.approx(0.9)
    assert tracker.p50("m", now=10.0) == pytest.approx(0.55)


# ------------------------------------------------------------------ context window


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "window", "shrink", "expected"),
    [
        (100, 200, None, False, ContextFit(200)),  # unknown window: it fits
        (100, 200, 300, False, ContextFit(200)),  # exactly full
        (
            100,
            201,
            300,
            False,
            ContextFit(
                None, "~100 prompt + 201 max_tokens do not fit its 300-token context window"
            ),
        ),
        (
            100,
            500,
            300,
            True,
            ContextFit(
                200,
                "~100 prompt + 500 max_tokens exceed its 300-token context window; max_tokens shrunk to 200",
            ),
        ),
        # Too little room left for an answer worth having: skipped even with shrink.
        (
            290,
            64,
            300,
            True,
            ContextFit(None, "~290 prompt + 64 max_tokens do not fit its 300-token context window"),
        ),
    ],
)
def test_fit_context(
    prompt: int, max_tokens: int, window: int | None, shrink: bool, expected: ContextFit
) -> None:
    assert fit_context(prompt, max_tokens, window, shrink=shrink) == expected


async def test_a_fallback_whose_context_cannot_hold_the_request_is_skipped() -> None:
    from chainrt.dispatch import LlmCall, make_dispatcher

    dispatcher = make_dispatcher(None)  # only the in-process model: a 2048-token context
    call = LlmCall(
        model="local",
        messages=[("user", "word " * 2500)],  # ~3,100 tokens
        max_tokens=64,
        static_answer="sorry",
    )
    try:
        answer = await dispatcher.complete(call, time.time() + 5)
    finally:
        await dispatcher.close()
    assert answer.model == "static"  # no time spent on a request the model cannot take
    skipped = answer.attempts[0]
    assert (skipped.model, skipped.status) == ("local", "skipped")
    assert skipped.detail == (
        "~3129 prompt + 64 max_tokens do not fit its 2048-token context window"
    )


@pytest.mark.parametrize(
    ("queue", "expected"), [(0, (0.6, True)), (9, (0.6, True)), (10, (1.0, False))]
)
def test_attempt_plan_counts_the_queue_where_the_retry_would_go(
    queue: int, expected: tuple[float, bool]
) -> None:
    # 3 s step, the fallback keeps 400 ms, the stuck cut at 600 ms: 2 s left for a retry of
    # 200 ms behind `queue` requests; 10 ahead (2.2 s) do not fit, so no retry is planned and
    # the attempt gets the fallback's cut (5 x its median) and runs on beside the fallback.
    end, retry = attempt_plan(
        0.0,
        3.0,
        reserve_s=0.5,
        own_p50_s=0.2,
        attempt_timeout_s=None,
        retry_elsewhere=True,
        keep_s=0.4,
        streamed=False,
        retry_queue=queue,
    )
    assert end == pytest.approx(expected[0])
    assert retry is expected[1]
