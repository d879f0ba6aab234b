"""One HTTP exchange with an OpenAI-compatible endpoint, as bytes: the request body, the streamed
reading of an answer, the answer's body, and the :class:`BackendError` a failure means.

Pure but for :func:`stream_answer` (it reads the response it is given): the backend
(:mod:`._http`) picks the endpoint, sends, times and judges; this module says what goes on the
wire and what came back. Every failure's ``error_class`` is one of the breaker classes (see
:mod:`._http`).
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import math
import time
from collections.abc import Mapping
from typing import Any

import httpx

from ..errors import BackendError, InsufficientMemory
from ..wire import INSUFFICIENT_MEMORY, breaker_class, parse_error_body
from ._backend import BackendAnswer, TextSink
from ._credentials import AUTH_STATUSES, EndpointAuth, auth_message
from ._hops import extensions
from ._sse import ChunkReader
from ._types import LlmCall
from ._usage import read_usage

__all__ = [
    "endpoint_error",
    "error_from_response",
    "parse_retry_after",
    "read_answer",
    "request_body",
    "short",
    "stream_answer",
]

CHAT_PATH = "/v1/chat/completions"
_MAX_RETRY_AFTER_S = 3600.0
_DETAIL_CHARS = 200
_DRAIN_S = 0.05
"""Longest wait for a streamed body to end after its ``[DONE]``."""


async def stream_answer(
    client: httpx.AsyncClient,
    target: str,
    body: bytes,
    headers: dict[str, str],
    limits: httpx.Timeout,
    url: str,
    on_text: TextSink,
    auth: EndpointAuth | None = None,
) -> BackendAnswer:
    """POST a streamed request and hand each piece of text to ``on_text`` as it arrives.

    Leaving early (the deadline, a cancelled step, a hedge that lost) closes the connection,
    which stops a chainrt worker's generation at its next token.
    """
    async with client.stream(
        "POST", target, content=body, headers=headers, timeout=limits
    ) as response:
        if response.status_code != 200:
            content = await response.aread()
            raise error_from_response(
                response.status_code, response.headers, content, url, auth=auth
            )
        reader = ChunkReader(url)
        lines = response.aiter_lines()
        async for line in lines:
            text = reader.feed(line)
            if text is not None:
                on_text(text)
            if reader.done:
                break
        if reader.done:
            # The body ends right after [DONE]: reading it to its end keeps the connection in
            # the pool (an unread body closes it, and the next request pays a new connection
            # before its first token). A server that does not end it soon is not waited for.
            with contextlib.suppress(httpx.HTTPError, TimeoutError):
                async with asyncio.timeout(_DRAIN_S):
                    async for _ in lines:
                        pass
        return reader.answer()


def request_body(
    call: LlmCall,
    served_model: str,
    max_tokens: int,
    *,
    stream: bool = False,
    options: Mapping[str, Any] | None = None,
) -> bytes:
    """The request body; ``options``: the pool model's ``request`` (see ``RequestConfig``)."""
    options = options or {}
    payload: dict[str, Any] = {
        "model": served_model,
        "messages": [{"role": role, "content": content} for role, content in call.messages],
        str(options.get("max_tokens_field") or "max_tokens"): max_tokens,
        "temperature": call.temperature,
    }
    if stream:
        payload["stream"] = True
        if options.get("stream_usage", True):
            payload["stream_options"] = {"include_usage": True}
    if call.stop:
        payload["stop"] = call.stop
    if call.json_schema is not None:
        payload["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": call.json_schema},
        }
    elif call.json_output:
        payload["response_format"] = {"type": "json_object"}
    for name, value in (options.get("body") or {}).items():
        if value is None:
            payload.pop(name, None)  # null in the pool file: a field the API refuses
        else:
            payload[name] = value
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def short(exc: BaseException) -> str:
    """An exception's text on one line, cut to a detail's length."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:_DETAIL_CHARS]


def endpoint_error(
    message: str, error_class: str, url: str, *, retryable: bool = True
) -> BackendError:
    """A :class:`BackendError` of ``url`` (retryable unless told)."""
    return BackendError(message, error_class=error_class, retryable=retryable, endpoint=url)


def read_answer(content: bytes, url: str) -> BackendAnswer:
    """The answer in an OpenAI chat.completion body; a malformed body is the server's fault."""
    try:
        data = json.loads(content)
        choice = data["choices"][0]
        text = choice["message"].get("content") or ""
        finish = choice.get("finish_reason") or "stop"
        prompt_tokens, completion_tokens, cached = read_usage(data.get("usage"))
        if not isinstance(text, str) or not isinstance(finish, str):
            raise TypeError("content and finish_reason must be strings")
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        raise endpoint_error(
            f"malformed chat completion from the server: {short(exc)}", "5xx", url
        ) from None
    return BackendAnswer(
        text,
        finish,
        prompt_tokens,
        completion_tokens,
        endpoint=url,
        cached_tokens=cached,
        **extensions(data),
    )


def parse_retry_after(value: str | None) -> float | None:
    """``Retry-After`` (seconds or an HTTP date) as seconds from now; None when absent or bad."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - time.time()
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), _MAX_RETRY_AFTER_S)


def error_from_response(
    status: int,
    headers: Mapping[str, str],
    body: bytes,
    url: str,
    *,
    auth: EndpointAuth | None = None,
) -> BackendError:
    """The :class:`BackendError` a non-200 answer means (pure: no I/O).

    The error class follows the status (:func:`chainrt.wire.breaker_class`); a worker's
    ``insufficient_memory`` refusal is an :class:`~chainrt.errors.InsufficientMemory` carrying
    its advice. A ``401``/``403`` is the ``auth`` class (a configuration error, never retried):
    its message names the endpoint's key variable, and the key never appears in it.
    """
    error = parse_error_body(body)
    if status in AUTH_STATUSES:
        said = (f"{error.kind}: " if error.kind else "") + error.message
        return BackendError(
            auth_message(status, said.strip(), auth),
            error_class="auth",
            retryable=False,
            endpoint=url,
        )
    what = (
        f"HTTP {status}"
        + (f" {error.kind}" if error.kind else "")
        + (f": {error.message}" if error.message else "")
    )
    retry_after = parse_retry_after(headers.get("retry-after"))
    error_class = breaker_class(status)
    if status == 429:
        wait = error.advice_retry_after_s if error.advice_retry_after_s is not None else retry_after
        if error.kind == INSUFFICIENT_MEMORY:
            return InsufficientMemory(
                what, advice_max_tokens=error.advice_max_tokens, retry_after_s=wait, endpoint=url
            )
        return BackendError(
            what,
            error_class=error_class,
            retry_after_s=wait,
            endpoint=url,
            advice_max_tokens=error.advice_max_tokens,
        )
    if error_class == "bad_request":
        return BackendError(what, error_class=error_class, retryable=False, endpoint=url)
    if error_class == "timeout":
        return BackendError(what, error_class=error_class, endpoint=url)
    return BackendError(what, error_class=error_class, retry_after_s=retry_after, endpoint=url)
