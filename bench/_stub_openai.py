"""A minimal OpenAI-compatible server that answers with a canned completion.

    .venv/bin/python bench/_stub_openai.py --port 8123 [--delay-ms 20]
        [--slow-ms 400 --slow-fraction 0.04] [--seed 1]

Used by ``bench/dispatch.py`` to measure the router's own cost: with an endpoint that does no
work, any difference between a direct httpx call and a dispatched call is dispatch overhead.
``bench/hedge.py`` gives it latency: every answer waits ``--delay-ms``, and a random
``--slow-fraction`` of them ``--slow-ms`` instead (a hiccup). A client that leaves during the
wait is noticed at once (as a chainrt worker does) and counted; ``GET /stats`` returns
``{"started", "answered", "disconnected"}``. ``"stream": true`` gets the answer as server-sent
events: a role chunk, ``OK`` in two content chunks, the finish and usage chunks, ``[DONE]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

_ANSWER = json.dumps(
    {
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "created": 0,
        "model": "stub",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "OK"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }
).encode()


def _chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
    body = {
        "id": "chatcmpl-stub",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "stub",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        **extra,
    }
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


_STREAM = [
    _chunk({"role": "assistant", "content": ""}),
    _chunk({"content": "O"}),
    _chunk({"content": "K"}),
    _chunk({}, "stop"),
    b"data: "
    + json.dumps(
        {
            "id": "chatcmpl-stub",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "stub",
            "choices": [],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
        },
        separators=(",", ":"),
    ).encode()
    + b"\n\n",
    b"data: [DONE]\n\n",
]


class _Stub:
    def __init__(self, delay_ms: float, slow_ms: float, slow_fraction: float, seed: int) -> None:
        self.delay_s = delay_ms / 1000
        self.slow_s = slow_ms / 1000
        self.slow_fraction = slow_fraction
        self.rng = random.Random(seed)
        self.stats = {"started": 0, "answered": 0, "disconnected": 0}

    async def chat(self, request: Request) -> Response:
        """Read the body (as a real server must), wait as configured, answer."""
        self.stats["started"] += 1
        try:
            body = await request.body()
        except ClientDisconnect:
            self.stats["disconnected"] += 1
            return Response(status_code=499)
        wait = self.slow_s if self.rng.random() < self.slow_fraction else self.delay_s
        if wait > 0 and not await _wait_unless_gone(request, wait):
            self.stats["disconnected"] += 1
            return Response(status_code=499)
        self.stats["answered"] += 1
        if b'"stream":true' in body:
            return StreamingResponse(_stream(), media_type="text/event-stream")
        return Response(_ANSWER, media_type="application/json")

    async def read_stats(self, request: Request) -> Response:
        return JSONResponse(self.stats)


async def _stream() -> AsyncIterator[bytes]:
    for piece in _STREAM:
        yield piece


async def _wait_unless_gone(request: Request, seconds: float) -> bool:
    """Sleep ``seconds``; False as soon as the client disconnects."""

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(gone())
    try:
        done, _ = await asyncio.wait({watcher}, timeout=seconds)
        return not done
    finally:
        watcher.cancel()


async def ready(request: Request) -> Response:
    """Always ready."""
    return Response(b'{"status":"ready"}', media_type="application/json")


def main() -> None:
    """Serve on 127.0.0.1:--port."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--slow-ms", type=float, default=0.0)
    parser.add_argument("--slow-fraction", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    stub = _Stub(args.delay_ms, args.slow_ms, args.slow_fraction, args.seed)
    app = Starlette(
        routes=[
            Route("/v1/chat/completions", stub.chat, methods=["POST"]),
            Route("/health/ready", ready, methods=["GET"]),
            Route("/stats", stub.read_stats, methods=["GET"]),
        ]
    )
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
