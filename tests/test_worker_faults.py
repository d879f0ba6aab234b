"""Fault injection on a real worker: OOM recovery in process, latency, errors, hangs."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam
from worker_fixtures import WorkerProcess

HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def worker() -> Iterator[WorkerProcess]:
    with WorkerProcess("--engine", "local", "--enable-fault-injection") as proc:
        yield proc


@pytest.fixture(autouse=True)
def no_faults(worker: WorkerProcess) -> Iterator[None]:
    yield
    assert worker.post("/admin/faults", json={"reset": True}).status_code == 200


def ask(worker: WorkerProcess, headers: dict[str, str] | None = None) -> ChatCompletion:
    return worker.openai().chat.completions.create(
        model="local", messages=HI, max_tokens=2, extra_headers=headers
    )


def ask_streamed(worker: WorkerProcess) -> list[str]:
    stream = worker.openai().chat.completions.create(
        model="local", messages=HI, max_tokens=2, stream=True
    )
    return [c.choices[0].delta.content or "" for c in stream if c.choices]


def test_injected_oom_fails_one_request_and_the_worker_recovers(worker: WorkerProcess) -> None:
    ooms = worker.metric("chainrt_worker_oom_events_total")
    recoveries = worker.metric("chainrt_worker_recoveries_total", cause="oom")
    assert worker.post("/admin/faults", json={"oom": 1}).json()["oom"] == 1
    with pytest.raises(openai.InternalServerError, match="out of KV-cache memory") as info:
        ask(worker)
    assert info.value.status_code == 503
    assert int(info.value.response.headers["Retry-After"]) >= 1
    assert info.value.response.json()["error"]["type"] == "engine_oom"
    answer = ask(worker)  # waits for the in-process recovery if it is still running
    assert answer.usage is not None
    assert answer.usage.completion_tokens == 2
    assert worker.get("/health/ready").status_code == 200
    assert worker.metric("chainrt_worker_oom_events_total") == ooms + 1
    assert worker.metric("chainrt_worker_recoveries_total", cause="oom") == recoveries + 1
    assert worker.metric("chainrt_worker_recovery_seconds_count") >= 1
    assert worker.get("/admin/faults").json()["oom"] == 0


def test_readiness_goes_down_then_up_without_a_restart(worker: WorkerProcess) -> None:
    """Three OOMs: the request's, then the first readiness generation's after recovery, then a
    second one's; the third attempt passes. Readiness is observed failing, then passing."""
    pid = worker.process.pid if worker.process else None
    seen: list[int] = []
    stop = threading.Event()

    def poll() -> None:
        with httpx.Client(base_url=worker.base, timeout=5) as client:
            while not stop.is_set():
                seen.append(client.get("/health/ready").status_code)
                time.sleep(0.01)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        worker.post("/admin/faults", json={"oom": 3})
        with pytest.raises(openai.InternalServerError):
            ask(worker)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (503 in seen and seen[-1] == 200):
            time.sleep(0.05)
    finally:
        stop.set()
        poller.join()
    assert 503 in seen
    assert seen[-1] == 200
    assert 200 in seen[seen.index(503) :]
    body = worker.get("/health/ready").json()
    assert body["status"] == "ready"
    assert body["probe"]["ok"] is True
    assert worker.process is not None
    assert worker.process.pid == pid  # the same process: recovered, not restarted
    assert ask(worker).usage is not None


def test_oom_on_a_streamed_request_is_a_503_before_any_byte(worker: WorkerProcess) -> None:
    worker.post("/admin/faults", json={"oom": 1})
    with pytest.raises(openai.InternalServerError) as info:
        ask_streamed(worker)
    assert info.value.status_code == 503
    assert ask_streamed(worker)


def test_latency(worker: WorkerProcess) -> None:
    worker.post("/admin/faults", json={"latency_ms": 400})
    started = time.monotonic()
    ask(worker)
    assert time.monotonic() - started >= 0.4
    worker.post("/admin/faults", json={"reset": True})
    assert worker.get("/admin/faults").json()["latency_ms"] == 0


def test_error_rate(worker: WorkerProcess) -> None:
    worker.post("/admin/faults", json={"error_rate": 1.0})
    with pytest.raises(openai.InternalServerError, match="injected error") as info:
        ask(worker)
    assert info.value.status_code == 500
    worker.post("/admin/faults", json={"error_rate": 0.0})
    assert ask(worker).usage is not None


def test_hang_until_deadline(worker: WorkerProcess) -> None:
    worker.post("/admin/faults", json={"hang": True})
    started = time.monotonic()
    deadline_ms = str(int((time.time() + 0.5) * 1000))
    with pytest.raises(openai.APIStatusError) as info:
        ask(worker, {"X-Chainrt-Deadline": deadline_ms})
    assert info.value.status_code == 504
    assert 0.4 <= time.monotonic() - started < 3.0


def test_hang_until_reset(worker: WorkerProcess) -> None:
    worker.post("/admin/faults", json={"hang": True})
    outcome: list[int] = []

    def call() -> None:
        usage = ask(worker).usage
        outcome.append(usage.completion_tokens if usage else -1)

    thread = threading.Thread(target=call)
    thread.start()
    time.sleep(0.5)
    assert outcome == []  # accepted, not answered
    worker.post("/admin/faults", json={"reset": True})
    thread.join(30)
    assert outcome == [2]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"oom": "one"}, "oom"),
        ({"oom": -1}, "oom"),
        ({"error_rate": 2}, "error_rate"),
        ({"explode": True}, "explode"),
    ],
)
def test_bad_fault_requests(worker: WorkerProcess, body: dict[str, object], words: str) -> None:
    response = worker.post("/admin/faults", json=body)
    assert response.status_code == 400
    assert words in response.json()["error"]["message"]
    assert worker.get("/admin/faults").json() == {
        "oom": 0, "latency_ms": 0.0, "error_rate": 0.0, "hang": False
    }  # fmt: skip


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_faults_need_a_json_content_type(worker: WorkerProcess, content_type: str | None) -> None:
    """A web page may POST text/plain to localhost without a preflight: it must not change faults."""
    headers = {"content-type": content_type} if content_type else {}
    response = worker.post("/admin/faults", content=b'{"oom": 3}', headers=headers)
    assert response.status_code == 415, response.text
    assert response.json()["error"]["code"] == "unsupported_media_type"
    assert worker.get("/admin/faults").json()["oom"] == 0
