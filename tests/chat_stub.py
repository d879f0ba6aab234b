"""A small real HTTP server speaking OpenAI chat completions with chainrt's ``confidence_score``:
one fixed answer, one fixed score, a request count, optionally a fixed delay before each answer.
Stands in for "another model" in tests."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ChatStub(ThreadingHTTPServer):
    """A chat-completions server answering ``answer`` with ``confidence``; counts requests."""

    def __init__(self, answer: str, confidence: float, delay_s: float = 0.0) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answer = answer
        self.confidence = confidence
        self.delay_s = delay_s
        """Seconds each answer waits before it is sent (a model's generation time)."""
        self.requests = 0
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        """The server's base URL."""
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: ChatStub

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        with self.server.lock:
            self.server.requests += 1
        if self.server.delay_s > 0:
            time.sleep(self.server.delay_s)
        body = json.dumps(
            {
                "id": "chatcmpl-x",
                "object": "chat.completion",
                "model": "m",
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": self.server.answer},
                     "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
                "confidence_score": self.server.confidence,
            }
        ).encode()  # fmt: skip
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # /health/ready
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return None


def serve(answer: str, confidence: float, delay_s: float = 0.0) -> Iterator[ChatStub]:
    """Run a :class:`ChatStub` in a thread for the duration of a fixture."""
    server = ChatStub(answer, confidence, delay_s)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
