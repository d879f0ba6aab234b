"""What dispatch knows about each endpoint right now: readiness, breakers, load, Retry-After.

The state is kept per URL and shared by every model served there (a breaker that opened on
``http://gpu-1:8000`` for one model protects the others too). The decisions are the pure
functions of :mod:`._breaker` and :mod:`._choice`; this module only keeps their inputs and applies
their answers. Everything runs on the event loop without awaiting, so no lock is needed. Times
are ``time.monotonic()`` seconds, passed in by the caller.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ._breaker import BreakerPolicy, BreakerState, abandon_all, admit_all, record_all, refuses
from ._choice import Candidate
from ._credentials import EndpointAuth

__all__ = ["EndpointState", "EndpointTable", "Ticket"]


@dataclass(slots=True)
class EndpointState:
    """One endpoint as dispatch sees it."""

    url: str
    in_flight: int = 0
    ready: bool | None = None
    """Last ``/health/ready`` answer (None: not polled yet, treated as ready)."""
    ready_detail: str | None = None
    not_before: float = 0.0
    """No new request before this (monotonic seconds): the endpoint's last ``Retry-After``."""
    breakers: dict[str, BreakerState] = field(default_factory=dict)
    auth: EndpointAuth | None = None
    """The endpoint's key and headers (an unset key variable makes it unusable)."""


@dataclass(frozen=True, slots=True)
class Ticket:
    """One request let through to an endpoint; hand it back to :meth:`EndpointTable.finish`."""

    endpoint: EndpointState
    trials: frozenset[str]
    """Breaker classes for which this request is the half-open trial."""


class EndpointTable:
    """Endpoint states by URL, and the breaker policies that judge them."""

    def __init__(
        self, policies: Mapping[str, BreakerPolicy], *, unready_on_connect_error: bool = True
    ) -> None:
        self.policies = dict(policies)
        self.unready_on_connect_error = unready_on_connect_error
        """Mark an endpoint not ready when a connection to it fails (only when a health poller
        runs to mark it ready again)."""
        self._states: dict[str, EndpointState] = {}

    def state(self, url: str) -> EndpointState:
        """The state of ``url`` (created on first use)."""
        found = self._states.get(url)
        if found is None:
            found = self._states[url] = EndpointState(url)
        return found

    @property
    def urls(self) -> list[str]:
        """Every endpoint known so far."""
        return list(self._states)

    def why_unusable(self, state: EndpointState, now: float) -> str | None:
        """Why no request may go to this endpoint now (None: it may)."""
        if state.auth is not None and (missing := state.auth.missing()) is not None:
            return missing
        if state.ready is False:
            return f"not ready ({state.ready_detail or 'health check failed'})"
        if now < state.not_before:
            return f"asked to wait {(state.not_before - now) * 1000:.0f}ms more (Retry-After)"
        for name, policy in self.policies.items():
            breaker = state.breakers.get(name)
            if breaker is not None and refuses(breaker, policy, now):
                what = "trial in flight" if breaker.phase == "half_open" else "open"
                return f"circuit {what} ({name})"
        return None

    def candidates(
        self, endpoints: Sequence[tuple[str, float]], now: float, avoid: frozenset[str]
    ) -> list[Candidate]:
        """The choice's view of ``endpoints`` ((url, capacity) pairs) at ``now``."""
        out = []
        for url, capacity in endpoints:
            state = self.state(url)
            out.append(
                Candidate(
                    key=url,
                    capacity=capacity,
                    in_flight=state.in_flight,
                    usable=self.why_unusable(state, now) is None,
                    avoided=url in avoid,
                )
            )
        return out

    def admit(self, state: EndpointState, now: float) -> Ticket | None:
        """Let one request through (counting it in flight), or None when a breaker refuses."""
        admitted = admit_all(state.breakers, self.policies, now)
        if admitted is None:
            return None
        state.breakers, trials = admitted
        state.in_flight += 1
        return Ticket(state, trials)

    def finish(
        self,
        ticket: Ticket,
        *,
        error_class: str | None,
        now: float,
        retry_after_s: float | None = None,
    ) -> None:
        """Record how the request ended (``error_class`` None: an answer came back)."""
        state = ticket.endpoint
        state.in_flight -= 1
        state.breakers = record_all(
            state.breakers,
            self.policies,
            error_class=error_class,
            now=now,
            trials=ticket.trials,
        )
        if retry_after_s is not None and retry_after_s > 0:
            state.not_before = max(state.not_before, now + retry_after_s)
        if error_class == "connect" and self.unready_on_connect_error:
            # Nobody answered: not ready until the health poller sees it back.
            state.ready = False
            state.ready_detail = "connection failed"

    def abandon(self, ticket: Ticket) -> None:
        """The request was cancelled before it ended: no verdict, free its trial slot."""
        state = ticket.endpoint
        state.in_flight -= 1
        state.breakers = abandon_all(state.breakers, ticket.trials)
