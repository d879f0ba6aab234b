"""A real HTTP(S) server speaking OpenAI chat completions that checks an API key, as a hosted API
does: the key in ``Authorization: Bearer KEY`` (or a header of choice, Azure's ``api-key``);
a wrong or missing key gets OpenAI's 401 body, which (like OpenAI's) quotes the key it was sent.
Answers carry ``usage`` with ``prompt_tokens_details.cached_tokens``; ``"stream": true`` gets
server-sent events and, when asked with ``stream_options.include_usage``, a last usage chunk.
Every request's path, headers and body are kept for the test to look at.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

PROMPT_TOKENS = 21
COMPLETION_TOKENS = 2
CACHED_TOKENS = 16


@dataclass
class Seen:
    """One request as the server got it."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class KeyedServer(ThreadingHTTPServer):
    """Answers ``answer`` to requests that carry ``key``; 401 to the rest."""

    def __init__(self, key: str, answer: str = "hosted says hi", key_header: str = "Authorization"):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.key = key
        """The key accepted now (assign to rotate it)."""
        self.answer = answer
        self.key_header = key_header
        self.seen: list[Seen] = []
        self.lock = threading.Lock()
        self.scheme = "http"
        self.drop_streams = False
        """True: a streamed answer stops after its words, without ``[DONE]`` (a dropped
        connection mid-answer)."""

    @property
    def url(self) -> str:
        """The server's base URL."""
        host = "localhost" if self.scheme == "https" else "127.0.0.1"
        return f"{self.scheme}://{host}:{self.server_address[1]}"

    def answered(self) -> int:
        """Requests that carried the right key."""
        with self.lock:
            return sum(1 for s in self.seen if s.headers.get("x-key-ok") == "1")


class _Handler(BaseHTTPRequestHandler):
    server: KeyedServer

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        body = json.loads(raw or b"{}")
        sent = self.headers.get(self.server.key_header) or ""
        if self.server.key_header.lower() == "authorization":
            sent = sent.removeprefix("Bearer ")
        ok = sent == self.server.key
        headers = {k.lower(): v for k, v in self.headers.items()}
        headers["x-key-ok"] = "1" if ok else "0"
        with self.server.lock:
            self.server.seen.append(Seen(self.path, headers, body))
        if not ok:
            # OpenAI's words, quoting the key it got (a client must never print this as is).
            self._json(
                401,
                {
                    "error": {
                        "message": f"Incorrect API key provided: {sent}. You can find your "
                        "API key at https://platform.openai.com/account/api-keys.",
                        "type": "invalid_request_error",
                        "param": None,
                        "code": "invalid_api_key",
                    }
                },
            )
            return
        usage = {
            "prompt_tokens": PROMPT_TOKENS,
            "completion_tokens": COMPLETION_TOKENS,
            "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
            "prompt_tokens_details": {"cached_tokens": CACHED_TOKENS},
        }
        if body.get("stream"):
            self._stream(usage, bool((body.get("stream_options") or {}).get("include_usage")))
            return
        self._json(
            200,
            {
                "id": "chatcmpl-keyed",
                "object": "chat.completion",
                "created": 0,
                "model": body.get("model", "m"),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": self.server.answer},
                        "finish_reason": "stop",
                    }
                ],
                "usage": usage,
            },
        )

    def _stream(self, usage: dict[str, Any], include_usage: bool) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()

        def chunk(choices: list[dict[str, Any]], **extra: Any) -> None:
            data = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
            data.update(choices=choices, **extra)
            self.wfile.write(b"data: " + json.dumps(data).encode() + b"\n\n")
            self.wfile.flush()

        words = self.server.answer.split(" ")
        for i, word in enumerate(words):
            text = word if i == 0 else " " + word
            chunk([{"index": 0, "delta": {"content": text}, "finish_reason": None}])
        if self.server.drop_streams:
            self.close_connection = True
            return
        chunk([{"index": 0, "delta": {}, "finish_reason": "stop"}])
        if include_usage:
            chunk([], usage=usage)
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # a hosted API has no health route
        self._json(404, {"error": {"message": "not found", "type": "invalid_request_error"}})

    def log_message(self, *args: object) -> None:
        return None


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for ``localhost``/``127.0.0.1`` and its key (PEM), made by openssl."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


def serve(
    key: str,
    *,
    answer: str = "hosted says hi",
    key_header: str = "Authorization",
    tls: tuple[Path, Path] | None = None,
) -> Iterator[KeyedServer]:
    """Run a :class:`KeyedServer` (over TLS with ``tls`` = (cert, key)) for a fixture."""
    server = KeyedServer(key, answer, key_header)
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(tls[0]), str(tls[1]))
        server.socket = context.wrap_socket(server.socket, server_side=True)
        server.scheme = "https"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
