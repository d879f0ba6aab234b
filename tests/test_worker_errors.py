"""Bad requests get a clear 4xx in OpenAI's error shape; the worker never crashes or leaks a slot."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from worker_fixtures import WorkerProcess

from chainrt.dispatch._http_wire import error_from_response
from chainrt.errors import InsufficientMemory

HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
JSON = {"content-type": "application/json"}
STORY: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Write a very long story about a dragon and a knight."}
]


@pytest.fixture(scope="module")
def worker() -> Iterator[WorkerProcess]:
    # Two slots: a second large request can find the first one's KV reservation in its way (429).
    with WorkerProcess("--engine", "local", "--slots", "2") as proc:
        yield proc


def chat(**fields: Any) -> bytes:
    return json.dumps({"model": "local", "messages": HI, "max_tokens": 2, **fields}).encode()


BAD_REQUESTS = [
    # (case, path, body, headers, status, error type, words in the message)
    ("malformed json", "/v1/chat/completions", b'{"model": "local", "messages": [', {},
     400, "invalid_request_error", "not valid JSON"),
    ("empty body", "/v1/chat/completions", b"", {}, 400, "invalid_request_error", "not valid JSON"),
    ("json array", "/v1/chat/completions", b"[1, 2]", {}, 400, "invalid_request_error", "object"),
    ("max_tokens as string", "/v1/chat/completions", chat(max_tokens="5"), {},
     400, "invalid_request_error", "max_tokens: Input should be a valid integer"),
    ("negative max_tokens", "/v1/chat/completions", chat(max_tokens=-1), {},
     400, "invalid_request_error", "max_tokens: Input should be greater than or equal to 1"),
    ("zero max_tokens", "/v1/completions",
     json.dumps({"model": "local", "prompt": "x", "max_tokens": 0}).encode(), {},
     400, "invalid_request_error", "max_tokens"),
    ("absurd max_tokens", "/v1/chat/completions", chat(max_tokens=10**12), {},
     400, "invalid_request_error", "over this worker's limit"),
    ("max_tokens beyond the context", "/v1/chat/completions", chat(max_tokens=5000), {},
     413, "context_length_exceeded", "can never fit"),
    ("temperature as string", "/v1/chat/completions", chat(temperature="hot"), {},
     400, "invalid_request_error", "temperature"),
    ("temperature too high", "/v1/chat/completions", chat(temperature=7), {},
     400, "invalid_request_error", "temperature"),
    ("messages not a list", "/v1/chat/completions", chat(messages="hi"), {},
     400, "invalid_request_error", "messages"),
    ("no messages", "/v1/chat/completions", chat(messages=[]), {},
     400, "invalid_request_error", "messages"),
    ("unknown role", "/v1/chat/completions", chat(messages=[{"role": "wizard", "content": "x"}]),
     {}, 400, "invalid_request_error", "role"),
    ("content a number", "/v1/chat/completions", chat(messages=[{"role": "user", "content": 5}]),
     {}, 400, "invalid_request_error", "content"),
    ("missing model", "/v1/chat/completions", json.dumps({"messages": HI}).encode(), {},
     400, "invalid_request_error", "model: Field required"),
    ("unknown model", "/v1/chat/completions", chat(model="gpt-9"), {},
     404, "invalid_request_error", "not served here"),
    ("several choices", "/v1/chat/completions", chat(n=3), {},
     400, "invalid_request_error", "n is not supported"),
    ("tools", "/v1/chat/completions", chat(tools=[{"type": "function"}]), {},
     400, "invalid_request_error", "function must be an object with a name"),
    ("five stop strings", "/v1/chat/completions", chat(stop=list("abcde")), {},
     400, "invalid_request_error", "at most 4"),
    ("batch of prompts", "/v1/completions",
     json.dumps({"model": "local", "prompt": ["a", "b"]}).encode(), {},
     400, "invalid_request_error", "one string"),
    ("prompt too long for the context", "/v1/chat/completions",
     chat(messages=[{"role": "user", "content": "word " * 3000}]), {},
     413, "context_length_exceeded", "context holds 2048"),
    ("deadline not a number", "/v1/chat/completions", chat(), {"X-Chainrt-Deadline": "soon"},
     400, "invalid_request_error", "unix time in milliseconds"),
    ("deadline in seconds", "/v1/chat/completions", chat(), {"X-Chainrt-Deadline": "1700000000"},
     400, "invalid_request_error", "looks like seconds"),
    ("deadline passed", "/v1/chat/completions", chat(),
     {"X-Chainrt-Deadline": "1700000000000"}, 504, "deadline", "deadline passed"),
    ("unknown priority", "/v1/chat/completions", chat(), {"X-Priority": "urgent"},
     400, "invalid_request_error", "X-Priority must be one of"),
    ("unknown path", "/v1/embeddings", chat(), {}, 404, "not_found", "/v1/embeddings"),
    ("fault injection off", "/admin/faults", b'{"oom": 1}', {}, 404, "not_found", "Not Found"),
    # Finding 12: a web page can POST these types cross-origin without a CORS preflight.
    ("text/plain body", "/v1/chat/completions", chat(), {"content-type": "text/plain"},
     415, "invalid_request_error", "Content-Type must be application/json, got 'text/plain'"),
    ("form body", "/v1/completions", json.dumps({"model": "local", "prompt": "x"}).encode(),
     {"content-type": "application/x-www-form-urlencoded"},
     415, "invalid_request_error", "must be application/json"),
    ("multipart body", "/v1/chat/completions", chat(),
     {"content-type": "multipart/form-data; boundary=x"},
     415, "invalid_request_error", "must be application/json"),
    ("logit_bias", "/v1/chat/completions", chat(logit_bias={"50256": -100}), {},
     400, "invalid_request_error", "logit_bias is not supported"),
    ("negative seed", "/v1/chat/completions", chat(seed=-1), {},
     400, "invalid_request_error", "seed"),
    ("seed over 32 bits", "/v1/chat/completions", chat(seed=2**32), {},
     400, "invalid_request_error", "seed: Input should be less than or equal to 4294967295"),
    ("huge seed", "/v1/chat/completions", chat(seed=10**30), {},
     400, "invalid_request_error", "seed"),
    ("seed as string", "/v1/chat/completions", chat(seed="7"), {},
     400, "invalid_request_error", "seed"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "path", "body", "headers", "status", "kind", "words"),
    BAD_REQUESTS,
    ids=[row[0] for row in BAD_REQUESTS],
)
def test_bad_request_table(
    worker: WorkerProcess,
    case: str,
    path: str,
    body: bytes,
    headers: dict[str, str],
    status: int,
    kind: str,
    words: str,
) -> None:
    response = worker.post(
        path, content=body, headers={"content-type": "application/json", **headers}
    )
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["type"] == kind
    assert words in error["message"]


def test_wrong_method_is_405_json(worker: WorkerProcess) -> None:
    response = worker.get("/v1/chat/completions")
    assert response.status_code == 405
    assert "Method Not Allowed" in response.json()["error"]["message"]


def test_never_fits_advice_names_a_max_tokens_that_fits(worker: WorkerProcess) -> None:
    error = worker.post("/v1/chat/completions", content=chat(max_tokens=5000), headers=JSON).json()[
        "error"
    ]
    advice = error["advice"]["max_tokens"]
    soon = str(int((time.time() + 0.3) * 1000))  # admitted is enough: no need to generate it all
    ok = worker.post(
        "/v1/chat/completions",
        content=chat(max_tokens=advice),
        headers={**JSON, "X-Chainrt-Deadline": soon},
    )
    assert ok.status_code == 200, ok.text
    assert ok.json()["choices"][0]["finish_reason"] in ("deadline", "stop")


def test_body_over_the_limit_is_refused_unread(worker: WorkerProcess) -> None:
    """A 10 MB body: 413 from the Content-Length alone, before the body is sent."""
    with socket.create_connection(("127.0.0.1", worker.port or 0)) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: worker\r\n"
            b"Content-Type: application/json\r\nContent-Length: 10000000\r\n\r\n"
        )
        sock.settimeout(10)
        reply = b""
        while b"}}" not in reply:  # the end of the JSON error body
            data = sock.recv(65536)
            if not data:
                break
            reply += data
    assert reply.startswith(b"HTTP/1.1 413")
    assert b"over this worker's limit of 1048576 bytes" in reply


def test_chunked_body_over_the_limit(worker: WorkerProcess) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(20):
            yield b" " * 100_000  # 2 MB of whitespace, no Content-Length

    response = worker.post("/v1/chat/completions", content=chunks(), headers=JSON)
    assert response.status_code == 413
    assert response.json()["error"]["type"] == "request_too_large"


def test_a_body_without_a_content_type_is_415(worker: WorkerProcess) -> None:
    response = worker.post("/v1/chat/completions", content=chat())
    assert response.status_code == 415
    error = response.json()["error"]
    assert error["code"] == "unsupported_media_type"
    assert error["message"] == "Content-Type must be application/json, got none"
    charset = worker.post(
        "/v1/chat/completions",
        content=chat(),
        headers={"content-type": "Application/JSON; charset=utf-8"},
    )
    assert charset.status_code == 200, charset.text  # parameters and case do not matter


def test_seeds_at_the_bounds_are_honoured(worker: WorkerProcess) -> None:
    client = worker.openai()
    for seed in (0, 2**32 - 1):
        answer = client.chat.completions.create(
            model="local", messages=HI, max_tokens=2, seed=seed, temperature=1.0
        )
        assert answer.usage is not None


def test_openai_client_gets_typed_errors(worker: WorkerProcess) -> None:
    client = worker.openai()
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.chat.completions.create(model="local", messages=HI, max_tokens=-5)
    with pytest.raises(openai.BadRequestError, match="logit_bias is not supported"):
        client.chat.completions.create(model="local", messages=HI, logit_bias={"1": 5})
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client.chat.completions.create(model="nope", messages=HI)
    with pytest.raises(openai.APIStatusError, match="can never fit") as info:
        client.chat.completions.create(model="local", messages=HI, max_tokens=100_000)
    assert info.value.status_code == 413


async def test_insufficient_memory_is_429_with_advice(worker: WorkerProcess) -> None:
    """The first request reserves 1,000+ tokens of KV cache; the second cannot fit beside it."""
    rejected_before = worker.metric(
        "chainrt_worker_admission_rejects_total", reason="insufficient_memory"
    )
    client = worker.async_openai()
    try:
        first = client.chat.completions.create(
            model="local", messages=STORY, max_tokens=1200, temperature=0,
            extra_headers={"X-Chainrt-Deadline": str(int((time.time() + 2) * 1000))},
        )  # fmt: skip
        task = asyncio.ensure_future(first)
        for _ in range(200):
            if await asyncio.to_thread(worker.metric, "chainrt_worker_slots_in_use") == 1:
                break
            await asyncio.sleep(0.01)
        with pytest.raises(openai.RateLimitError) as info:
            await client.chat.completions.create(
                model="local",
                messages=STORY,
                max_tokens=1000,
            )
        response = info.value.response
        body = response.json()
        assert set(body) == {"error"}
        assert set(body["error"]) == {"type", "message", "advice"}
        assert body["error"]["type"] == "insufficient_memory"
        advice = body["error"]["advice"]
        assert 1 <= advice["max_tokens"] < 1000
        assert advice["retry_after_s"] > 0
        assert int(response.headers["Retry-After"]) >= 1
        # The dispatcher reads this refusal as InsufficientMemory, carrying the same advice.
        err = error_from_response(429, response.headers, response.content, worker.base)
        assert isinstance(err, InsufficientMemory)
        assert (err.advice_max_tokens, err.retry_after_s) == (
            advice["max_tokens"],
            advice["retry_after_s"],
        )
        # The advice is right: that many tokens fit beside the first request now.
        small = await client.chat.completions.create(
            model="local",
            messages=STORY,
            max_tokens=min(advice["max_tokens"], 3),
        )
        assert small.usage is not None
        assert str((await task).choices[0].finish_reason) == "deadline"
    finally:
        await client.close()
    assert (
        worker.metric("chainrt_worker_admission_rejects_total", reason="insufficient_memory")
        == rejected_before + 1
    )


def test_client_disconnect_mid_stream_frees_the_slot(worker: WorkerProcess) -> None:
    before = worker.metric("chainrt_worker_requests_total", endpoint="chat", status="499")
    body = chat(messages=STORY, max_tokens=1600, stream=True, temperature=0)
    with (
        httpx.Client(base_url=worker.base, timeout=30) as client,
        client.stream("POST", "/v1/chat/completions", content=body, headers=JSON) as response,
    ):
        assert response.status_code == 200
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
        assert next(line for line in lines if line).startswith("data: ")
    # leaving the block closed the connection mid-stream
    _assert_idle_soon(worker)
    assert (
        worker.metric("chainrt_worker_requests_total", endpoint="chat", status="499") == before + 1
    )


def test_client_disconnect_while_waiting_aborts_generation(worker: WorkerProcess) -> None:
    body = chat(messages=STORY, max_tokens=1600, temperature=0)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{worker.base}/v1/chat/completions", content=body, headers=JSON, timeout=0.5)
    _assert_idle_soon(worker)


def test_worker_survives_every_bad_request(worker: WorkerProcess) -> None:
    """The whole table of bad requests, one after another, and a client that gives up: the
    worker stays ready, leaks no slot and no queue entry, and still answers (whatever other
    tests ran before, in any order)."""
    for _case, path, body, headers, status, _kind, _words in BAD_REQUESTS:
        response = worker.post(
            path, content=body, headers={"content-type": "application/json", **headers}
        )
        assert response.status_code == status
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{worker.base}/v1/chat/completions",
            content=chat(messages=STORY, max_tokens=1600),
            headers=JSON,
            timeout=0.5,
        )
    for _ in range(100):  # the abandoned request lets go of its slot within moments
        if worker.metric("chainrt_worker_slots_in_use") == 0:
            break
        time.sleep(0.05)
    assert worker.alive
    assert worker.get("/health/ready").status_code == 200
    assert worker.metric("chainrt_worker_slots_in_use") == 0
    assert worker.metric("chainrt_worker_queue_depth") == 0
    answer = worker.openai().chat.completions.create(model="local", messages=HI, max_tokens=2)
    assert answer.usage is not None


def _assert_idle_soon(worker: WorkerProcess) -> None:
    """The slot is back and the engine is free: a 2-token request is answered at once.

    Had the abandoned 1,600-token generation kept running, this would wait ~20 s or more for it;
    8 s leaves a loaded 2-core machine room for a 2-token answer.
    """
    for _ in range(100):
        if worker.metric("chainrt_worker_slots_in_use") == 0:
            break
        time.sleep(0.02)
    assert worker.metric("chainrt_worker_slots_in_use") == 0
    started = time.monotonic()
    answer = worker.openai().chat.completions.create(model="local", messages=HI, max_tokens=2)
    assert answer.usage is not None
    assert time.monotonic() - started < 8.0
