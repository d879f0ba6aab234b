"""Tracing with no collector listening: one chainrt line, no trace link, no SDK retry loop.

The collector here is real: a stdlib HTTP server answering OTLP/HTTP ``POST /v1/traces``; "no
collector" is a port nothing listens on. The SDK's own OTLP exporters are used unmodified.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExportResult

from chainrt.testing.redis_server import free_port
from chainrt.tracing._export import ReportingExporter, otlp_target

ROOT = Path(__file__).resolve().parent.parent
CHAIN = "name: traced\nbudget: 10s\nsteps:\n  - id: a\n    tool: tools.py:one\n"
CLI = (sys.executable, "-m", "chainrt", "run")
TOOLS = "def one() -> int:\n    return 1\n"


class Receiver:
    """An OTLP/HTTP endpoint that accepts every batch and counts them."""

    def __init__(self, port: int = 0) -> None:
        receiver = self
        self.batches = 0

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                receiver.batches += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    got = Receiver()
    yield got
    got.close()


def run_traced(tmp_path: Path, **otel: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "chain.yaml").write_text(CHAIN)
    (tmp_path / "tools.py").write_text(TOOLS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(PYTHONPATH=str(ROOT), CHAINRT_STORE=f"sqlite:///{tmp_path / 'runs.db'}", **otel)
    return subprocess.run(
        [*CLI, "chain.yaml", "--input", "{}", "--trace", "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_no_collector_is_one_chainrt_line_and_no_trace_link(tmp_path: Path, protocol: str) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    done = run_traced(
        tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_EXPORTER_OTLP_PROTOCOL=protocol
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "completed"
    assert "trace_url" not in result  # the trace never reached a collector
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(
        f"chainrt: traces not exported: no OTLP collector answered at "
        f"{endpoint.removeprefix('http://')}"
    )
    assert "Transient error" not in done.stderr


def test_with_a_collector_the_link_is_printed_and_nothing_else(
    tmp_path: Path, receiver: Receiver
) -> None:
    done = run_traced(tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["trace_url"].startswith("http://localhost:16686/trace/")
    assert done.stderr == ""
    assert receiver.batches >= 1


def hexid(span: ReadableSpan) -> str:
    assert span.context is not None
    return format(span.context.trace_id, "032x")


def spans(n: int = 3) -> list[ReadableSpan]:
    tracer = TracerProvider().get_tracer("test")
    out: list[ReadableSpan] = []
    for i in range(n):
        span = tracer.start_span(f"s{i}")
        span.end()
        assert isinstance(span, ReadableSpan)
        out.append(span)
    return out


def test_a_dead_collector_fails_at_once_where_the_sdk_exporter_retries() -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1/traces"
    batch = spans()
    started = time.monotonic()
    raw = OTLPSpanExporter(endpoint=dead, timeout=3.0).export(batch)
    raw_s = time.monotonic() - started
    wrapped = ReportingExporter(OTLPSpanExporter(endpoint=dead, timeout=3.0), otlp_target(dead, ""))
    started = time.monotonic()
    result = wrapped.export(batch)
    wrapped_s = time.monotonic() - started
    assert raw is SpanExportResult.FAILURE
    assert result is SpanExportResult.FAILURE
    # The SDK exporter backs off and retries (about a second) before giving up; the wrapper
    # spends one refused connect. Both measured here, so load slows both.
    assert wrapped_s < raw_s, (wrapped_s, raw_s)
    assert not wrapped.exported(hexid(batch[0]))


def test_one_warning_per_outage_and_delivery_known_per_trace(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    exporter = ReportingExporter(
        OTLPSpanExporter(endpoint=f"{url}/v1/traces", timeout=3.0), otlp_target(url, "")
    )
    lost, lost_again = spans(2), spans(1)
    with caplog.at_level(logging.INFO, logger="chainrt.tracing"):
        assert exporter.export(lost) is SpanExportResult.FAILURE
        assert exporter.export(lost_again) is SpanExportResult.FAILURE
        receiver = Receiver(port)  # the collector comes up on that port
        try:
            sent = spans(2)
            assert exporter.export(sent) is SpanExportResult.SUCCESS
        finally:
            receiver.close()
    messages = [r.getMessage() for r in caplog.records if r.name == "chainrt.tracing"]
    assert len(messages) == 2, messages
    assert messages[0].startswith(
        f"traces not exported: no OTLP collector answered at 127.0.0.1:{port}"
    )
    assert messages[1] == f"traces are exported to 127.0.0.1:{port} again"
    assert receiver.batches == 1
    assert exporter.exported(hexid(sent[0]))
    assert not exporter.exported(hexid(lost[0]))
    assert not exporter.exported(hexid(lost_again[0]))
    assert not exporter.exported("not hex")


@pytest.mark.parametrize(
    ("endpoint", "protocol", "target"),
    [
        (None, "http/protobuf", ("localhost", 4318)),
        (None, "grpc", ("localhost", 4317)),
        ("http://jaeger:4318", "http/protobuf", ("jaeger", 4318)),
        ("jaeger:4317", "grpc", ("jaeger", 4317)),
        ("https://otel.example.com/v1/traces", "http/protobuf", ("otel.example.com", 443)),
    ],
)
def test_otlp_target(endpoint: str | None, protocol: str, target: tuple[str, int]) -> None:
    assert otlp_target(endpoint, protocol) == target


def test_no_probe_through_a_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("NO_PROXY", "localhost")
    via_proxy = ReportingExporter(OTLPSpanExporter(), ("otel.example.com", 4318))
    direct = ReportingExporter(OTLPSpanExporter(), ("localhost", 4318))
    assert via_proxy.probe is False  # a direct connect would say nothing about the collector
    assert direct.probe is True
