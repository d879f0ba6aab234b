"""A minimal OpenAI-compatible server that answers at once with a canned completion.

    .venv/bin/python bench/_stub_openai.py --port 8123

Used by ``bench/dispatch.py`` to measure the router's own cost: with an endpoint that does no
work, any difference between a direct httpx call and a dispatched call is dispatch overhead.
"""

from __future__ import annotations

import argparse
import json

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
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


async def chat(request: Request) -> Response:
    """Read the body (as a real server must) and answer the canned completion."""
    await request.body()
    return Response(_ANSWER, media_type="application/json")


async def ready(request: Request) -> Response:
    """Always ready."""
    return Response(b'{"status":"ready"}', media_type="application/json")


def main() -> None:
    """Serve on 127.0.0.1:--port."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/health/ready", ready, methods=["GET"]),
        ]
    )
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
