"""OpenTelemetry behind the runtime's :class:`~chainrt._hooks.Hooks` seam.

The runner and dispatch only ever call ``hooks.span(...)``; this module turns those calls into
OpenTelemetry spans of one :class:`TracerProvider` that the caller owns (never the global one,
so tests and embedding applications keep theirs). A span opened here becomes the current span
(a context variable) until it closes, so spans opened inside it — in the same task or in tasks
started from it — nest as its children, and ``traceparent()`` names it to the workers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from contextvars import Token
from types import TracebackType
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from .._errors import ChainRTError
from .._hooks import Hooks, Span
from . import _attributes as attr
from ._export import ReportingExporter

__all__ = ["OtelHooks", "clean_attributes"]

_KINDS: dict[str, SpanKind] = {attr.SPAN_DISPATCH: SpanKind.CLIENT}
"""Span kinds other than INTERNAL: an ``llm.dispatch`` attempt is the client side of a request."""

_TRACE_ID = re.compile(r"^[0-9a-f]{32}$")
_SPAN_ID = re.compile(r"^[0-9a-f]{16}$")
_MAX_LINKS = 32
"""Links kept on one span; a run resumed more often than this links to its latest executions."""
_PLAIN = (str, bool, int, float)
_PROPAGATOR = TraceContextTextMapPropagator()


def clean_attributes(attributes: Mapping[str, Any]) -> dict[str, AttributeValue]:
    """Attributes OpenTelemetry accepts: ``None`` dropped, other values coerced, never rejected.

    Strings, booleans, ints and floats pass as they are; a list or tuple becomes a homogeneous
    tuple (of strings when its items differ in type); anything else (a dict) becomes JSON text.
    """
    out: dict[str, AttributeValue] = {}
    for name, value in attributes.items():
        if value is None:
            continue
        if type(value) in _PLAIN:  # the common case, checked first because it is cheap
            out[name] = value
        else:
            out[name] = _coerce(value)
    return out


def _coerce(value: Any) -> AttributeValue:
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, list | tuple | set | frozenset):
        items = [v for v in value if v is not None]
        kinds = {type(_coerce(v)) for v in items}
        if kinds == {bool}:
            return tuple(bool(v) for v in items)
        if kinds == {int}:
            return tuple(int(v) for v in items)
        if kinds and kinds <= {int, float}:
            return tuple(float(v) for v in items)
        return tuple(v if isinstance(v, str) else _text(v) for v in items)
    return _text(value)


def _text(value: Any) -> str:
    try:
        return json.dumps(value, default=str, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError):  # circular structures and the like
        return repr(value)


def _links(items: Iterable[Mapping[str, Any]]) -> list[Link]:
    """Span links to the trace contexts in ``items`` and to those they were resumed from.

    The ids come from a stored run record: an id that is not well-formed hex is skipped rather
    than failing the run that reads it.
    """
    links: list[Link] = []
    seen: set[tuple[int, int]] = set()
    pending = list(items)
    while pending and len(links) < _MAX_LINKS:
        item = pending.pop(0)
        if not isinstance(item, Mapping):
            continue
        earlier = item.get("resumed_from")
        if isinstance(earlier, list):
            pending.extend(earlier)
        trace_hex, span_hex = item.get("trace_id"), item.get("span_id")
        if not (isinstance(trace_hex, str) and _TRACE_ID.match(trace_hex)):
            continue
        if not (isinstance(span_hex, str) and _SPAN_ID.match(span_hex)):
            continue
        ids = (int(trace_hex, 16), int(span_hex, 16))
        if 0 in ids or ids in seen:
            continue
        seen.add(ids)
        context = SpanContext(
            trace_id=ids[0],
            span_id=ids[1],
            is_remote=True,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )
        links.append(Link(context, {attr.LINK_KIND: "resumed_from"}))
    return links


class _OtelSpan(Span):
    """One OpenTelemetry span, current (in this context) between enter and exit.

    Attributes are collected in a dict and handed to the SDK once, when the span ends: the SDK
    validates attributes under a lock one call at a time, and one pass instead of two (start,
    end) is most of what keeps a span near 15 µs. Nothing reads them before the end: samplers
    see the span's name and parent, and exporters see finished spans only.
    """

    __slots__ = ("_attributes", "_failed", "_span", "_token")

    def __init__(self, span: trace.Span, attributes: dict[str, Any] | None) -> None:
        self._span = span
        self._attributes = dict(attributes) if attributes else {}
        self._token: Token[otel_context.Context] | None = None
        self._failed = False

    def __enter__(self) -> _OtelSpan:
        self._token = otel_context.attach(trace.set_span_in_context(self._span))
        return self

    def set(self, **attributes: Any) -> None:
        """Add attributes; ``None`` values are dropped."""
        self._attributes.update(attributes)

    def event(self, name: str, **attributes: Any) -> None:
        """Record a point-in-time event."""
        self._span.add_event(name, clean_attributes(attributes))

    def error(self, exc: BaseException) -> None:
        """Record ``exc`` as an ``exception`` event and set the span's status to ERROR."""
        self._failed = True
        message = exc.message if isinstance(exc, ChainRTError) else str(exc)
        self._span.record_exception(exc)
        self._attributes[attr.ERROR_TYPE] = type(exc).__qualname__
        self._span.set_status(Status(StatusCode.ERROR, message or type(exc).__name__))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if exc is not None and not self._failed:
                self.error(exc)  # an exception leaving the span is its error (cancellation too)
        finally:
            if self._token is not None:
                otel_context.detach(self._token)
                self._token = None
            if self._attributes:
                self._span.set_attributes(clean_attributes(self._attributes))
            self._span.end()


class OtelHooks(Hooks):
    """Hooks that record OpenTelemetry spans with a tracer of ``provider``.

    ``exporter`` is kept for callers that want to read what was exported (the in-memory exporter
    of :func:`chainrt.tracing.in_memory_hooks`); ``jaeger_url`` is where :meth:`trace_url` points.
    ``delivery`` is the OTLP exporter's wrapper: with it, :meth:`trace_url` names only traces that
    reached the collector.
    """

    def __init__(
        self,
        provider: TracerProvider,
        *,
        jaeger_url: str = "http://localhost:16686",
        exporter: SpanExporter | None = None,
        flush_timeout_s: float = 5.0,
        delivery: ReportingExporter | None = None,
    ) -> None:
        from .._version import __version__

        self.provider = provider
        self.exporter = exporter
        self.delivery = delivery
        self.jaeger_url = jaeger_url.rstrip("/")
        self._flush_timeout_ms = int(flush_timeout_s * 1000)
        self._tracer = provider.get_tracer("chainrt", __version__)

    def span(
        self,
        name: str,
        attributes: dict[str, Any] | None = None,
        *,
        links: list[dict[str, Any]] | None = None,
    ) -> Span:
        """Start span ``name`` as a child of the current span; it becomes current when entered."""
        span = self._tracer.start_span(
            name,
            kind=_KINDS.get(name, SpanKind.INTERNAL),
            links=_links(links) if links else None,
            # Exceptions are recorded by _OtelSpan itself, once, with chainrt's message.
            record_exception=False,
            set_status_on_exception=False,
        )
        return _OtelSpan(span, attributes)

    def traceparent(self) -> str | None:
        """The W3C ``traceparent`` header naming the current span (None outside any span)."""
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier)
        return carrier.get("traceparent")

    def current_ids(self) -> dict[str, Any]:
        """``{"trace_id", "span_id"}`` of the current span as lowercase hex (empty outside)."""
        context = trace.get_current_span().get_span_context()
        if not context.is_valid:
            return {}
        return {
            "trace_id": format(context.trace_id, "032x"),
            "span_id": format(context.span_id, "016x"),
        }

    def trace_url(self, trace_id: str) -> str | None:
        """The Jaeger UI page of ``trace_id``; None when its spans were not delivered.

        With an OTLP exporter the buffered spans are flushed first (bounded by
        ``flush_timeout_s``), so the answer is about this trace's spans, not a guess.
        """
        if self.delivery is not None:
            self.flush()
            if not self.delivery.exported(trace_id):
                return None
        return f"{self.jaeger_url}/trace/{trace_id}"

    def flush(self) -> None:
        """Export every finished span now (waits at most ``flush_timeout_s``)."""
        self.provider.force_flush(self._flush_timeout_ms)
