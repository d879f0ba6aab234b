"""Circuit breakers per endpoint and error class, as a pure state machine (docs/dispatch.md).

One breaker watches one error class on one endpoint::

    closed ──(≥ min_requests results in the window and failure share ≥ failure_rate)──► open
    open ──(cooldown passed: the next request is let through as the one trial)──► half_open
    half_open ──(the trial succeeds)──► closed        half_open ──(the trial fails)──► open

Two refinements, both off unless a policy asks (the ``timeout`` class does, issue 14):

* ``trip_unproven``: an endpoint with no success in its window opens after this many failures,
  before ``min_requests`` — an endpoint that accepts and never answers is found out after one
  judged timeout instead of four, while one that has answered before needs the usual evidence;
* ``max_cooldown_s``: each failed trial doubles the cool-down, up to this — a worker that stays
  hung costs one trial every 30 s instead of one every 2 s.

Each class keeps its own window because the causes differ: a refused connection means the worker
is gone (trip after two), a 429 means it is busy for a moment (trip only when nearly every answer
is one, and cool down briefly). An endpoint admits a request only when every class admits it;
:func:`admit_all` / :func:`record_all` apply that to a mapping of class → state.

Nothing here reads a clock or keeps state: every function takes ``now`` (seconds on any monotonic
scale) and returns a new, frozen :class:`BreakerState`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

__all__ = [
    "BREAKER_CLASSES",
    "CLOSED",
    "DEFAULT_POLICIES",
    "BreakerPolicy",
    "BreakerState",
    "Phase",
    "abandon",
    "abandon_all",
    "admit",
    "admit_all",
    "cooldown",
    "record",
    "record_all",
    "refuses",
]

Phase = Literal["closed", "open", "half_open"]


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    """When one breaker opens and how long it stays open."""

    window: int = 20
    """How many recent results the failure share is computed over."""
    min_requests: int = 5
    """Results needed in the window before the breaker may open."""
    failure_rate: float = 0.5
    """Share of failures (of this class) in the window that opens the breaker."""
    cooldown_s: float = 5.0
    """Time an open breaker refuses everything before it lets one trial through.

    Also how long a trial may stay unanswered before another one is allowed."""
    trip_unproven: int = 0
    """Open after this many failures when the window holds no success at all, even below
    ``min_requests`` (0: never). Only an endpoint that has not answered is judged this early."""
    max_cooldown_s: float | None = None
    """When set, each failed half-open trial doubles the cool-down, up to this (None: the
    cool-down never grows)."""

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"{self.window=} must be at least 1")
        if not 1 <= self.min_requests <= self.window:
            raise ValueError(f"{self.min_requests=} must be between 1 and window={self.window}")
        if not 0 < self.failure_rate <= 1:
            raise ValueError(f"{self.failure_rate=} must be in (0, 1]")
        if self.cooldown_s < 0:
            raise ValueError(f"{self.cooldown_s=} must be >= 0")
        if self.trip_unproven < 0:
            raise ValueError(f"{self.trip_unproven=} must be >= 0")
        if self.max_cooldown_s is not None and self.max_cooldown_s < self.cooldown_s:
            raise ValueError(f"{self.max_cooldown_s=} must be at least {self.cooldown_s=}")


@dataclass(frozen=True, slots=True)
class BreakerState:
    """One breaker's state. ``results`` holds the window, ``True`` meaning a failure."""

    phase: Phase = "closed"
    results: tuple[bool, ...] = ()
    opened_at: float = 0.0
    trial_since: float | None = None
    """When the half-open trial was let through (None: no trial in flight)."""
    failed_trials: int = 0
    """Half-open trials failed in a row since the breaker last closed (grows the cool-down)."""


CLOSED = BreakerState()
"""A fresh breaker."""

BREAKER_CLASSES: tuple[str, ...] = (
    "connect",
    "timeout",
    "5xx",
    "oom",
    "overloaded",
    "low_confidence",
    "auth",
)
"""Error classes that count against an endpoint (others, e.g. bad_output, count as answers).

``low_confidence`` is not an error: it is an answer whose ``confidence_score`` fell below the
step's ``verify.below`` (or the pool model's ``low_confidence_below``); the answer is still used."""

DEFAULT_POLICIES: Mapping[str, BreakerPolicy] = {
    # A refused or dropped connection: the worker is gone; stop sending at once.
    "connect": BreakerPolicy(window=10, min_requests=2, failure_rate=0.5, cooldown_s=2.0),
    # A worker that accepts and never answers costs whole allotments: trip after a few, or
    # after the first when it has never answered; a worker that stays hung is tried less often.
    "timeout": BreakerPolicy(
        window=20,
        min_requests=4,
        failure_rate=0.5,
        cooldown_s=2.0,
        trip_unproven=1,
        max_cooldown_s=30.0,
    ),
    # Scattered 5xx are retried elsewhere; only a mostly failing worker is cut off.
    "5xx": BreakerPolicy(window=20, min_requests=10, failure_rate=0.5, cooldown_s=5.0),
    # OOM (503): the worker recovers in process within seconds.
    "oom": BreakerPolicy(window=10, min_requests=3, failure_rate=0.5, cooldown_s=2.0),
    # 429: busy right now; trip only when nearly everything is refused, and briefly.
    "overloaded": BreakerPolicy(window=20, min_requests=10, failure_rate=0.8, cooldown_s=1.0),
    # A model that mostly answers unsure (wrong weights, bad quantisation, drifted replica) does
    # not recover within seconds: trip on a clear majority, and stay away for a while.
    "low_confidence": BreakerPolicy(window=20, min_requests=5, failure_rate=0.5, cooldown_s=30.0),
    # 401/403: the key is wrong, expired or rotated, a configuration error that no retry fixes:
    # open at the first one, and try again (the key may have been replaced) now and then.
    "auth": BreakerPolicy(
        window=1, min_requests=1, failure_rate=1.0, cooldown_s=30.0, max_cooldown_s=300.0
    ),
}
"""The policy of each breaker class unless the pool file overrides it."""


def cooldown(state: BreakerState, policy: BreakerPolicy) -> float:
    """Seconds an open breaker in ``state`` refuses before its next trial: the policy's
    cool-down, doubled for each failed trial in a row up to ``max_cooldown_s`` (when set)."""
    if policy.max_cooldown_s is None or state.failed_trials <= 0:
        return policy.cooldown_s
    return min(policy.cooldown_s * 2.0 ** min(state.failed_trials, 32), policy.max_cooldown_s)


def refuses(state: BreakerState, policy: BreakerPolicy, now: float) -> bool:
    """True when :func:`admit` would refuse a request at ``now`` (no state change)."""
    return admit(state, policy, now) is None


def admit(state: BreakerState, policy: BreakerPolicy, now: float) -> BreakerState | None:
    """Let one request through at ``now``: the state afterwards, or None when refused.

    An open breaker whose cool-down has passed turns half-open and lets exactly this request
    through as its trial; while the trial is out, everything else is refused (unless the trial
    has been out for longer than the cool-down: it is presumed lost and a new one goes).
    """
    if state.phase == "closed":
        return state
    if state.phase == "open":
        if now - state.opened_at < cooldown(state, policy):
            return None
        return BreakerState(
            "half_open", (), state.opened_at, trial_since=now, failed_trials=state.failed_trials
        )
    if state.trial_since is not None and now - state.trial_since < policy.cooldown_s:
        return None
    return replace(state, trial_since=now)


def record(
    state: BreakerState, policy: BreakerPolicy, *, failed: bool, now: float, trial: bool
) -> BreakerState:
    """The state after a request ended; ``trial`` says whether it was the half-open trial.

    Results of requests let through before the breaker opened (stragglers) change nothing once
    it is open or half-open: only the trial decides.
    """
    if state.phase == "closed":
        results = (*state.results, failed)[-policy.window :]
        if len(results) >= policy.min_requests and _share(results) >= policy.failure_rate:
            return BreakerState("open", (), opened_at=now)
        if 0 < policy.trip_unproven <= len(results) and all(results):
            return BreakerState("open", (), opened_at=now)  # never answered: found out early
        return BreakerState("closed", results)
    if state.phase == "half_open" and trial:
        if failed:
            return BreakerState("open", (), opened_at=now, failed_trials=state.failed_trials + 1)
        # The trial's success is the window's first result: the endpoint has answered, so one
        # more failure alone does not reopen it (trip_unproven).
        return BreakerState("closed", (False,))
    return state


def abandon(state: BreakerState, *, trial: bool) -> BreakerState:
    """The state after a request ended with no verdict (cancelled): a lost trial frees its slot."""
    if state.phase == "half_open" and trial:
        return replace(state, trial_since=None)
    return state


def _share(results: tuple[bool, ...]) -> float:
    return sum(results) / len(results)


# ------------------------------------------------------------------ one endpoint, every class


def admit_all(
    states: Mapping[str, BreakerState], policies: Mapping[str, BreakerPolicy], now: float
) -> tuple[dict[str, BreakerState], frozenset[str]] | None:
    """Admit one request on an endpoint: every class must agree, or nothing changes.

    Returns the new states and the classes for which this request is the half-open trial, or
    None when some class refuses.
    """
    updated: dict[str, BreakerState] = {}
    trials: set[str] = set()
    for name, policy in policies.items():
        state = states.get(name, CLOSED)
        after = admit(state, policy, now)
        if after is None:
            return None
        updated[name] = after
        if after.phase == "half_open":
            trials.add(name)
    return updated, frozenset(trials)


def record_all(
    states: Mapping[str, BreakerState],
    policies: Mapping[str, BreakerPolicy],
    *,
    error_class: str | None,
    now: float,
    trials: frozenset[str],
) -> dict[str, BreakerState]:
    """Record one request's end on every class: a failure for ``error_class``, a success
    (an answer came back, or the failure was of another kind) for the rest."""
    return {
        name: record(
            states.get(name, CLOSED),
            policy,
            failed=name == error_class,
            now=now,
            trial=name in trials,
        )
        for name, policy in policies.items()
    }


def abandon_all(
    states: Mapping[str, BreakerState], trials: frozenset[str]
) -> dict[str, BreakerState]:
    """Free the trial slots a cancelled request held."""
    return {name: abandon(state, trial=name in trials) for name, state in states.items()}
