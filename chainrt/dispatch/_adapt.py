"""Adapting within a latency spike: each endpoint's pace now, as pure functions (docs/dispatch.md).

A model's figures (:mod:`._latency`) hold its last 20 answers of the last minute: right for
sizing a reserve, far too slow to notice that one endpoint has just turned slow. Here each
endpoint (``model@url``) is judged from its *last few* requests and from the requests still
running there, each counted as seconds per unit of work (:func:`~._latency.work_units`), less
the usual time of the requests already in flight there when it started (:func:`own_share`: a
healthy endpoint that answers one request at a time is busy, not slow):

* :func:`is_slow` — the endpoint is slow now when a request running there has already taken
  longer than :func:`slow_after` (its model's usual rate, :meth:`PaceBook.usual`, counted the
  same way, times :data:`SLOW_FACTOR`), when a request cut there after running that long has
  not been answered past since (:attr:`Pace.cut`), or when the
  median of its recent requests (at most :data:`FAST_SAMPLES`, started in the last
  :data:`RECENT_S`) exceeds it. The first request caught in a spike marks its endpoint slow
  while it is still running, before any slow answer comes back, and keeps it slow once it is
  cut: its time so far is a censored sample (the request would have taken *at least* that
  long), and the endpoint's older quick answers, given before the request started, do not
  outvote it;
* :func:`pace_rate` — what the endpoint is expected to need now (its slow pace, or the usual);
* :func:`fallback_start` — when to start the next fallback *beside* a running attempt: at once
  when the attempt's expected answer (or, past the slow mark, its unknown one) can no longer
  come before the fallback's own expected time, else when only that time is left;
* :func:`hedge_after` — when a hedge to another endpoint starts: the other endpoint's expected
  time, when the attempt's own endpoint is slow now; its usual percentile otherwise.

Evidence older than :data:`RECENT_S` (counted from the end of the request that gave it, when
it became known) is forgotten, so an endpoint avoided for a spike is tried again a second after
its last slow request ended, without a probe; a request running there now is evidence for as
long as it runs.
:class:`PaceBook` keeps the evidence (state, no decisions); nothing here reads a clock.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from ._latency import median

__all__ = [
    "FAST_SAMPLES",
    "MEMORY_FACTOR",
    "MIN_SLOW_S",
    "MIN_USUAL",
    "RECENT_S",
    "SLOW_FACTOR",
    "USUAL_AGE_S",
    "USUAL_SAMPLES",
    "Pace",
    "PaceBook",
    "fallback_start",
    "hedge_after",
    "is_slow",
    "memory",
    "own_share",
    "pace_rate",
    "slow_after",
    "slow_endpoints",
]

FAST_SAMPLES = 3
"""An endpoint's pace now is the median of at most this many of its latest requests."""
RECENT_S = 1.0
"""... ended at most this many seconds ago (or :data:`MEMORY_FACTOR` times the request's usual
time, when that is longer): a spike is over within seconds, and an endpoint avoided for one gets
requests again this long after its last slow request ended."""
MEMORY_FACTOR = 4.0
"""On a slow machine (a request's usual time near a second) a second of memory would forget a
slow endpoint before the retry elsewhere has answered: evidence is kept this many usual times."""
SLOW_FACTOR = 2.5
"""An endpoint is slow now when its requests take this many times its model's usual rate (a
healthy answer's spread on a loaded 2-core machine stays under 2x the median)."""
MIN_SLOW_S = 0.1
"""... and at least this many seconds longer than usual in absolute terms: no endpoint is
judged on jitter of a few milliseconds."""
USUAL_SAMPLES = 20
"""A model's usual rate is the median of at most this many of its answers (every endpoint) ..."""
USUAL_AGE_S = 60.0
"""... of the last this many seconds, counted like the endpoints' (per request, its queue
apart): a usual figure that counted queue waits would hide a spike behind a busy machine."""
MIN_USUAL = 3
"""Fewer answers than this: the usual rate is unknown and nothing is judged."""


@dataclass(frozen=True, slots=True)
class Pace:
    """What is known of one endpoint's pace right now, in seconds per work unit."""

    recent: tuple[float, ...] = ()
    """Rates of its latest finished requests (answers, and timeouts as lower bounds), oldest
    first, all ended within :data:`RECENT_S`."""
    running: tuple[float, ...] = ()
    """Lower bounds of the rates of requests running there now (their age so far)."""
    cut: tuple[float, ...] = ()
    """Lower bounds of the rates of requests cut, failed or cancelled there (their time when
    they ended), ended within the memory, with no answer of the endpoint ended since each
    started: the endpoint has not shown it is quick again since. Each counts as a request
    still running would (it is also among :attr:`recent`)."""


def own_share(elapsed_s: float, ahead: int, usual_s: float | None) -> float:
    """The part of ``elapsed_s`` a request spent on itself, ``ahead`` requests having been in
    flight on its endpoint when it started: what is left once each of them took the usual
    ``usual_s``, and never less than an equal share (``elapsed_s / (1 + ahead)``; that share
    alone while the usual is unknown). Counted so, a busy single-generation endpoint is not
    slow, and a spike that delays every request at once is not hidden by their number."""
    ahead = max(ahead, 0)
    equal = elapsed_s / (1 + ahead)
    if usual_s is None:
        return equal
    return max(equal, elapsed_s - ahead * usual_s)


def slow_after(usual_rate: float | None, work: float) -> float | None:
    """Seconds after which a request of ``work`` units marks its endpoint slow (None: the
    model's usual rate is unknown, nothing is judged)."""
    if usual_rate is None or usual_rate <= 0:
        return None
    usual = usual_rate * work
    return max(usual * SLOW_FACTOR, usual + MIN_SLOW_S)


def _threshold(usual_rate: float | None, work: float) -> float | None:
    after = slow_after(usual_rate, work)
    return None if after is None else after / work


def is_slow(pace: Pace, usual_rate: float | None, work: float = 1.0) -> bool:
    """True when the endpoint is slow now for a request of ``work`` units (see the module)."""
    limit = _threshold(usual_rate, work)
    if limit is None:
        return False
    # A request running past the limit, or cut after running past it with no answer from the
    # endpoint since it started, is the spike itself: the older quick answers of its
    # ``recent`` median were given before it and say nothing of the endpoint now.
    if any(rate > limit for rate in (*pace.running, *pace.cut)):
        return True
    latest = pace.recent[-FAST_SAMPLES:]
    return bool(latest) and median(latest) > limit


def pace_rate(pace: Pace, usual_rate: float | None, work: float = 1.0) -> float | None:
    """The endpoint's expected rate now: its slow pace when :func:`is_slow` (the larger of its
    recent median, its longest running request and its longest cut one), else the model's
    usual rate."""
    if not is_slow(pace, usual_rate, work):
        return usual_rate
    latest = pace.recent[-FAST_SAMPLES:]
    candidates = [*pace.running, *pace.cut, *([median(latest)] if latest else [])]
    return max(candidates)


def slow_endpoints(
    paces: Mapping[str, Pace], usual_rate: float | None, work: float = 1.0
) -> frozenset[str]:
    """The endpoints of ``paces`` that are slow now."""
    return frozenset(url for url, pace in paces.items() if is_slow(pace, usual_rate, work))


def memory(usual_rate: float | None, work: float) -> float:
    """How long an endpoint's finished requests count as its pace now: :data:`RECENT_S`, or
    :data:`MEMORY_FACTOR` times the usual time of a request of ``work`` units when longer."""
    if usual_rate is None:
        return RECENT_S
    return max(RECENT_S, MEMORY_FACTOR * usual_rate * work)


def fallback_start(
    *, now: float, deadline: float, need_s: float, expected_end: float | None
) -> float | None:
    """When to start the next fallback beside the running attempt (same clock as ``deadline``;
    None: no fallback to start).

    ``need_s``: the time the fallback is kept (its expected time, its queue, a margin);
    ``expected_end``: when the running attempt is expected to answer (None: unknown — it has
    run past its slow mark, or its endpoint is slow now). The attempt's answer must come before
    ``deadline - need_s`` to leave the fallback its time behind it; when it cannot, the
    fallback starts now rather than after a cut, and the first answer wins.
    """
    if need_s <= 0:
        return None
    latest = deadline - need_s
    if expected_end is None or expected_end > latest:
        return now
    return latest


def hedge_after(
    usual_s: float | None, *, own_slow: bool, other_expected_s: float | None
) -> float | None:
    """Seconds after the attempt's start when its hedge starts (None: no figures, no hedge).

    ``usual_s``: the step's own threshold (its endpoint's chosen percentile, or a fixed
    ``after:``). While the attempt's own endpoint is slow now, waiting for its usual tail is
    waiting for the spike: the hedge starts once the attempt has run as long as the other
    endpoint is expected to need for the whole answer (sooner, if the usual threshold is).
    """
    if own_slow and other_expected_s is not None:
        return other_expected_s if usual_s is None else min(usual_s, other_expected_s)
    return usual_s


# ------------------------------------------------------------------ the evidence (state)


@dataclass(slots=True)
class _Running:
    key: str
    group: str
    started: float
    ahead: int
    work: float


@dataclass(frozen=True, slots=True)
class _Done:
    ended: float
    elapsed: float
    ahead: int
    work: float
    started: float
    answered: bool
    """False: cut, failed or cancelled (its rate is a lower bound)."""


@dataclass(slots=True)
class PaceBook:
    """Each endpoint's latest requests and the ones running there, for :class:`Pace`.

    Times are the caller's monotonic seconds. :meth:`start` returns a token for :meth:`end`.
    """

    _done: dict[str, deque[_Done]] = field(default_factory=dict)
    """key -> its latest finished requests (answers, and cuts slower than usual)."""
    _answered: dict[str, float] = field(default_factory=dict)
    """key -> when its latest answer ended (a cut request started before that is answered
    past: the endpoint has been quick since)."""
    _running: dict[int, _Running] = field(default_factory=dict)
    _usual: dict[str, deque[tuple[float, float]]] = field(default_factory=dict)
    """group (model) -> (end, rate) of its latest answers, every endpoint."""
    _tokens: Iterator[int] = field(default_factory=itertools.count)

    def start(self, key: str, now: float, work: float, *, group: str = "") -> int:
        """A request of ``work`` units went to ``key`` (an endpoint of model ``group``) at
        ``now``."""
        ahead = sum(1 for r in self._running.values() if r.key == key)
        token = next(self._tokens)
        self._running[token] = _Running(key, group, now, ahead, max(work, 1e-9))
        return token

    def end(
        self,
        token: int,
        now: float,
        *,
        work: float | None = None,
        keep_if_above: float | None = None,
    ) -> None:
        """The request ended. Answered: ``work`` is its own work units, and its rate is kept.
        Cut, failed or cancelled (``work`` None): its time so far is a lower bound of its rate,
        kept only when above ``keep_if_above`` (the model's usual rate): a request cut or
        failed sooner says nothing of the endpoint's pace."""
        running = self._running.pop(token, None)
        if running is None:
            return
        elapsed = now - running.started
        answered = work is not None
        if work is not None:
            rate = elapsed / (1 + running.ahead) / max(work, 1e-9)
            usual = self._usual.setdefault(running.group, deque(maxlen=USUAL_SAMPLES))
            usual.append((now, rate))
            self._answered[running.key] = max(now, self._answered.get(running.key, now))
        else:
            work = running.work
            if keep_if_above is None:
                return
            share = own_share(elapsed, running.ahead, keep_if_above * work)
            if share / work <= keep_if_above:
                return
        done = self._done.setdefault(running.key, deque(maxlen=FAST_SAMPLES))
        done.append(_Done(now, elapsed, running.ahead, max(work, 1e-9), running.started, answered))

    def usual(self, group: str, now: float) -> float | None:
        """The median rate of ``group``'s answers of the last :data:`USUAL_AGE_S` (None: fewer
        than :data:`MIN_USUAL`)."""
        rates = [rate for ended, rate in self._usual.get(group, ()) if now - ended <= USUAL_AGE_S]
        return median(rates) if len(rates) >= MIN_USUAL else None

    def pace(
        self, key: str, now: float, memory_s: float = RECENT_S, usual_rate: float | None = None
    ) -> Pace:
        """``key``'s pace at ``now``, from its requests ended in the last ``memory_s``
        (:func:`memory`), each counted by :func:`own_share` with the model's ``usual_rate``."""

        def rate(elapsed: float, ahead: int, work: float) -> float:
            usual_s = None if usual_rate is None else usual_rate * work
            return own_share(elapsed, ahead, usual_s) / work

        done = [d for d in self._done.get(key, ()) if now - d.ended <= memory_s]
        recent = tuple(rate(d.elapsed, d.ahead, d.work) for d in done)
        answered = self._answered.get(key)
        cut = tuple(
            rate(d.elapsed, d.ahead, d.work)
            for d in done
            if not d.answered and (answered is None or answered <= d.started)
        )
        running = tuple(
            rate(now - r.started, r.ahead, r.work) for r in self._running.values() if r.key == key
        )
        return Pace(recent, running, cut)

    def running_on(self, keys: Iterable[str]) -> int:
        """Requests running now on any of ``keys``."""
        wanted = set(keys)
        return sum(1 for r in self._running.values() if r.key in wanted)

    def keys(self, prefix: str) -> list[str]:
        """Every key seen that starts with ``prefix`` (``model@``)."""
        seen = set(self._done) | {r.key for r in self._running.values()}
        return sorted(k for k in seen if k.startswith(prefix))
