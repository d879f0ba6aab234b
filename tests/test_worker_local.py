"""A real worker serving the local llama.cpp engine, driven with the official OpenAI client."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import uvicorn
from openai.types.chat import ChatCompletionMessageParam
from worker_fixtures import REPO, WorkerProcess, free_port

from chainrt.engines import LocalEngine
from workers.server import RequestContext, WorkerConfig, create_app

COLORS: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Name three colors."}]
STORY: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Write a very long story about a dragon and a knight."}
]


@pytest.fixture(scope="module")
def worker() -> Iterator[WorkerProcess]:
    with WorkerProcess("--engine", "local") as proc:
        yield proc


def test_models_lists_the_served_name(worker: WorkerProcess) -> None:
    models = worker.openai().models.list()
    assert [m.id for m in models.data] == ["local"]


def test_chat_completion(worker: WorkerProcess) -> None:
    answer = worker.openai().chat.completions.create(
        model="local",
        messages=COLORS,
        max_tokens=32,
        temperature=0,
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.role == "assistant"
    text = (choice.message.content or "").lower()
    assert sum(c in text for c in ("red", "blue", "green", "yellow")) >= 2
    assert answer.usage is not None
    assert answer.usage.prompt_tokens > 10
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens
    assert answer.id.startswith("chatcmpl-")


def test_completion(worker: WorkerProcess) -> None:
    answer = worker.openai().completions.create(
        model="local", prompt="The days of the week are Monday, Tuesday,", max_tokens=6,
        temperature=0,
    )  # fmt: skip
    assert answer.choices[0].finish_reason == "length"
    assert "wednesday" in answer.choices[0].text.lower()
    assert answer.usage is not None
    assert answer.usage.completion_tokens == 6


def test_chat_stream_matches_the_whole_answer(worker: WorkerProcess) -> None:
    client = worker.openai()
    whole = client.chat.completions.create(
        model="local",
        messages=COLORS,
        max_tokens=24,
        temperature=0,
    )
    stream = client.chat.completions.create(
        model="local", messages=COLORS, max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    pieces, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert len([p for p in pieces if p]) > 3
    assert "".join(pieces) == whole.choices[0].message.content
    assert finish == whole.choices[0].finish_reason
    assert usage is not None
    assert whole.usage is not None
    assert usage.completion_tokens == whole.usage.completion_tokens


def test_completion_stream(worker: WorkerProcess) -> None:
    stream = worker.openai().completions.create(
        model="local", prompt="One, two, three,", max_tokens=8, temperature=0, stream=True
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "length"
    assert "four" in text.lower()


def test_deadline_header_cuts_the_answer(worker: WorkerProcess) -> None:
    # The deadline must leave room for a few tokens on this machine as it is now (a loaded one
    # can take over 0.5 s for the first): three times what a 4-token answer takes, measured
    # here. 1,500 tokens would take 15 s or more, so an answer cut near it was cut by it.
    few = time.time()
    worker.openai().chat.completions.create(
        model="local", messages=STORY, max_tokens=4, temperature=0
    )
    window = max(0.5, 3 * (time.time() - few))
    started = time.time()
    answer = worker.openai().chat.completions.create(
        model="local", messages=STORY, max_tokens=1500, temperature=0,
        extra_headers={"X-Chainrt-Deadline": str(int((started + window) * 1000))},
    )  # fmt: skip
    assert str(answer.choices[0].finish_reason) == "deadline"  # chainrt's own reason
    assert time.time() - started < 2 * window + 1.0
    assert answer.usage is not None
    assert 0 < answer.usage.completion_tokens < 1500


def test_json_response_format(worker: WorkerProcess) -> None:
    answer = worker.openai().chat.completions.create(
        model="local", max_tokens=200, temperature=0,
        messages=[{"role": "user", "content": "Reply with a JSON object with the keys name and age of a cat."}],
        response_format={"type": "json_object"},
    )  # fmt: skip
    assert isinstance(json.loads(answer.choices[0].message.content or ""), dict)


def test_traceparent_and_priority_headers_are_accepted(worker: WorkerProcess) -> None:
    for headers in (
        {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "X-Priority": "high"},
        {"traceparent": "garbage", "X-Priority": "LOW"},  # invalid traceparent: ignored (W3C)
    ):  # fmt: skip
        answer = worker.openai().chat.completions.create(
            model="local",
            messages=COLORS,
            max_tokens=2,
            extra_headers=headers,
        )
        assert answer.usage is not None
        assert answer.usage.completion_tokens == 2


def test_health_endpoints(worker: WorkerProcess) -> None:
    assert worker.get("/health/live").json() == {"status": "alive"}
    ready = worker.get("/health/ready")
    assert ready.status_code == 200
    body = ready.json()
    assert body["status"] == "ready"
    assert body["probe"]["ok"] is True
    assert body["probe"]["text"]  # a real generation produced text
    assert body["probe"]["matches_baseline"] is True


def test_metrics_count_requests_and_tokens(worker: WorkerProcess) -> None:
    before = worker.metric("chainrt_worker_completion_tokens_total")
    worker.openai().chat.completions.create(model="local", messages=COLORS, max_tokens=3)
    assert worker.metric("chainrt_worker_completion_tokens_total") == before + 3
    assert worker.metric("chainrt_worker_requests_total", endpoint="chat", status="200") >= 1
    assert worker.metric("chainrt_worker_memory_watermark") == 0.85
    assert worker.metric("chainrt_worker_ready") == 1
    assert worker.metric("chainrt_worker_slots_in_use") == 0


async def test_critical_requests_overtake_low_ones() -> None:
    """One engine slot, busy; three low then three critical requests queue: critical go first."""
    with WorkerProcess("--engine", "local", "--enable-fault-injection") as worker:
        await _priority_order(worker)


async def _priority_order(worker: WorkerProcess) -> None:
    client = worker.async_openai()
    done: list[str] = []

    async def ask(name: str, priority: str, max_tokens: int) -> None:
        await client.chat.completions.create(
            model="local", messages=COLORS, max_tokens=max_tokens,
            extra_headers={"X-Priority": priority},
        )  # fmt: skip
        done.append(name)

    async def until(metric: str, value: float) -> None:
        for _ in range(500):
            if await asyncio.to_thread(worker.metric, metric) == value:
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"{metric} never reached {value}")

    # The blocker holds the one slot for 2 s (injected latency is served inside the slot), so
    # the queue fills before it finishes however fast the machine generates; the others then
    # run without latency.
    assert worker.post("/admin/faults", json={"latency_ms": 2000}).status_code == 200
    blocker = asyncio.create_task(ask("blocker", "normal", 8))
    await until("chainrt_worker_slots_in_use", 1)
    assert worker.post("/admin/faults", json={"reset": True}).status_code == 200
    lows = []
    for i in range(3):  # one at a time, so their arrival order is known
        lows.append(asyncio.create_task(ask(f"low{i}", "low", 2)))
        await until("chainrt_worker_queue_depth", i + 1)
    crits = [asyncio.create_task(ask(f"critical{i}", "critical", 2)) for i in range(3)]
    await until("chainrt_worker_queue_depth", 6)
    await asyncio.gather(blocker, *lows, *crits)
    await client.close()
    assert done[0] == "blocker"
    assert sorted(done[1:4]) == ["critical0", "critical1", "critical2"]
    assert done[4:] == ["low0", "low1", "low2"]  # first come, first served within a priority


def test_unix_socket(tmp_path: Path) -> None:
    sock = str(tmp_path / "w.sock")
    with WorkerProcess("--engine", "local", "--served-model-name", "tiny", uds=sock) as proc:
        answer = proc.openai().chat.completions.create(
            model="tiny",
            messages=COLORS,
            max_tokens=2,
        )
        assert answer.usage is not None
        assert answer.usage.completion_tokens == 2
        with pytest.raises(openai.NotFoundError, match="not served here"):
            proc.openai().chat.completions.create(model="local", messages=COLORS)


def test_missing_model_file_is_one_clear_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "workers.cli", "serve", "--engine", "local", "--port", "1",
         "--model", "/nonexistent/model.gguf"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.startswith("chainrt-worker: local model file '/nonexistent/model.gguf'")
    assert "Traceback" not in result.stderr


def test_local_engine_does_not_import_vllm_or_torch() -> None:
    code = (
        "import sys, workers.cli, workers.server, chainrt.engines\n"
        "workers.cli.make_engine('local')\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'torch'))\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


class Recorder:
    """A RequestObserver that keeps every finished context (what a tracer would see)."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.finished: list[RequestContext] = []

    def request_started(self, ctx: RequestContext) -> None:
        self.started.append(ctx.request_id)

    def request_finished(self, ctx: RequestContext) -> None:
        self.finished.append(ctx)


def test_observer_seam_sees_traceparent_and_outcome() -> None:
    """In-process app on a real uvicorn server: the tracing seam gets what a span needs."""
    recorder = Recorder()
    app = create_app(LocalEngine(), WorkerConfig(health_interval_s=60), observer=recorder)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run)
    thread.start()
    try:
        for _ in range(600):
            if server.started:
                break
            time.sleep(0.05)
        assert server.started
        parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            ok = client.post(
                "/v1/chat/completions",
                json={"model": "local", "messages": COLORS, "max_tokens": 3},
                headers={"traceparent": parent, "X-Priority": "high"},
            )
            bad = client.post("/v1/chat/completions", json={"model": "local"})
            streamed = client.post(
                "/v1/chat/completions",
                json={"model": "local", "messages": COLORS, "max_tokens": 3, "stream": True},
                headers={"traceparent": "not-a-traceparent"},
            )
    finally:
        server.should_exit = True
        thread.join(30)
    assert (ok.status_code, bad.status_code, streamed.status_code) == (200, 400, 200)
    assert streamed.text.endswith("data: [DONE]\n\n")
    assert len(recorder.finished) == len(recorder.started) == 3
    first, second, third = recorder.finished
    assert first.request_id == ok.json()["id"]
    assert (first.traceparent, first.priority, first.status) == (parent, "high", 200)
    assert first.attributes["admission"] == "admit"
    assert first.attributes["completion_tokens"] == 3
    assert first.attributes["finish_reason"] == "length"
    assert (second.status, second.attributes["error"]) == (400, "invalid_request_error")
    assert (third.traceparent, third.status, third.attributes["completion_tokens"]) == (
        None,
        200,
        3,
    )


def test_chat_without_max_tokens_gets_what_fits(worker: WorkerProcess) -> None:
    """A long prompt and no max_tokens: the default shrinks to what the context has left."""
    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "Summarise: " + "word " * 1200}
    ]
    client = worker.openai()
    # The control: the same prompt with the default max_tokens (1024) spelled out can never fit.
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(model="local", messages=messages, max_tokens=1024)
    assert refused.value.status_code == 413
    body = refused.value.response.json()["error"]
    room = body["advice"]["max_tokens"]  # what the context has left beside this prompt
    assert 1 <= room < 1024
    # Without max_tokens it is admitted, asking for at most that room.
    soon = str(int((time.time() + 0.5) * 1000))  # admitted is the point, not the whole answer
    answer = client.chat.completions.create(
        model="local", messages=messages, extra_headers={"X-Chainrt-Deadline": soon}
    )
    assert answer.usage is not None
    assert answer.usage.prompt_tokens > 1000
    assert f"({answer.usage.prompt_tokens} tokens)" in body["message"]  # the same prompt
    assert answer.usage.completion_tokens <= room


def test_a_worker_whose_port_was_taken_before_it_bound_starts_on_another() -> None:
    """The test fixture's port is picked free, but the worker binds it only once its engine is
    loaded: a process that takes it meanwhile made a whole module's tests error (seen in a full
    run beside a Redis cluster's nodes). The fixture starts it again on another port."""
    proc = WorkerProcess("--engine", "local")
    taken = proc.port
    assert taken is not None
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", taken))
    squatter.listen()
    try:
        with proc:
            assert proc.port != taken
            assert proc.http.get("/health/ready").status_code == 200
    finally:
        squatter.close()
