"""The worker's server span: one OpenTelemetry SERVER span per generation request (docs/tracing.md).

:class:`TracingObserver` plugs into the :class:`~workers.server.RequestObserver` seam. When a
request starts it opens ``POST /v1/chat/completions`` (or ``/v1/completions``) as a child of the
request's W3C ``traceparent`` — the runner's ``llm.dispatch`` span — so the runner's and the
worker's spans of one run form one trace. When the answer is sent (for a stream: after its last
byte, possibly in another task) it adds what the worker learnt — the admission decision, token
counts, finish reason, HTTP status — and ends the span. A request without ``traceparent`` starts
a trace of its own.

Wiring (in ``chainrt-worker serve``)::

    app = create_app(engine, config, observer=observer_from_env(engine.name))

``observer_from_env`` reads the standard ``OTEL_*`` variables (service name ``chainrt-worker``
unless ``OTEL_SERVICE_NAME``) and returns a do-nothing observer when tracing is off.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from chainrt import wire
from chainrt.errors import ChainRTError, WorkerError
from chainrt.tracing import WORKER_SERVICE_NAME, tracer_provider_from_env
from chainrt.tracing import attributes as attr

from ._context import NullObserver, RequestContext, RequestObserver

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

__all__ = ["TracingObserver", "observer_from_env"]

_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
_OPERATIONS = {"chat": "chat", "completions": "text_completion"}
_REFUSALS = frozenset(
    {
        wire.INSUFFICIENT_MEMORY,
        wire.QUEUE_FULL,
        wire.CONTEXT_LENGTH_EXCEEDED,
        wire.NOT_READY,
        wire.DEADLINE,
    }
)
"""Error kinds that mean admission said no (when the handler did not say so itself)."""
_STATE_KEY = "otel_span"
_STARTED_KEY = "otel_started"


class TracingObserver:
    """Opens and ends the worker's SERVER span of each generation request."""

    def __init__(self, provider: TracerProvider, *, engine: str) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        from chainrt import __version__

        self.provider = provider
        self.engine = engine
        self._tracer = provider.get_tracer("chainrt.worker", __version__)
        self._propagator = TraceContextTextMapPropagator()

    def request_started(self, ctx: RequestContext) -> None:
        """Open the span, as a child of ``ctx.traceparent`` when the client sent one."""
        from opentelemetry.context import Context
        from opentelemetry.trace import SpanKind

        carrier = {"traceparent": ctx.traceparent or "", "tracestate": ctx.tracestate or ""}
        # An empty Context, never the current one: each request's parent is its own header.
        parent = self._propagator.extract(carrier, context=Context())
        path = _PATHS.get(ctx.endpoint, f"/v1/{ctx.endpoint}")
        ctx.state[_STARTED_KEY] = time.time()
        ctx.state[_STATE_KEY] = self._tracer.start_span(
            attr.worker_span_name(path),
            context=parent,
            kind=SpanKind.SERVER,
            attributes={
                attr.HTTP_REQUEST_METHOD: "POST",
                attr.HTTP_ROUTE: path,
                attr.URL_PATH: path,
                attr.REQUEST_ID: ctx.request_id,
                attr.ENGINE: self.engine,
                attr.GEN_AI_SYSTEM: self.engine,
                attr.GEN_AI_PROVIDER_NAME: self.engine,
                attr.GEN_AI_OPERATION_NAME: _OPERATIONS.get(ctx.endpoint, ctx.endpoint),
            },
        )

    def request_finished(self, ctx: RequestContext) -> None:
        """Add the request's outcome to its span and end it (once)."""
        from opentelemetry.trace import Span, Status, StatusCode

        span = ctx.state.pop(_STATE_KEY, None)
        if not isinstance(span, Span):
            return
        started = ctx.state.pop(_STARTED_KEY, None)
        got = ctx.attributes
        error = got.get("error")
        admission = got.get("admission")
        if admission is None and isinstance(error, str) and error in _REFUSALS:
            admission = error
        values: dict[str, str | int | float | bool | None] = {
            attr.HTTP_RESPONSE_STATUS_CODE: ctx.status or None,
            attr.PRIORITY: ctx.priority,
            attr.ADMISSION: admission,
            attr.GEN_AI_REQUEST_MODEL: got.get("model"),
            attr.GEN_AI_USAGE_INPUT_TOKENS: got.get("prompt_tokens"),
            attr.GEN_AI_USAGE_OUTPUT_TOKENS: got.get("completion_tokens"),
            attr.ERROR_TYPE: error,
        }
        if ctx.deadline is not None and isinstance(started, float):
            values[attr.DEADLINE_MS] = round((ctx.deadline - started) * 1000, 3)
        span.set_attributes({k: v for k, v in values.items() if v is not None})
        finish = got.get("finish_reason")
        if finish is not None:
            span.set_attribute(attr.GEN_AI_RESPONSE_FINISH_REASONS, [str(finish)])
        # HTTP server conventions: a 5xx is the server's failure, a 4xx the client's (unset).
        if ctx.status >= 500 or (ctx.status == 0 and error is not None):
            span.set_status(Status(StatusCode.ERROR, str(error or ctx.status)))
        span.end()


def observer_from_env(engine: str, *, force: bool = False) -> RequestObserver:
    """A :class:`TracingObserver` when ``OTEL_*`` (or ``force``) turn tracing on, else a no-op.

    Unusable ``OTEL_*`` values raise :class:`chainrt.WorkerError` (one line from the CLI).
    """
    try:
        provider = tracer_provider_from_env(WORKER_SERVICE_NAME, force=force)
    except WorkerError:
        raise
    except ChainRTError as exc:
        raise WorkerError(f"cannot set up tracing: {exc.message}") from None
    if provider is None:
        return NullObserver()
    return TracingObserver(provider, engine=engine)
