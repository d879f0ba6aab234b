"""Per-request values, and the seam where tracing plugs into the worker.

Every generation request gets a :class:`RequestContext` (its id, W3C ``traceparent``, priority,
deadline). The worker fills ``attributes`` as the request moves on (admission decision, tokens,
finish reason, status) and calls a :class:`RequestObserver` at the start and at the very end —
for a streamed answer, after the last byte or the client's disconnect, possibly from another task.
The tracing engineer's observer opens the worker's server span in ``request_started`` (as a child
of ``traceparent``), keeps it in ``ctx.state`` and ends it in ``request_finished``. Callbacks,
not a context manager, because a streamed answer ends in a different task than it began.
"""

from __future__ import annotations

import re
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Protocol

__all__ = [
    "NullObserver",
    "RequestContext",
    "RequestObserver",
    "current_request",
    "parse_traceparent",
]

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


def parse_traceparent(value: str | None) -> str | None:
    """The header if it is a valid W3C ``traceparent``, else None (the spec says: ignore it)."""
    if not value:
        return None
    value = value.strip().lower()
    match = _TRACEPARENT.match(value)
    if match is None:
        return None
    version, trace_id, parent_id, _ = match.groups()
    if version == "ff" or trace_id == "0" * 32 or parent_id == "0" * 16:
        return None
    return value


@dataclass(slots=True)
class RequestContext:
    """What the worker knows about one generation request."""

    request_id: str
    endpoint: str
    priority: str = "normal"
    deadline: float | None = None
    """Unix seconds (from ``X-Chainrt-Deadline``)."""
    traceparent: str | None = None
    tracestate: str | None = None
    status: int = 0
    """HTTP status sent (0 until known; 499 when the client went away)."""
    attributes: dict[str, str | int | float | bool] = field(default_factory=dict)
    """``admission``, ``prompt_tokens``, ``completion_tokens``, ``finish_reason``, ``error``..."""
    state: dict[str, object] = field(default_factory=dict)
    """Scratch space for the observer (e.g. its span)."""


current_request: ContextVar[RequestContext | None] = ContextVar(
    "chainrt_worker_request", default=None
)
"""The request being handled, for code running in the handler's task."""


class RequestObserver(Protocol):
    """Told when each generation request starts and ends (tracing plugs in here)."""

    def request_started(self, ctx: RequestContext) -> None:
        """The request's headers were read; nothing else happened yet."""

    def request_finished(self, ctx: RequestContext) -> None:
        """The answer was sent (or abandoned); ``ctx.status`` and ``attributes`` are final."""


class NullObserver:
    """The default observer: does nothing (tracing off costs nothing)."""

    def request_started(self, ctx: RequestContext) -> None:
        """Nothing to do."""

    def request_finished(self, ctx: RequestContext) -> None:
        """Nothing to do."""
