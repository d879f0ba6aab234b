"""Adapting within a spike (pure, table-tested): an endpoint's pace now, when the fallback
starts beside a running attempt, when a hedge starts, and the reserve that counts the runs
falling back together."""

from __future__ import annotations

import pytest

from chainrt.dispatch._adapt import (
    FAST_SAMPLES,
    RECENT_S,
    USUAL_AGE_S,
    Pace,
    PaceBook,
    fallback_start,
    hedge_after,
    is_slow,
    memory,
    own_share,
    pace_rate,
    slow_after,
    slow_endpoints,
)
from chainrt.dispatch._latency import median
from chainrt.dispatch._policy import NextCandidate, fallback_need, queued_out, reserve_for

USUAL = 0.01
"""The model's usual rate in these tables: 10 ms a work unit (a 10-unit request: 100 ms)."""


@pytest.mark.parametrize(
    ("usual", "work", "expected"),
    [
        (None, 10.0, None),  # nothing known: nothing judged
        (0.0, 10.0, None),
        (0.01, 10.0, 0.25),  # 100 ms usual: 2.5x
        (0.001, 10.0, 0.11),  # 10 ms usual: 2.5x is jitter; at least 100 ms more than usual
    ],
)
def test_slow_after(usual: float | None, work: float, expected: float | None) -> None:
    got = slow_after(usual, work)
    assert got == pytest.approx(expected) if expected is not None else got is None


@pytest.mark.parametrize(
    ("pace", "usual", "expected"),
    [
        (Pace(), USUAL, False),  # no evidence
        (Pace(recent=(0.01, 0.012, 0.011)), USUAL, False),  # healthy
        (Pace(recent=(0.09,)), USUAL, True),  # one slow answer (a spike's +800 ms)
        (Pace(recent=(0.01, 0.09)), USUAL, True),  # median of two: 50 ms a unit, 2.5x over 10
        (Pace(recent=(0.01, 0.011, 0.09)), USUAL, False),  # one slow among three: jitter
        (Pace(recent=(0.09, 0.09, 0.01, 0.011)), USUAL, False),  # only the latest three count
        # A request running now, already past 2.5x usual: slow before any answer comes back.
        (Pace(recent=(0.01, 0.01, 0.01), running=(0.026,)), USUAL, True),
        (Pace(running=(0.02,)), USUAL, False),  # running 2x usual: not yet
        (Pace(recent=(0.09,)), None, False),  # the model's usual unknown: nothing judged
        # A request cut past 2.5x usual, with no answer of the endpoint since it started: it
        # counts as the running request it was, however quick the answers before it were.
        (Pace(recent=(0.01, 0.01, 0.03), cut=(0.03,)), USUAL, True),
        (Pace(recent=(0.01, 0.01, 0.02), cut=(0.02,)), USUAL, False),  # cut at 2x: not yet
    ],
)
def test_is_slow(pace: Pace, usual: float | None, expected: bool) -> None:
    assert is_slow(pace, usual, 10.0) is expected


@pytest.mark.parametrize(
    ("usual", "work", "expected"),
    [
        (None, 10.0, RECENT_S),  # unknown: a second
        (0.01, 10.0, RECENT_S),  # 100 ms requests: a second (4 x 100 ms is less)
        (0.1, 10.0, 4.0),  # 1 s requests (a loaded machine): four of them
    ],
)
def test_memory(usual: float | None, work: float, expected: float) -> None:
    assert memory(usual, work) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("elapsed", "ahead", "usual", "expected"),
    [
        (1.0, 0, 0.25, 1.0),  # alone: all its own
        (1.0, 3, 0.25, 0.25),  # fourth in a queue of 250 ms answers: a usual answer
        (7.4, 3, 0.25, 6.65),  # a spike delays all four at once: not hidden by the queue
        (1.0, 3, 0.5, 0.25),  # never less than an equal share
        (1.0, 3, None, 0.25),  # the usual unknown: the equal share
    ],
)
def test_own_share(elapsed: float, ahead: int, usual: float | None, expected: float) -> None:
    assert own_share(elapsed, ahead, usual) == pytest.approx(expected)


def test_a_spike_on_a_busy_endpoint_is_not_hidden_by_its_queue() -> None:
    book = PaceBook()
    work = 10.0
    # Four requests sent at once to an endpoint in a spike (+800 ms on each, concurrently).
    tokens = [book.start("m@a", 0.0, work, group="m") for _ in range(4)]
    assert is_slow(book.pace("m@a", 0.5, usual_rate=USUAL), USUAL, work)
    for token in tokens:
        book.end(token, 0.9, keep_if_above=USUAL)  # cut at 900 ms
    assert is_slow(book.pace("m@a", 1.0, usual_rate=USUAL), USUAL, work)
    # Counted as equal shares alone, the last three would look usual (225 ms each).
    assert not is_slow(Pace(recent=(0.0225, 0.0225, 0.0225)), USUAL, work)


def test_pace_rate_and_slow_endpoints() -> None:
    healthy = Pace(recent=(0.01, 0.011, 0.012))
    spiked = Pace(recent=(0.09,), running=(0.05,))
    assert pace_rate(healthy, USUAL, 10.0) == USUAL  # not slow: the usual
    assert pace_rate(spiked, USUAL, 10.0) == 0.09  # slow: its worst evidence
    assert pace_rate(Pace(running=(0.05,)), USUAL, 10.0) == 0.05
    assert slow_endpoints({"a": healthy, "b": spiked}, USUAL, 10.0) == {"b"}
    assert slow_endpoints({"a": healthy, "b": spiked}, None, 10.0) == frozenset()


@pytest.mark.parametrize(
    ("need", "expected_end", "expected"),
    [
        (0.0, 1.2, None),  # nothing kept for a fallback: no fallback to start
        (0.3, 1.2, 1.7),  # the answer is expected in time: start when only the need is left
        (0.3, 1.7, 1.7),  # just in time
        (0.3, 1.8, 1.0),  # it cannot come before the fallback's time: start now
        (0.3, None, 1.0),  # unknown (past its slow mark, or a slow endpoint): start now
        (2.5, 1.2, 1.0),  # the need exceeds the time left: now
    ],
)
def test_fallback_start(need: float, expected_end: float | None, expected: float | None) -> None:
    got = fallback_start(now=1.0, deadline=2.0, need_s=need, expected_end=expected_end)
    assert got == pytest.approx(expected) if expected is not None else got is None


@pytest.mark.parametrize(
    ("usual", "own_slow", "other", "expected"),
    [
        (0.3, False, 0.1, 0.3),  # healthy: its usual percentile
        (0.3, True, 0.1, 0.1),  # in a spike: once it has run the other endpoint's time
        (0.05, True, 0.1, 0.05),  # a fixed after: sooner than that stays
        (None, True, 0.1, 0.1),  # no figures of its own, but the other's are known
        (None, False, 0.1, None),  # no figures, not slow: no hedge
        (0.3, True, None, 0.3),  # the other endpoint's time unknown: as before
    ],
)
def test_hedge_after(
    usual: float | None, own_slow: bool, other: float | None, expected: float | None
) -> None:
    assert hedge_after(usual, own_slow=own_slow, other_expected_s=other) == expected


@pytest.mark.parametrize(
    ("candidate", "left", "reserve", "need"),
    [
        # The local model: p50 100 ms, p90 150 ms; 1 s left.
        (NextCandidate("local", 0.1, 0.15), 1.0, 0.3, 0.15),
        # Two attempts queued on it now: their medians are kept too.
        (NextCandidate("local", 0.1, 0.15, in_flight=2), 1.0, 0.5, 0.35),
        # Nothing queued yet, but three runs are on an endpoint in a spike and will fall back
        # at the same moment: counted as its queue.
        # (The reserve's margin is trimmed to leave the current attempt half the time left;
        # the need itself never is.)
        (NextCandidate("local", 0.1, 0.15, coming=3), 1.0, 0.5, 0.45),
        (NextCandidate("local", 0.1, 0.15, in_flight=1, coming=2), 1.0, 0.5, 0.45),
        # So queued that its median wait and answer exceed the time left: nothing is kept
        # beyond the usual share (a congested fallback must not starve a healthy primary).
        (NextCandidate("local", 0.1, 0.15, coming=12), 1.0, 0.5, 0.0),
    ],
)
def test_reserve_counts_the_runs_falling_back_together(
    candidate: NextCandidate, left: float, reserve: float, need: float
) -> None:
    assert reserve_for([candidate], left, keep_partial=False) == pytest.approx(reserve)
    assert fallback_need([candidate], left, keep_partial=False) == pytest.approx(need)


def test_queued_out_waits_for_a_fallback_about_to_be_crowded() -> None:
    free = NextCandidate("local", 0.1, 0.15)
    assert queued_out(2, 0.2, 0.5, free, 1.0)
    assert not queued_out(2, 0.2, 0.5, NextCandidate("local", 0.1, 0.15, coming=2), 1.0)


def test_pace_book_spike_and_recovery() -> None:
    book = PaceBook()
    work = 10.0
    # Three healthy answers on a, 100 ms each.
    for i in range(FAST_SAMPLES):
        token = book.start("m@a", float(i), work)
        book.end(token, i + 0.1, work=work)
    assert book.pace("m@a", 3.0).recent == pytest.approx((0.01,))  # the last second
    assert not is_slow(book.pace("m@a", 3.0), USUAL, work)
    # A request enters a spike at t=3.0: slow once it has run 250 ms, before it answers.
    token = book.start("m@a", 3.0, work)
    assert not is_slow(book.pace("m@a", 3.2), USUAL, work)
    assert is_slow(book.pace("m@a", 3.3), USUAL, work)
    # Its answer comes after 900 ms: slow ...
    book.end(token, 3.9, work=work)
    assert is_slow(book.pace("m@a", 3.95), USUAL, work)
    assert is_slow(book.pace("m@a", 3.9 + RECENT_S - 0.01), USUAL, work)
    # ... until RECENT_S after that answer; the three old answers have aged out too.
    assert book.pace("m@a", 3.9 + RECENT_S + 0.01) == Pace()
    assert book.pace("m@a", 5.0, memory_s=2.0).recent == pytest.approx((0.09,))


def test_pace_book_a_request_cut_in_a_spike_keeps_its_endpoint_slow() -> None:
    book = PaceBook()
    work = 10.0
    # Three quick answers on a (100 ms each, the model's usual), the last ended at 0.4.
    for i in range(FAST_SAMPLES):
        token = book.start("m@a", 0.1 * i + 0.1, work, group="m")
        book.end(token, 0.1 * i + 0.2, work=work)
    # The next request meets a spike at 0.5: slow while it runs past 250 ms ...
    victim = book.start("m@a", 0.5, work, group="m")
    assert is_slow(book.pace("m@a", 0.76, usual_rate=USUAL), USUAL, work)
    # ... and still slow once it is cut at 300 ms (the stuck cut, 3x usual): its time is a
    # lower bound of a request not answered, and the three quick answers before it, still
    # within the memory, do not outvote it (their median alone would say "usual").
    book.end(victim, 0.8, keep_if_above=USUAL)
    pace = book.pace("m@a", 0.85, usual_rate=USUAL)
    assert pace.cut == pytest.approx((0.03,))
    assert median(pace.recent) == pytest.approx(0.01)
    assert is_slow(pace, USUAL, work)
    assert pace_rate(pace, USUAL, work) == pytest.approx(0.03)
    # Forgotten RECENT_S after the cut, like any evidence.
    assert not is_slow(book.pace("m@a", 0.8 + RECENT_S + 0.01, usual_rate=USUAL), USUAL, work)
    # An answer of the endpoint ended after the cut request started shows it quick again.
    other = book.start("m@a", 0.85, work, group="m")
    book.end(other, 0.95, work=work)
    pace = book.pace("m@a", 1.0, usual_rate=USUAL)
    assert pace.cut == ()
    assert not is_slow(pace, USUAL, work)


def test_pace_book_a_cut_answered_past_while_it_ran_is_only_one_of_the_recent() -> None:
    book = PaceBook()
    work = 10.0
    # Two requests at once on b; one answers in 100 ms while the other is cut after 300 ms:
    # the endpoint answered during the cut request, so the cut is one sample of three.
    slow = book.start("m@b", 0.0, work, group="m")
    quick = book.start("m@b", 0.0, work, group="m")
    book.end(quick, 0.1, work=work)
    book.end(slow, 0.3, keep_if_above=USUAL)
    pace = book.pace("m@b", 0.35, usual_rate=USUAL)
    assert pace.cut == ()
    assert len(pace.recent) == 2
    # A failure quicker than usual is no evidence at all (not even a cut).
    failed = book.start("m@b", 1.0, work, group="m")
    book.end(failed, 1.02, keep_if_above=USUAL)
    assert book.pace("m@b", 1.05, usual_rate=USUAL).cut == ()


def test_pace_book_queue_and_lower_bounds() -> None:
    book = PaceBook()
    work = 10.0
    # A busy endpoint: the second request waits behind the first; its time is shared.
    first = book.start("m@a", 0.0, work)
    second = book.start("m@a", 0.0, work)
    assert book.running_on(["m@a", "m@b"]) == 2
    book.end(first, 0.1, work=work)
    book.end(second, 0.2, work=work)  # 200 ms behind one: 100 ms its own
    assert book.pace("m@a", 0.3).recent == pytest.approx((0.01, 0.01))
    # A failure after 20 ms says nothing of the pace; a cut after 500 ms says it is slow.
    quick = book.start("m@b", 1.0, work)
    book.end(quick, 1.02, keep_if_above=USUAL)
    assert book.pace("m@b", 1.1).recent == ()
    cut = book.start("m@b", 1.0, work)
    book.end(cut, 1.5, keep_if_above=USUAL)
    assert book.pace("m@b", 1.6).recent == pytest.approx((0.05,))
    unknown = book.start("m@b", 1.0, work)
    book.end(unknown, 1.5)  # the usual unknown: a lower bound is not kept
    assert len(book.pace("m@b", 1.6).recent) == 1
    assert book.keys("m@") == ["m@a", "m@b"]
    assert book.running_on(["m@a", "m@b"]) == 0


def test_pace_book_usual_rate_counts_each_request_apart_from_its_queue() -> None:
    book = PaceBook()
    work = 10.0
    assert book.usual("m", 0.0) is None
    # Three requests at once on one single-generation endpoint: 100, 200, 300 ms, each 100 ms
    # of its own; and one on another model.
    tokens = [book.start("m@a", 0.0, work, group="m") for _ in range(3)]
    for i, token in enumerate(tokens):
        book.end(token, 0.1 * (i + 1), work=work)
    other = book.start("n@a", 0.0, work, group="n")
    book.end(other, 1.0, work=work)
    assert book.usual("m", 0.5) == pytest.approx(0.01)
    assert book.usual("n", 1.0) is None  # one answer: unknown
    # Cut or failed requests are not answers: the usual is unchanged.
    cut = book.start("m@a", 1.0, work, group="m")
    book.end(cut, 5.0, keep_if_above=0.01)
    assert book.usual("m", 5.0) == pytest.approx(0.01)
    assert book.usual("m", 0.3 + USUAL_AGE_S + 1) is None  # aged out
