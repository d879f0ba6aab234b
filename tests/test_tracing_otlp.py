"""The worker's server span, and end to end: runner and worker processes export to real receivers.

In process, the worker app (real llama.cpp engine, served by uvicorn) with the tracing observer
opens its SERVER span as the child of the caller's ``traceparent``. End to end, the receiver is
built here from ``opentelemetry-proto``: an OTLP/HTTP endpoint (``POST
/v1/traces``, protobuf bodies, gzip or not) on a stdlib HTTP server, and an OTLP/gRPC endpoint on
``grpcio``. ``chainrt run --trace`` runs an LLM step whose model is served by a real
``chainrt-worker`` (llama.cpp) through a pool file; the runner's spans and the worker's server
span must arrive with one trace id, the worker's span a child of the runner's ``llm.dispatch``.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.trace import SpanKind, StatusCode
from worker_fixtures import REPO, WorkerProcess

from chainrt.tracing import _attributes as attr
from chainrt.tracing import in_memory_hooks

SERVER, CLIENT = 2, 3  # opentelemetry.proto.trace.v1.Span.SpanKind values


@dataclass(frozen=True)
class Got:
    """One received span, flattened."""

    service: str
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


class Sink:
    """Every span the receivers got, from any process."""

    def __init__(self) -> None:
        self.spans: list[Got] = []
        self.requests = 0
        self._cond = threading.Condition()

    def add(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        got = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    got.append(
                        Got(
                            service=str(resource.get("service.name")),
                            name=span.name,
                            kind=span.kind,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            attributes={a.key: _value(a.value) for a in span.attributes},
                        )
                    )
        with self._cond:
            self.requests += 1
            self.spans.extend(got)
            self._cond.notify_all()

    def wait_for(self, predicate: Any, timeout_s: float = 20.0) -> list[Got]:
        """Wait until ``predicate(spans)`` holds; return the spans then (or after the timeout)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not predicate(self.spans) and time.monotonic() < deadline:
                self._cond.wait(max(0.0, deadline - time.monotonic()))
            return list(self.spans)


def _http_receiver(sink: Sink) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            try:
                request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
            except Exception:
                self.send_error(400, "not an ExportTraceServiceRequest")
                return
            sink.add(request)
            reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _grpc_receiver(sink: Sink) -> tuple[Any, int]:
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

    class Service(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:
            sink.add(request)
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


@pytest.fixture(scope="module")
def sink() -> Sink:
    return Sink()


@pytest.fixture(scope="module")
def receivers(sink: Sink) -> Iterator[dict[str, str]]:
    """Both OTLP receivers: protocol → endpoint URL."""
    http_server = _http_receiver(sink)
    grpc_server, grpc_port = _grpc_receiver(sink)
    yield {
        "http/protobuf": f"http://127.0.0.1:{http_server.server_address[1]}",
        "grpc": f"http://127.0.0.1:{grpc_port}",
    }
    http_server.shutdown()
    http_server.server_close()
    grpc_server.stop(0)


@pytest.fixture(scope="module")
def worker(receivers: dict[str, str]) -> Iterator[WorkerProcess]:
    """A real worker serving ``primary`` with llama.cpp, exporting its spans over OTLP/HTTP."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receivers["http/protobuf"])
        env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        env.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # export within 0.1 s, not 5 s
        env.delenv("OTEL_SERVICE_NAME", raising=False)
        proc = WorkerProcess("--engine", "local", "--served-model-name", "primary")
        proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def _chainrt(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    full["PYTHONPATH"] = os.pathsep.join(p for p in [str(REPO), full.get("PYTHONPATH")] if p)
    full.update(env)
    return subprocess.run(
        [sys.executable, "-m", "chainrt", *args],
        cwd=cwd,
        env=full,
        capture_output=True,
        text=True,
        timeout=90,
    )


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_runner_and_worker_spans_of_one_run_form_one_trace(
    protocol: str,
    receivers: dict[str, str],
    worker: WorkerProcess,
    sink: Sink,
    tmp_path: Path,
) -> None:
    (tmp_path / "pool.yaml").write_text(
        f'models:\n  primary:\n    endpoints:\n      - {{url: "{worker.base}", capacity: 1000}}\n',
        encoding="utf-8",
    )
    (tmp_path / "chain.yaml").write_text(
        "name: traced_e2e\nbudget: 60s\nsteps:\n"
        "  - id: answer\n"
        '    llm: {model: primary, prompt: "Say hello.", max_tokens: 2}\n',
        encoding="utf-8",
    )
    run_id = f"e2e-{protocol.replace('/', '-')}"
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    args = ["run", "chain.yaml", "--input", "{}", "--run-id", run_id, "--store", store]
    done = _chainrt(
        [*args, "--pool", "pool.yaml", "--trace", "--json"],
        tmp_path,
        OTEL_EXPORTER_OTLP_ENDPOINT=receivers[protocol],
        OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "completed", result
    assert result["steps"][0]["model"] == "primary"  # answered by the worker, no fallback

    def mine(spans: list[Got]) -> list[Got]:
        runs = [
            s
            for s in spans
            if s.name == "chain.run" and s.attributes.get("chainrt.run_id") == run_id
        ]
        return [s for s in spans if runs and s.trace_id == runs[0].trace_id]

    # The runner flushed before it exited; the worker exports within its 0.1 s batch delay.
    spans = mine(sink.wait_for(lambda all_: any(s.service == "chainrt-worker" for s in mine(all_))))
    runner = [s for s in spans if s.service == "chainrt-runner"]
    served = [s for s in spans if s.service == "chainrt-worker"]
    assert served, (
        "no worker span arrived in the run's trace: is "
        "`observer=observer_from_env(engine.name)` wired into create_app in chainrt-worker serve?"
        f"\nworker log:\n{worker.logs()[-2000:]}"
    )
    tagged = {s.trace_id for s in sink.spans if s.attributes.get("chainrt.run_id") == run_id}
    assert len(tagged) == 1  # one run, one trace

    by_name: dict[str, list[Got]] = {}
    for span in runner:
        by_name.setdefault(span.name, []).append(span)
    (run,) = by_name["chain.run"]
    (step,) = by_name["chain.step"]
    (dispatch,) = by_name["llm.dispatch"]
    (server,) = served
    assert run.parent_id == ""
    assert step.parent_id == run.span_id
    assert dispatch.parent_id == step.span_id
    assert dispatch.kind == CLIENT
    assert all(w.parent_id == run.span_id for w in by_name["checkpoint.write"])
    # The worker's span is the child of the attempt that called it.
    assert server.name == "POST /v1/chat/completions"
    assert server.kind == SERVER
    assert server.parent_id == dispatch.span_id
    assert server.attributes["chainrt.admission"] == "admit"
    assert server.attributes["http.response.status_code"] == 200
    assert 1 <= server.attributes["gen_ai.usage.output_tokens"] <= 2
    assert step.attributes["chainrt.step_id"] == "answer"

    shown = _chainrt(["inspect", run_id, "--store", store, "--json"], tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["trace_url"] == f"http://localhost:16686/trace/{run.trace_id}"


async def test_worker_server_span_is_the_child_of_the_callers_traceparent() -> None:
    import socket

    import httpx
    import uvicorn

    from chainrt.engines import LocalEngine
    from workers.server import WorkerConfig, create_app
    from workers.server._tracing import TracingObserver

    hooks = in_memory_hooks()
    app = create_app(
        LocalEngine(), WorkerConfig(), observer=TracingObserver(hooks.provider, engine="local")
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            assert not serving.done(), "the worker did not start"
            await asyncio.sleep(0.05)
        with hooks.span("llm.dispatch"):
            parent = hooks.current_ids()
            headers = {"traceparent": hooks.traceparent() or "", "X-Priority": "high"}
        messages = [{"role": "user", "content": "Say hello."}]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            ok = await client.post(
                "/v1/chat/completions",
                json={"model": "local", "messages": messages, "max_tokens": 2},
                headers=headers,
            )
            refused = await client.post(
                "/v1/chat/completions",
                json={"model": "local", "messages": messages, "max_tokens": 1_000_000},
            )
    finally:
        server.should_exit = True
        await serving
        sock.close()
    assert ok.status_code == 200, ok.text
    assert refused.status_code == 413, refused.text
    served = [
        s
        for s in hooks.exporter.get_finished_spans()  # type: ignore[union-attr]
        if s.name == "POST /v1/chat/completions"
    ]
    child, orphan = sorted(served, key=lambda s: s.start_time or 0)
    assert child.kind is SpanKind.SERVER
    assert child.context is not None
    assert child.parent is not None
    assert format(child.context.trace_id, "032x") == parent["trace_id"]
    assert format(child.parent.span_id, "016x") == parent["span_id"]
    assert child.attributes is not None
    assert child.attributes[attr.ADMISSION] == "admit"
    assert child.attributes[attr.PRIORITY] == "high"
    assert child.attributes[attr.HTTP_RESPONSE_STATUS_CODE] == 200
    assert child.attributes[attr.GEN_AI_USAGE_INPUT_TOKENS] > 5
    assert 1 <= child.attributes[attr.GEN_AI_USAGE_OUTPUT_TOKENS] <= 2
    assert child.attributes[attr.GEN_AI_RESPONSE_FINISH_REASONS] == ("length",)
    # Without traceparent a request starts a trace of its own; a refusal says why.
    assert orphan.parent is None
    assert orphan.attributes is not None
    assert orphan.attributes[attr.HTTP_RESPONSE_STATUS_CODE] == 413
    assert orphan.attributes[attr.ADMISSION] == "context_length_exceeded"
    assert orphan.status.status_code is StatusCode.UNSET  # a 4xx is the client's error
