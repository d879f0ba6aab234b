"""The decisions of the dispatch loop, as pure functions of the clock and what happened so far.

Three questions, each answered without I/O (the loop in ``_dispatcher`` only awaits and sleeps):

* :func:`reserve_for` — how much of the time left to keep for the next fallback (its expected
  90th-percentile time for this request's size, with a margin), so that a primary that hangs
  cannot eat the whole allotment. The margin may be trimmed to leave the current candidate half
  the time left; the expected time itself (:func:`fallback_need`) never is;
* :func:`attempt_end` — when this attempt is cut off: the step deadline minus that reserve, but
  never below what this candidate usually needs (unless that would eat into the fallback's
  expected time), never past ``attempt_timeout``, and no later
  than 3× its usual answer time when another endpoint of the same model could take a retry
  (5× when only a fallback model could): a model that slow is stuck, not busy; while its usual
  time is unknown, half the usable time when another endpoint could take a retry;
* :func:`decide_retry` — after a failure: retry now, retry after a wait, or move on to the next
  fallback at once. A retry is taken only when it fits before the reserve; a ``Retry-After`` is
  honoured only when it fits; a refused connection moves to another endpoint of the same model
  without spending a try; a timed-out attempt is retried only on another endpoint (the same one
  would time out again); a ``429`` with advice retries once with the advised ``max_tokens``
  when the step allows it (``on_memory_pressure: shrink``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ._latency import too_slow

__all__ = [
    "FALLBACK_STUCK_FACTOR",
    "MAX_RESERVE_SHARE",
    "MIN_ATTEMPT_S",
    "MIN_JUDGED_UNKNOWN_S",
    "MIN_RESERVE_SHARE",
    "MIN_STUCK_S",
    "MIN_USEFUL_ATTEMPT_S",
    "OWN_FLOOR_FACTOR",
    "RESERVE_FACTOR",
    "STUCK_FACTOR",
    "UNKNOWN_RESERVE_SHARE",
    "UNKNOWN_RETRY_SHARE",
    "USEFUL_SHARE_OF_P50",
    "ContextFit",
    "Failure",
    "MoveOn",
    "NextCandidate",
    "Retry",
    "attempt_end",
    "attempt_plan",
    "decide_retry",
    "fallback_need",
    "fit_context",
    "judged_after",
    "next_tried",
    "queued_out",
    "reserve_for",
    "retry_fits",
    "trial_span",
    "worth_starting",
]

MIN_ATTEMPT_S = 0.005
"""An attempt is not started with less time than this left."""
RESERVE_FACTOR = 2.0
"""The next fallback is kept its recent 90th-percentile answer time times this: a fallback is
needed exactly when things are slow, and a reserve too short wastes the whole attempt."""
MIN_RESERVE_SHARE = 0.15
"""A fallback that will be tried is kept at least this share of the time left, however quick its
figures say it is. Figures taken on a quiet moment (the in-process model's are measured when it
loads) say nothing of a loaded machine, where the same request runs several times slower: sized
from them alone, the reserve left a hung primary 5,929 ms of a 6 s step and the local model too
little to answer beside a CPU hog (issue 14)."""
UNKNOWN_RESERVE_SHARE = 0.25
"""Share of the time left kept for a next fallback whose latency is not known yet."""
UNKNOWN_RETRY_SHARE = 0.5
"""While a model's latency is unknown and another endpoint of it could take a retry, an attempt
gets this share of the time it could use: the retry elsewhere still fits (issue 14: the first
step of a run, sent to the hung one of two endpoints, waited until only the fallback's reserve
was left)."""
MAX_RESERVE_SHARE = 0.5
"""The reserve's margin (beyond the fallback's expected time) is trimmed so that the current
candidate keeps this share of the time left; the expected time itself is always kept."""
OWN_FLOOR_FACTOR = 2.0
"""A candidate's attempt is never cut below its own median times this (when that fits)."""
STUCK_FACTOR = 3.0
"""An attempt slower than its model's median times this is cut when it can be retried elsewhere."""
FALLBACK_STUCK_FACTOR = 5.0
"""An attempt slower than its model's median times this is cut when a fallback model waits."""
MIN_USEFUL_ATTEMPT_S = 0.05
"""With a fallback to come, an attempt of a model whose latency is unknown is not started with
less than this before its cut: no model answers in a few milliseconds."""
USEFUL_SHARE_OF_P50 = 0.5
"""... nor with less than this share of its median for the request (a span just under the
median still answers often: skipping at the median itself sent every step to a loaded fallback
in ``bench/fallback.py --scenario hung --load-cores 2``)."""
MIN_STUCK_S = 0.25
"""... but never before this many seconds (medians of tiny answers are noisy)."""
MIN_JUDGED_UNKNOWN_S = 1.0
"""While nothing is known of a model's latency, a timed-out attempt counts against its endpoint
only after running this long: one cut sooner (to keep a fallback's reserve, behind a queue) says
nothing, and the ``timeout`` breaker opens on the first judged timeout of an endpoint that has
never answered."""


def trial_span(own_p90_s: float | None, *, something_after: bool) -> float | None:
    """The longest a half-open trial may run on an endpoint whose ``timeout`` breaker opened
    (None: no cap).

    A trial asks one question — does this endpoint answer again? — and the model's expected
    90th percentile for the request (at least :data:`MIN_STUCK_S`) answers it: a trial that
    has not answered by then counts as the timeout it is (:func:`judged_after` is that same
    figure) and the breaker reopens. Capped only when ``something_after`` could still answer
    (another endpoint, a fallback): a trial that is the step's last chance keeps its cut-off.
    Unknown latency: no cap. Without it a trial on a hung endpoint ran to the attempt's usual
    cut (3x the model's median, up to the fallback's reserve when no retry elsewhere was
    possible): in ``bench/fallback.py --scenario hung --load-cores 2`` a step's two primary
    attempts, one of them the trial, took 1,472 + 1,175 ms of its 3 s and left the local model
    371 ms, too little to answer (issue 14).
    """
    if own_p90_s is None or not something_after:
        return None
    return max(own_p90_s, MIN_STUCK_S)


@dataclass(frozen=True, slots=True)
class NextCandidate:
    """A fallback still to come, as the reserve sees it."""

    name: str
    p50_s: float | None = None
    p90_s: float | None = None
    static: bool = False
    """The static answer: costs no time."""
    usable: bool = True
    """False for a model with no usable endpoint (it will be skipped)."""
    in_flight: int = 0
    """Attempts on it in flight now: when many steps fall back at once, they queue there."""
    coming: int = 0
    """Attempts of the current model running now on endpoints that are slow (in a spike):
    they are expected to fall back to it at about the same moment as this one, so they count
    as its queue too (several runs falling back at once is the normal case in a spike)."""

    @property
    def queue(self) -> int:
        """The requests this fallback is expected to find ahead: in flight and coming."""
        return max(self.in_flight, 0) + max(self.coming, 0)


def next_tried(
    rest: Sequence[NextCandidate], left_s: float, keep_partial: bool
) -> NextCandidate | None:
    """The first of ``rest`` that would be tried (None: nothing, or the static answer)."""
    for candidate in rest:
        if candidate.static:
            return None
        if not candidate.usable or too_slow(candidate.p50_s, left_s, keep_partial=keep_partial):
            continue
        return candidate
    return None


def fallback_need(rest: Sequence[NextCandidate], left_s: float, *, keep_partial: bool) -> float:
    """Seconds the next fallback that would be tried is expected to need, queue included.

    Its 90th percentile (or median) for this request, plus the median of each attempt already
    waiting there or about to (:attr:`NextCandidate.queue`), at most the time left; zero when it is unknown, when nothing (or the static
    answer) comes next, or when its queue and median alone exceed the time left. The
    current candidate is never given time out of this (only out of the reserve's margin).
    """
    candidate = next_tried(rest, left_s, keep_partial)
    if candidate is None:
        return 0.0
    known = candidate.p90_s if candidate.p90_s is not None else candidate.p50_s
    if known is None:
        return 0.0
    median = candidate.p50_s or known
    # A fallback so queued that even its median wait and answer exceed the time left is no
    # safer bet than the current candidate: keeping its time would starve a healthy primary and
    # send every step to the congested fallback, which then times out too (issue 14).
    if median * (1 + candidate.queue) > left_s:
        return 0.0
    return min(known + candidate.queue * median, left_s)


def reserve_for(rest: Sequence[NextCandidate], left_s: float, *, keep_partial: bool) -> float:
    """Seconds to keep free for the first fallback in ``rest`` that would actually be tried.

    Its expected need times :data:`RESERVE_FACTOR` (plus its queue), the margin trimmed so the
    current candidate keeps :data:`MAX_RESERVE_SHARE` of the time left, but never below
    :func:`fallback_need` nor :data:`MIN_RESERVE_SHARE` of the time left; a quarter of the time
    left for a fallback whose latency is unknown.
    Zero when the next thing to try is the static answer, or nothing: then the current candidate
    may use every millisecond left.
    """
    candidate = next_tried(rest, left_s, keep_partial)
    if candidate is None:
        return 0.0
    known = candidate.p90_s if candidate.p90_s is not None else candidate.p50_s
    if known is None:
        return left_s * UNKNOWN_RESERVE_SHARE
    generous = known * RESERVE_FACTOR + candidate.queue * (candidate.p50_s or known)
    bare = fallback_need(rest, left_s, keep_partial=keep_partial)
    measured = min(generous, max(bare, left_s * MAX_RESERVE_SHARE))
    return min(max(measured, left_s * MIN_RESERVE_SHARE), left_s)


def attempt_end(
    now: float,
    deadline: float,
    *,
    reserve_s: float,
    own_p50_s: float | None,
    attempt_timeout_s: float | None,
    retry_elsewhere: bool = False,
    fallback_next: bool = False,
    keep_s: float = 0.0,
) -> float:
    """When an attempt starting at ``now`` is cut off (same clock as ``deadline``).

    ``retry_elsewhere``: a try is left and another endpoint of this model is usable now.
    ``fallback_next``: a fallback model would be tried after this one.
    ``keep_s``: what the next fallback is expected to need (:func:`fallback_need`): never given
    to this attempt.
    """
    end = deadline - reserve_s
    if own_p50_s is not None:
        # A primary that usually needs 800 ms is not cut at 500 ms to keep a fallback's reserve
        # margin: that would turn every one of its answers into a timeout. The fallback's own
        # expected time stays out of reach, so a primary gone slow cannot starve it.
        end = max(end, min(now + own_p50_s * OWN_FLOOR_FACTOR, deadline - keep_s))
        # A model answering several times slower than usual is stuck (a spike, a hung worker):
        # the same model elsewhere, or failing that a fallback, answers sooner than waiting.
        factor = (
            STUCK_FACTOR if retry_elsewhere else FALLBACK_STUCK_FACTOR if fallback_next else None
        )
        if factor is not None:
            end = min(end, now + max(own_p50_s * factor, MIN_STUCK_S))
    elif retry_elsewhere:
        # Nothing is known of this model: it may be the hung endpoint. Leave the other
        # endpoint's retry half the usable time rather than only the fallback's reserve.
        end = now + (end - now) * UNKNOWN_RETRY_SHARE
    if attempt_timeout_s is not None:
        end = min(end, now + attempt_timeout_s)
    return max(min(end, deadline), min(now + MIN_ATTEMPT_S, deadline))


def retry_fits(cut: float, deadline: float, *, keep_s: float, own_p50_s: float | None) -> bool:
    """Whether a retry elsewhere, started when the running attempt is cut at ``cut``, can
    still answer before the next fallback's time (same clock as ``deadline``).

    ``keep_s``: what the fallback is expected to need (:func:`fallback_need`); ``own_p50_s``:
    the model's median for the request (None: unknown, the retry is given its chance). A retry
    that cannot fit its median is skipped, so cutting the attempt for it only throws away the
    attempt's progress and leaves the fallback alone behind a queue.
    """
    if own_p50_s is None:
        return True
    return deadline - keep_s - cut >= own_p50_s


def attempt_plan(
    now: float,
    deadline: float,
    *,
    reserve_s: float,
    own_p50_s: float | None,
    attempt_timeout_s: float | None,
    retry_elsewhere: bool,
    keep_s: float,
    streamed: bool,
    retry_queue: int = 0,
) -> tuple[float, bool]:
    """The attempt's cut (:func:`attempt_end`) and whether a retry elsewhere still follows it.

    When a fallback comes after this model and the retry elsewhere could not fit after the cut
    (:func:`retry_fits`), no retry follows: the attempt is then run on beside the fallback
    (``dispatch/_beside.py``, the first answer winning) instead of being cut for a retry that
    would be skipped. In ``bench/fallback.py`` at 1.5x headroom, 31 of 32 failed steps were a
    first attempt cut 180-880 ms into a 1-1.8 s allotment, no retry, and the local model cut
    behind one or two other runs' fallbacks. A streamed attempt keeps its cut (its tokens
    cannot be taken back, so it is never run beside a fallback). ``retry_queue``: the requests
    in flight where the retry would go (the busiest usable endpoint): the retry must fit its
    median behind each of them (at 1.8x headroom, 8 runs at a time, the failed steps' first
    attempts were cut with 2-8 requests in flight on the workers, and no retry followed).
    """

    def end(retry: bool) -> float:
        return attempt_end(
            now,
            deadline,
            reserve_s=reserve_s,
            own_p50_s=own_p50_s,
            attempt_timeout_s=attempt_timeout_s,
            retry_elsewhere=retry,
            fallback_next=reserve_s > 0,
            keep_s=keep_s,
        )

    cut = end(retry_elsewhere)
    if not retry_elsewhere or reserve_s <= 0 or streamed:
        return cut, retry_elsewhere
    retry_p50 = None if own_p50_s is None else own_p50_s * (1 + max(retry_queue, 0))
    if retry_fits(cut, deadline, keep_s=keep_s, own_p50_s=retry_p50):
        return cut, True
    return end(False), False


def worth_starting(span_s: float, own_p50_s: float | None, *, fallback_next: bool) -> bool:
    """Whether an attempt cut ``span_s`` after its start is worth sending at all.

    With a fallback to come, an attempt that can hardly answer in its span — shorter than
    :data:`USEFUL_SHARE_OF_P50` of the model's median for the request, or than
    :data:`MIN_USEFUL_ATTEMPT_S` — is skipped: sent, it would only load the endpoint (on a shared machine, the CPU the
    fallback needs) and, while nothing is known of the model, count as a timeout against a
    healthy endpoint's breaker (issue 14: 5 ms attempts when the fallback's reserve took the
    whole step). The last candidate is always tried.
    """
    if not fallback_next:
        return True
    return span_s >= max(MIN_USEFUL_ATTEMPT_S, (own_p50_s or 0.0) * USEFUL_SHARE_OF_P50)


def judged_after(own_p90_s: float | None) -> float:
    """How long an attempt must have run for its timeout to count against its endpoint.

    The model's expected 90th percentile for this request (:data:`MIN_JUDGED_UNKNOWN_S` when
    unknown): an endpoint is blamed for not answering only when it was given the time it usually
    needs. Cutting a healthy but busy endpoint's attempt short to keep a fallback's reserve must
    not open its circuit (issue 14).
    """
    return MIN_JUDGED_UNKNOWN_S if own_p90_s is None else own_p90_s


def queued_out(
    own_queue: int,
    own_p50_s: float | None,
    span_s: float,
    fallback: NextCandidate | None,
    left_s: float,
) -> bool:
    """Whether to leave the current candidate for a free fallback instead of joining its queue.

    ``own_queue``: requests in flight on the candidate's least busy usable endpoint;
    ``span_s``: the time this attempt would get before its cut; ``fallback``: the next fallback
    that would be tried; ``left_s``: the step's time left. True when the candidate's expected
    answer behind that queue — its median for each request ahead and one for this one — comes
    after the cut, while the fallback has nothing in flight and its expected time (90th
    percentile, else median) fits the time left and comes sooner. Sent, the attempt would wait and be cut, and the fallback would then get less time
    than it has now (issue 14: a healthy one-generation-at-a-time primary, queued behind other
    runs, cut, then the fallback cut too). Nothing is skipped when a figure is unknown.
    """
    if own_queue <= 0 or own_p50_s is None or fallback is None or fallback.queue > 0:
        return False
    own_finish = (own_queue + 1) * own_p50_s
    if own_finish <= span_s:
        return False
    theirs = fallback.p90_s if fallback.p90_s is not None else fallback.p50_s
    return theirs is not None and theirs <= left_s and theirs < own_finish


@dataclass(frozen=True, slots=True)
class Failure:
    """What a failed attempt tells the retry decision."""

    error_class: str
    retryable: bool = True
    retry_after_s: float | None = None
    advice_max_tokens: int | None = None
    elsewhere: bool = False
    """Another endpoint of the same model is usable right now."""


@dataclass(frozen=True, slots=True)
class Retry:
    """Try the same model again after ``wait_s``, asking for ``max_tokens``."""

    wait_s: float
    max_tokens: int
    counts: bool
    """Whether this retry spends one of the step's tries."""
    why: str


@dataclass(frozen=True, slots=True)
class MoveOn:
    """Give up on this model; the next fallback is tried at once."""

    why: str


def decide_retry(
    failure: Failure,
    *,
    now: float,
    deadline: float,
    reserve_s: float,
    tries_used: int,
    max_tries: int,
    backoff_s: float,
    max_backoff_s: float,
    max_tokens: int,
    shrink: bool,
) -> Retry | MoveOn:
    """Retry the model (and when), or move on. ``tries_used`` counts tries spent so far."""
    usable_end = deadline - reserve_s

    def fits(wait_s: float) -> bool:
        return now + wait_s + MIN_ATTEMPT_S <= usable_end

    advice = failure.advice_max_tokens
    if (
        failure.error_class == "overloaded"
        and shrink
        and advice is not None
        and 0 < advice < max_tokens
    ):
        if fits(0.0):
            return Retry(
                0.0, advice, False, f"retrying at once with the advised max_tokens={advice}"
            )
        return MoveOn("no time left to retry with the advised max_tokens; next fallback")
    if failure.error_class == "connect" and failure.elsewhere:
        if fits(0.0):
            return Retry(0.0, max_tokens, False, "endpoint unreachable; trying another endpoint")
        return MoveOn("endpoint unreachable and no time left for another; next fallback")
    if not failure.retryable:
        return MoveOn(f"{failure.error_class} is not retried; next fallback")
    if failure.error_class == "timeout" and not failure.elsewhere:
        return MoveOn("timed out and no other endpoint is usable; next fallback")
    if tries_used >= max_tries:
        return MoveOn(f"no tries left ({tries_used} of {max_tries} used); next fallback")
    if failure.elsewhere:
        wait = 0.0  # another endpoint is free now: no reason to back off
    else:
        wait = min(backoff_s, max_backoff_s)
        if failure.retry_after_s is not None:
            wait = max(wait, failure.retry_after_s)
    if not fits(wait):
        left = max(usable_end - now, 0.0)
        hint = (
            " (Retry-After)" if failure.retry_after_s is not None and not failure.elsewhere else ""
        )
        return MoveOn(
            f"a retry in {wait * 1000:.0f}ms{hint} does not fit the {left * 1000:.0f}ms left; "
            "next fallback"
        )
    where = "on another endpoint" if failure.elsewhere else f"in {wait * 1000:.0f}ms"
    return Retry(wait, max_tokens, True, f"retrying {where}")


MIN_SHRUNK_TOKENS = 16
"""``shrink`` never cuts an answer below this many tokens: shorter is not worth asking for."""


@dataclass(frozen=True, slots=True)
class ContextFit:
    """Whether a request fits a model's context window: ``max_tokens`` to ask for (None: skip
    the model), and ``why`` for the attempt log (None: it fits as it is)."""

    max_tokens: int | None
    why: str | None = None


def fit_context(
    prompt_tokens: int, max_tokens: int, window: int | None, *, shrink: bool
) -> ContextFit:
    """Fit a request of ``prompt_tokens`` (an estimate) + ``max_tokens`` into ``window`` tokens.

    Unknown window: it fits. Too big: with ``shrink`` the answer is cut to what the window
    leaves (at least :data:`MIN_SHRUNK_TOKENS`), otherwise the model is skipped.
    """
    if window is None or prompt_tokens + max_tokens <= window:
        return ContextFit(max_tokens)
    size = f"~{prompt_tokens} prompt + {max_tokens} max_tokens"
    room = window - prompt_tokens
    if shrink and room >= MIN_SHRUNK_TOKENS:
        return ContextFit(
            room, f"{size} exceed its {window}-token context window; max_tokens shrunk to {room}"
        )
    return ContextFit(None, f"{size} do not fit its {window}-token context window")
