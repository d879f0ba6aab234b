"""Circuit breakers per endpoint and error class, as a pure state machine (DESIGN §7).

One breaker watches one error class on one endpoint::

    closed ──(≥ min_requests results in the window and failure share ≥ failure_rate)──► open
    open ──(cooldown passed: the next request is let through as the one trial)──► half_open
    half_open ──(the trial succeeds)──► closed        half_open ──(the trial fails)──► open

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

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"{self.window=} must be at least 1")
        if not 1 <= self.min_requests <= self.window:
            raise ValueError(f"{self.min_requests=} must be between 1 and window={self.window}")
        if not 0 < self.failure_rate <= 1:
            raise ValueError(f"{self.failure_rate=} must be in (0, 1]")
        if self.cooldown_s < 0:
            raise ValueError(f"{self.cooldown_s=} must be >= 0")


@dataclass(frozen=True, slots=True)
class BreakerState:
    """One breaker's state. ``results`` holds the window, ``True`` meaning a failure."""

    phase: Phase = "closed"
    results: tuple[bool, ...] = ()
    opened_at: float = 0.0
    trial_since: float | None = None
    """When the half-open trial was let through (None: no trial in flight)."""


CLOSED = BreakerState()
"""A fresh breaker."""

BREAKER_CLASSES: tuple[str, ...] = (
    "connect",
    "timeout",
    "5xx",
    "oom",
    "overloaded",
    "low_confidence",
)
"""Error classes that count against an endpoint (others, e.g. bad_output, count as answers).

``low_confidence`` is not an error: it is an answer whose ``confidence_score`` fell below the
step's ``verify.below`` (or the pool model's ``low_confidence_below``); the answer is still used."""

DEFAULT_POLICIES: Mapping[str, BreakerPolicy] = {
    # A refused or dropped connection: the worker is gone; stop sending at once.
    "connect": BreakerPolicy(window=10, min_requests=2, failure_rate=0.5, cooldown_s=2.0),
    # A worker that accepts and never answers costs whole allotments: trip after a few.
    "timeout": BreakerPolicy(window=20, min_requests=4, failure_rate=0.5, cooldown_s=2.0),
    # Scattered 5xx are retried elsewhere; only a mostly failing worker is cut off.
    "5xx": BreakerPolicy(window=20, min_requests=10, failure_rate=0.5, cooldown_s=5.0),
    # OOM (503): the worker recovers in process within seconds.
    "oom": BreakerPolicy(window=10, min_requests=3, failure_rate=0.5, cooldown_s=2.0),
    # 429: busy right now; trip only when nearly everything is refused, and briefly.
    "overloaded": BreakerPolicy(window=20, min_requests=10, failure_rate=0.8, cooldown_s=1.0),
    # A model that mostly answers unsure (wrong weights, bad quantisation, drifted replica) does
    # not recover within seconds: trip on a clear majority, and stay away for a while.
    "low_confidence": BreakerPolicy(window=20, min_requests=5, failure_rate=0.5, cooldown_s=30.0),
}
"""The policy of each breaker class unless the pool file overrides it."""


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
        if now - state.opened_at < policy.cooldown_s:
            return None
        return BreakerState("half_open", (), state.opened_at, trial_since=now)
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
        return BreakerState("closed", results)
    if state.phase == "half_open" and trial:
        return BreakerState("open", (), opened_at=now) if failed else CLOSED
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
