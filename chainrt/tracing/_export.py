"""OTLP export that reports in chainrt's words and knows which traces actually left the process.

Without it, a run traced while no collector listens prints the OpenTelemetry SDK's own retry
lines ("Transient error ... retrying in 1.03s", "Failed to export spans batch ..."), waits out the
exporter's retries at exit, and the CLI prints a Jaeger link to a trace that was never sent.

:class:`ReportingExporter` wraps the SDK's OTLP exporter:

- before a batch goes out it checks, with one TCP connect bounded by ``probe_timeout_s``, that
  something listens at the endpoint (a success is trusted for ``probe_ttl_s``); when nothing does,
  the batch is dropped at once — no retry loop, so exit stays bounded (no probe when a proxy
  variable routes the exporter's traffic: the SDK exporter then decides alone);
- the SDK exporter's log lines are kept out of the output while it runs inside this wrapper
  (only in the exporting thread; an application's own exporters keep their logs); instead, one
  ``chainrt.tracing`` warning says when export stops working and one info line when it works again;
- :meth:`ReportingExporter.exported` says whether every batch carrying a trace was accepted, so
  a trace link is printed only for a trace that reached the collector.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from urllib.parse import urlsplit

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

__all__ = ["ReportingExporter", "otlp_target"]

log = logging.getLogger("chainrt.tracing")

SDK_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
)
"""Loggers of the SDK's OTLP span exporters, quieted while they run inside the wrapper."""

_MAX_TRACES = 10_000
"""Trace ids remembered (sent or failed); older ones are forgotten first."""

_quiet = threading.local()


class _WhileExporting(logging.Filter):
    """Drops the SDK exporter's records emitted from a thread inside :meth:`export`."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(_quiet, "reporter", None) is None:
            return True
        _quiet.reporter.last_sdk_message = record.getMessage()
        return False


_FILTER = _WhileExporting()
for _name in SDK_LOGGERS:
    logging.getLogger(_name).addFilter(_FILTER)


def proxied(host: str) -> bool:
    """True when the exporter would reach ``host`` through a proxy (``HTTPS_PROXY``...): a direct
    TCP probe would then say nothing about the collector, so none is made."""
    from urllib.request import getproxies, proxy_bypass

    proxies = {k.lower(): v for k, v in getproxies().items() if v}
    if not ({"http", "https", "grpc"} & set(proxies)):
        return False
    return not proxy_bypass(host)


def otlp_target(endpoint: str | None, protocol: str) -> tuple[str, int]:
    """The ``(host, port)`` an OTLP exporter connects to, from its endpoint setting."""
    default = "localhost:4317" if protocol == "grpc" else "localhost:4318"
    raw = (endpoint or default).strip()
    parts = urlsplit(raw if "://" in raw else f"http://{raw}")
    port = parts.port or (443 if parts.scheme == "https" else 4317 if protocol == "grpc" else 4318)
    return parts.hostname or "localhost", port


class ReportingExporter(SpanExporter):
    """An OTLP exporter that fails fast without a collector and remembers what it delivered."""

    def __init__(
        self,
        inner: SpanExporter,
        target: tuple[str, int],
        *,
        probe_timeout_s: float = 0.5,
        probe_ttl_s: float = 10.0,
    ) -> None:
        self.inner = inner
        self.target = target
        self.probe_timeout_s = probe_timeout_s
        self.probe_ttl_s = probe_ttl_s
        self.probe = not proxied(target[0])
        self.last_sdk_message: str | None = None
        self._lock = threading.Lock()
        self._probed_ok_at: float | None = None
        self._failing = False
        self._dropped = 0
        self._traces: OrderedDict[int, bool] = OrderedDict()  # trace id -> every batch sent

    @property
    def where(self) -> str:
        """``host:port`` of the collector, for messages."""
        return f"{self.target[0]}:{self.target[1]}"

    def exported(self, trace_id: str) -> bool:
        """True when spans of ``trace_id`` (hex) were sent and no batch of it was dropped."""
        try:
            key = int(trace_id, 16)
        except ValueError:
            return False
        with self._lock:
            return self._traces.get(key, False)

    def _listening(self) -> str | None:
        """None when something accepts connections at the target; else why not."""
        if not self.probe:
            return None
        now = time.monotonic()
        if self._probed_ok_at is not None and now - self._probed_ok_at < self.probe_ttl_s:
            return None
        try:
            with socket.create_connection(self.target, timeout=self.probe_timeout_s) as sock:
                if sock.getsockname() == sock.getpeername():
                    # Joined to itself (nothing listens on a port of the ephemeral range).
                    raise ConnectionRefusedError(111, "nothing listens (self-connected)")
        except OSError as exc:
            self._probed_ok_at = None
            return exc.strerror or type(exc).__name__
        self._probed_ok_at = now
        return None

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Send ``spans`` if a collector listens; otherwise drop them at once."""
        why = self._listening()
        if why is None:
            _quiet.reporter = self
            self.last_sdk_message = None
            try:
                result = self.inner.export(spans)
            finally:
                _quiet.reporter = None
            if result is not SpanExportResult.SUCCESS:
                self._probed_ok_at = None  # ask again next time
                why = self.last_sdk_message or "the collector refused the batch"
        else:
            result = SpanExportResult.FAILURE
        self._record(spans, ok=why is None)
        self._report(why, len(spans))
        return result

    def _record(self, spans: Sequence[ReadableSpan], *, ok: bool) -> None:
        with self._lock:
            for span in spans:
                context = span.context
                if context is None:
                    continue
                key = context.trace_id
                self._traces[key] = ok and self._traces.get(key, True)
                self._traces.move_to_end(key)
            while len(self._traces) > _MAX_TRACES:
                self._traces.popitem(last=False)

    def _report(self, why: str | None, count: int) -> None:
        if why is None:
            if self._failing:
                log.info("traces are exported to %s again", self.where)
            self._failing, self._dropped = False, 0
            return
        self._dropped += count
        if not self._failing:
            self._failing = True
            log.warning(
                "traces not exported: no OTLP collector answered at %s (%s); spans are "
                "dropped until one does (set OTEL_EXPORTER_OTLP_ENDPOINT, or start Jaeger)",
                self.where,
                why,
            )

    def shutdown(self) -> None:
        """Shut the wrapped exporter down."""
        _quiet.reporter = self
        try:
            self.inner.shutdown()
        finally:
            _quiet.reporter = None

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Flush the wrapped exporter."""
        return self.inner.force_flush(timeout_millis)
