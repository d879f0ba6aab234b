"""A scripted model for agent tests and benchmarks: a real HTTP server speaking OpenAI chat
completions that plays back a fixed conversation (a fake at the model boundary only).

    with scripted_model([calls(("lookup_order", {"order_id": "A1"})), answer("shipped")]) as m:
        pool = f"models:\n  primary: {{endpoints: [{{url: '{m.url}'}}]}}\n"

The reply to a request depends on the conversation it carries, never on a request count: turn
``n`` (the number of tool-result messages in the request) gets ``script[n]``; a request whose
last message asks for the final answer gets ``final``. So a resumed run, replaying recorded turns,
asks the stub exactly what the first execution would have asked next.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from chainrt.agent._turns import FINAL_REQUEST

__all__ = ["RESULTS", "AgentStub", "answer", "calls", "scripted_model", "serve"]

RESULTS = "Results of your tool calls:"
"""How the message that carries a turn's call results begins (chainrt/agent/_turns.py)."""


def calls(*pairs: tuple[str, dict[str, Any]]) -> str:
    """A turn that proposes ``(name, arguments)`` calls together."""
    return json.dumps({"calls": [{"name": n, "arguments": a} for n, a in pairs]})


def answer(text: str) -> str:
    """A turn that answers."""
    return json.dumps({"content": text})


class AgentStub(ThreadingHTTPServer):
    """Plays ``script`` (one reply per turn) and ``final`` (the last turn's reply)."""

    def __init__(
        self,
        script: list[str],
        final: str = "final answer",
        delay_s: float = 0.0,
        *,
        pace_s: float = 0.0,
        final_finish: str = "stop",
    ) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script = script
        self.final = final
        self.delay_s = delay_s
        """Seconds each reply waits before it is sent (the model's generation time)."""
        self.pace_s = pace_s
        """Seconds between the pieces (8 characters each) of the last turn's reply: a model
        generating its answer slowly, or stalling (a large value) once its first piece is out.
        Not streamed, the reply is sent whole once all its pieces would have been."""
        self.final_finish = final_finish
        """The ``finish_reason`` of the last turn's reply: ``deadline`` plays a worker that
        stopped at the request's deadline, its reply being the text it had by then."""
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        """The server's base URL."""
        return f"http://127.0.0.1:{self.server_address[1]}"

    def reply(self, messages: list[dict[str, Any]]) -> str:
        """The scripted reply to a conversation."""
        if messages and messages[-1].get("content") == FINAL_REQUEST:
            return self.final if self.final.startswith("{") else answer(self.final)
        turn = sum(1 for m in messages if str(m.get("content", "")).startswith(RESULTS))
        return self.script[min(turn, len(self.script) - 1)]


class _Handler(BaseHTTPRequestHandler):
    server: AgentStub

    def do_POST(self) -> None:
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
        except ValueError:  # a client killed while it sent its request
            self.send_error(400, "the request is not JSON")
            return
        with self.server.lock:
            self.server.requests.append(body)
        if self.server.delay_s > 0:
            time.sleep(self.server.delay_s)
        messages = body.get("messages", [])
        text = self.server.reply(messages)
        final = bool(messages) and messages[-1].get("content") == FINAL_REQUEST
        finish = self.server.final_finish if final else "stop"
        pace = self.server.pace_s if final else 0.0
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        if body.get("stream"):
            self._stream(text, usage, finish, pace)
            return
        if pace > 0:
            time.sleep(pace * (len(_pieces(text)) - 1))
        data = json.dumps(
            {
                "id": "chatcmpl-agent",
                "object": "chat.completion",
                "model": "m",
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": text},
                     "finish_reason": finish}
                ],
                "usage": usage,
            }
        ).encode()  # fmt: skip
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, text: str, usage: dict[str, int], finish: str, pace: float) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        for index, piece in enumerate(_pieces(text)):
            if index and pace > 0:
                time.sleep(pace)
            chunk = {"choices": [{"index": 0, "delta": {"content": piece}}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        end = {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}], "usage": usage}
        self.wfile.write(f"data: {json.dumps(end)}\n\ndata: [DONE]\n\n".encode())
        self.wfile.flush()
        self.close_connection = True

    def do_GET(self) -> None:  # /health/ready
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return None

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (a cut turn)
            self.close_connection = True


def _pieces(text: str) -> list[str]:
    """A reply as it is streamed: 8 characters a piece."""
    return [text[i : i + 8] for i in range(0, len(text), 8)] or [""]


@contextmanager
def scripted_model(
    script: list[str],
    final: str = "final answer",
    delay_s: float = 0.0,
    *,
    pace_s: float = 0.0,
    final_finish: str = "stop",
) -> Iterator[AgentStub]:
    """An :class:`AgentStub` serving in a thread while the ``with`` block runs."""
    yield from serve(script, final, delay_s, pace_s=pace_s, final_finish=final_finish)


def serve(
    script: list[str],
    final: str = "final answer",
    delay_s: float = 0.0,
    *,
    pace_s: float = 0.0,
    final_finish: str = "stop",
) -> Iterator[AgentStub]:
    """Run an :class:`AgentStub` in a thread for the duration of a fixture."""
    server = AgentStub(script, final, delay_s, pace_s=pace_s, final_finish=final_finish)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
