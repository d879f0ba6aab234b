"""The seam between the runtime and tracing: spans, and the trace context workers receive.

Tracing's interceptors (:mod:`chainrt.tracing._intercept`), wrapped around the runner, the store,
the limiter and the model backends at assembly, call ``hooks.span(name, attributes)`` around the
work docs/tracing.md names (``chain.run``, ``chain.step``, ``concurrency.acquire``,
``checkpoint.write``, ``llm.dispatch``); the runner and dispatcher never do. Hooks that override
nothing (:data:`NO_HOOKS`: tracing off) are not wrapped around anything (:func:`observes`), so
tracing that is off costs nothing at all.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any

__all__ = ["NO_HOOKS", "Hooks", "NoHooks", "Span", "observes"]


class Span(AbstractContextManager["Span"]):
    """A unit of observed work. Methods are no-ops here; tracing overrides them."""

    def set(self, **attributes: Any) -> None:
        """Add attributes (``None`` values are dropped by implementations)."""

    def event(self, name: str, **attributes: Any) -> None:
        """Record a point-in-time event on the span."""

    def error(self, exc: BaseException) -> None:
        """Record an error and mark the span failed."""

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None


_NULL_SPAN = Span()


class Hooks:
    """Observer interface. Subclass and override; every method has a cheap default."""

    def span(
        self,
        name: str,
        attributes: dict[str, Any] | None = None,
        *,
        links: list[dict[str, Any]] | None = None,
    ) -> Span:
        """Open a span named ``name`` as a child of the current one (use as a context manager).

        ``links`` are trace contexts (``{"trace_id": hex, "span_id": hex}``) to link to, used when
        a resumed run points back at the original run's trace.
        """
        return _NULL_SPAN

    def traceparent(self) -> str | None:
        """The W3C ``traceparent`` of the current span, to forward to workers (None when off)."""
        return None

    def current_ids(self) -> dict[str, Any]:
        """``{"trace_id": ..., "span_id": ...}`` of the current span (empty when off)."""
        return {}

    def trace_url(self, trace_id: str) -> str | None:
        """Where a person can look at a trace (e.g. the Jaeger UI), or None."""
        return None

    def flush(self) -> None:
        """Export what is buffered (the CLI calls it before exiting)."""


class NoHooks(Hooks):
    """Hooks that observe nothing."""


NO_HOOKS = NoHooks()


def observes(hooks: Hooks) -> bool:
    """True when ``hooks`` records anything: it overrides :meth:`Hooks.span` or
    :meth:`Hooks.traceparent`. Hooks that do not are not worth wrapping anything in."""
    kind = type(hooks)
    return kind.span is not Hooks.span or kind.traceparent is not Hooks.traceparent
