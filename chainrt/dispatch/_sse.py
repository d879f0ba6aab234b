"""Reading a streamed chat completion (server-sent events in OpenAI's chunk format).

Pure: :class:`ChunkReader` is fed the response's lines and says what text each one adds; at
``[DONE]`` it holds the whole answer. A chainrt worker that fails mid-stream sends an
``{"error": ...}`` event before ``[DONE]``; that, a malformed chunk, or a stream that ends
without ``[DONE]`` (the connection dropped) is a :class:`~chainrt.errors.BackendError` like a
failed non-streamed answer.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import BackendError
from ..wire import parse_error_body
from ._backend import BackendAnswer
from ._hops import extensions
from ._usage import read_usage

__all__ = ["ChunkReader"]

_DETAIL_CHARS = 200


class ChunkReader:
    """Accumulates one streamed answer from ``url``, line by line."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.parts: list[str] = []
        self.finish_reason: str | None = None
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cached_tokens: int | None = None
        self.extensions: dict[str, float | None] = {}
        """chainrt's extension fields of the usage chunk (confidence, timings)."""
        self.done = False

    def feed(self, line: str) -> str | None:
        """Take one line of the event stream; the text it adds (None: none)."""
        if not line.startswith("data:"):
            return None  # blank separators, comments, event names: nothing to read
        data = line[5:].strip()
        if data == "[DONE]":
            self.done = True
            return None
        try:
            chunk = json.loads(data)
            if not isinstance(chunk, dict):
                raise TypeError("a chunk must be a JSON object")
            if "error" in chunk:
                error = parse_error_body(data.encode())
                raise BackendError(
                    f"the server failed mid-stream: {error.kind or 'error'}: {error.message}",
                    error_class="5xx",
                    endpoint=self.url,
                )
            return self._read(chunk)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
            detail = " ".join(str(exc).split())[:_DETAIL_CHARS]
            raise BackendError(
                f"malformed stream chunk from the server: {detail}",
                error_class="5xx",
                endpoint=self.url,
            ) from None

    def _read(self, chunk: dict[str, Any]) -> str | None:
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.prompt_tokens, self.completion_tokens, self.cached_tokens = read_usage(usage)
            self.extensions = extensions(chunk)
        choices = chunk.get("choices") or []
        if not choices:
            return None
        choice = choices[0]
        finish = choice.get("finish_reason")
        if finish is not None:
            if not isinstance(finish, str):
                raise TypeError("finish_reason must be a string")
            self.finish_reason = finish
        text = (choice.get("delta") or {}).get("content")
        if text is None or text == "":
            return None
        if not isinstance(text, str):
            raise TypeError("content must be a string")
        self.parts.append(text)
        return text

    def answer(self) -> BackendAnswer:
        """The whole answer; BackendError when the stream did not end properly."""
        if not self.done:
            raise BackendError(
                "the stream ended before [DONE] (connection dropped)",
                error_class="connect",
                endpoint=self.url,
            )
        return BackendAnswer(
            "".join(self.parts),
            self.finish_reason or "stop",
            self.prompt_tokens,
            self.completion_tokens,
            endpoint=self.url,
            cached_tokens=self.cached_tokens,
            **self.extensions,
        )
