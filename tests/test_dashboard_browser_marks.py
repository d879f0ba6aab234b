"""The run page's retry mark and trace link, in a real headless Chromium against a real
``chainrt serve`` on Redis with tracing on, exporting to a real OTLP/HTTP receiver built here.

The model ``flaky`` has two endpoints, both real workers with fault injection: the first answers
every generation with a 500 (``error_rate`` 1.0) and has nearly all the capacity, so the first
attempt goes there and the retry to the other endpoint of the same model.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from browser_fixtures import (
    BROWSER_TEST,
    Page,
    checked_page,
    chromium,
    submit,
    wait_status,
)
from worker_fixtures import WorkerProcess

from chainrt.testing.redis_server import RedisServer
from chainrt.testing.serve_process import ServeProcess

CHAINS = Path(__file__).parent / "data" / "dashboard"
JAEGER = "http://jaeger.example:16686"  # only the links' base: nothing is fetched from it

pytestmark = BROWSER_TEST
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (the dev extra has it)"
)
trace_service_pb2 = pytest.importorskip(
    "opentelemetry.proto.collector.trace.v1.trace_service_pb2",
    reason="opentelemetry-proto is not installed (the tracing extra has it)",
)


class Receiver:
    """An OTLP/HTTP receiver (``POST /v1/traces``, protobuf): the trace ids of the spans it got."""

    def __init__(self) -> None:
        self.trace_ids: set[str] = set()
        got = self.trace_ids

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                for resource in request.resource_spans:
                    for scope in resource.scope_spans:
                        got.update(span.trace_id.hex() for span in scope.spans)
                reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    got = Receiver()
    yield got
    got.close()


@pytest.fixture(scope="module")
def server(
    redis_server: RedisServer,
    fault_workers: tuple[WorkerProcess, WorkerProcess],
    receiver: Receiver,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ServeProcess]:
    import redis

    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    failing, good = fault_workers
    failing.post("/admin/faults", json={"error_rate": 1.0})
    pool = tmp_path_factory.mktemp("dashboard-marks") / "pool.yaml"
    # Capacities 1e12 : 1e-6: the first attempt goes to the failing endpoint (the other is
    # chosen first with a chance of 1 in 1e18), the retry to the other one (the endpoint choice of docs/dispatch.md).
    pool.write_text(
        "models:\n"
        "  flaky:\n"
        "    served_model: smol\n"
        "    endpoints:\n"
        f"      - {{url: '{failing.base}', capacity: 1.0e12}}\n"
        f"      - {{url: '{good.base}', capacity: 1.0e-6}}\n"
    )
    env = {
        "CHAINRT_POOL": str(pool),
        "CHAINRT_JAEGER_URL": JAEGER,
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    try:
        with ServeProcess(store=redis_server.url, chains=CHAINS, drain="1s", env=env) as runner:
            yield runner
    finally:
        failing.post("/admin/faults", json={"reset": True})


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as launched:
        yield launched


@pytest.fixture
def page(browser: Any, server: ServeProcess) -> Iterator[Page]:
    with checked_page(browser, server.url) as opened:
        yield opened


def test_retry_of_the_same_model_is_marked(
    page: Page, server: ServeProcess, fault_workers: tuple[WorkerProcess, WorkerProcess]
) -> None:
    failing, good = fault_workers
    submit(server, "flaky", "retried-1", {"q": "Say OK"})
    wait_status(server, "retried-1", {"completed"})
    log = server.get("/v1/runs/retried-1/record").json()["records"]["ask"]["attempt_log"]
    # The run really retried: first the failing endpoint, then the other one of the same model.
    assert [a["model"] for a in log] == ["flaky", "flaky"], log
    assert (log[0]["endpoint"], log[0]["status"]) == (failing.base, "5xx")
    assert (log[1]["endpoint"], log[1]["status"]) == (good.base, "ok")
    p = page.goto("/ui/runs/retried-1")
    p.wait_for_selector("body[data-stream='ended']")
    attempts = p.locator("li.step[data-step='ask'] .attempt")
    assert attempts.count() == 2
    assert attempts.nth(0).get_attribute("data-marks") == ""
    assert "HTTP 500 injected_error" in attempts.nth(0).inner_text()
    assert attempts.nth(1).get_attribute("data-marks") == "retry"
    assert attempts.nth(1).locator(".mark.retry").inner_text() == "retry"
    assert "fallback" not in attempts.nth(1).inner_text()  # the same model, not a fallback
    assert f"flaky @ {good.base}" in attempts.nth(1).inner_text()


def test_run_page_links_the_runs_trace(
    page: Page, server: ServeProcess, receiver: Receiver
) -> None:
    submit(server, "steps", "traced-1", {"a": 0.0, "b": 0.0, "c": 0.0})
    wait_status(server, "traced-1", {"completed"})
    trace = server.get("/v1/runs/traced-1/record").json()["trace"]
    trace_id = trace["trace_id"]
    assert isinstance(trace_id, str)
    assert len(trace_id) == 32
    assert trace_id in receiver.trace_ids  # the link is to spans the collector really got
    p = page.goto("/ui/runs/traced-1")
    p.wait_for_selector("body[data-stream='ended']")
    link = p.locator("#trace a")
    assert link.count() == 1
    href = link.get_attribute("href")
    assert href == f"{JAEGER}/trace/{trace_id}"
    assert trace_id in href
