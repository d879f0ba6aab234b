"""HTTP plumbing the handlers share: error responses, bounded body reads, headers, SSE."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

import anyio
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from chainrt import wire

from ._openai import error_body

__all__ = [
    "SSE_DONE",
    "ClientGone",
    "HttpError",
    "SSEResponse",
    "aclose",
    "json_response",
    "parse_deadline",
    "parse_priority",
    "read_body",
    "require_json",
    "retry_after",
    "run_until_disconnect",
    "sse",
]

T = TypeVar("T")


class HttpError(Exception):
    """Ends a request with an OpenAI-shaped error (raised anywhere in a handler)."""

    def __init__(
        self,
        status: int,
        kind: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        body: dict[str, Any] | None = None,
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message
        self.headers = headers or {}
        self.body = body or error_body(kind, message, code=code, param=param)

    def response(self) -> Response:
        """The JSON error response."""
        return json_response(self.body, self.status, self.headers)


class ClientGone(Exception):
    """The client disconnected before the answer was ready; nobody gets a response."""


def json_response(
    body: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    """A compact JSON response (no pretty-printing: it is on the hot path)."""
    data = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return Response(data, status, headers, media_type="application/json")


def retry_after(seconds: float) -> dict[str, str]:
    """A ``Retry-After`` header (HTTP wants whole seconds; at least 1)."""
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


def require_json(request: Request) -> None:
    """415 unless the body is declared ``application/json`` (parameters such as charset allowed).

    A web page may POST ``text/plain`` (or a form) to any origin without a CORS preflight; only
    JSON needs one. Refusing other types keeps a page in a browser from driving a worker on
    localhost, and a mislabelled body is refused rather than guessed at.
    """
    declared = request.headers.get("content-type")
    media = (declared or "").partition(";")[0].strip().lower()
    if media != "application/json":
        got = repr(declared[:80]) if declared else "none"
        raise HttpError(
            415,
            "invalid_request_error",
            f"Content-Type must be application/json, got {got}",
            code="unsupported_media_type",
            param="Content-Type",
        )


async def read_body(request: Request, limit: int) -> bytes:
    """The JSON request body: 415 unless declared ``application/json`` (:func:`require_json`),
    413 when over ``limit`` bytes, refused without reading it all."""
    require_json(request)
    declared = request.headers.get("content-length")
    too_large = HttpError(
        413,
        "request_too_large",
        f"the request body is over this worker's limit of {limit} bytes",
        code="body_too_large",
    )
    if declared is not None:
        try:
            if int(declared) > limit:
                raise too_large
        except ValueError:
            raise HttpError(
                400, "invalid_request_error", "Content-Length is not a number"
            ) from None
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:  # a chunked body has no Content-Length: count as it comes
                raise too_large
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientGone() from None
    return b"".join(chunks)


def parse_deadline(value: str | None) -> float | None:
    """``X-Chainrt-Deadline`` (unix milliseconds) as unix seconds; 400 when malformed."""
    if value is None:
        return None
    try:
        return wire.decode_deadline(value)
    except ValueError as exc:
        raise HttpError(400, wire.INVALID_REQUEST, str(exc), param=wire.DEADLINE_HEADER) from None


def parse_priority(value: str | None) -> wire.Priority:
    """``X-Priority`` (critical|high|normal|low, default normal); 400 when unknown."""
    try:
        return wire.parse_priority(value)
    except ValueError as exc:
        raise HttpError(400, wire.INVALID_REQUEST, str(exc), param=wire.PRIORITY_HEADER) from None


async def run_until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``, cancelling it if the client disconnects first (then raise ClientGone).

    The body is already read, so the next ASGI message can only be ``http.disconnect``.
    """
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                task.cancel()
                return

    watcher = asyncio.create_task(watch())
    try:
        return await task
    except asyncio.CancelledError:
        if watcher.done() and not watcher.cancelled():
            raise ClientGone() from None
        raise
    finally:
        watcher.cancel()


async def aclose(iterator: object) -> None:
    """Close an async generator (an ``AsyncIterator`` may or may not have ``aclose``)."""
    close = getattr(iterator, "aclose", None)
    if close is not None:
        await close()


def sse(payload: dict[str, Any]) -> bytes:
    """One server-sent event carrying a JSON object."""
    body = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return b"data: " + body.encode("utf-8") + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


class SSEResponse(StreamingResponse):
    """A server-sent-events stream whose ``cleanup`` runs however it ends.

    Starlette may never start the body iterator (client gone before the first byte), in which case
    the iterator's own ``finally`` would never run; ``cleanup`` here always does, shielded from
    cancellation, so an engine slot can never leak. ``cleanup(disconnected)`` learns whether the
    client left before the last event: Starlette returns normally either way (ASGI < 2.4 servers
    cancel the stream on disconnect), so only the body's exhaustion tells.
    """

    def __init__(
        self, content: AsyncIterator[bytes], cleanup: Callable[[bool], Awaitable[None]]
    ) -> None:
        self._content = content
        self._cleanup = cleanup
        self._exhausted = False
        super().__init__(
            self._tracked(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def _tracked(self) -> AsyncIterator[bytes]:
        async for chunk in self._content:
            yield chunk
        self._exhausted = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Stream; a disconnect ends the stream quietly; ``cleanup(disconnected)`` always runs."""
        try:
            await super().__call__(scope, receive, send)
        except (ClientDisconnect, OSError):
            pass  # the client left mid-stream: nothing to answer, cleanup aborts the generation
        finally:
            with anyio.CancelScope(shield=True):
                await aclose(self.body_iterator)
                await aclose(self._content)
                await self._cleanup(not self._exhausted)
