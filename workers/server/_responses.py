"""OpenAI response bodies (chat, completions, streamed chunks), built as plain dicts.

They are on the hot path and need no validation. They know nothing of the request models of
:mod:`workers.server._openai` (which imports this module): ``chat_answer``, which reads the request
to decode offered tools back into OpenAI ``tool_calls``, lives there.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from chainrt.engines import FinishReason, GenerationResult
from chainrt.toolcalls import ToolCall

__all__ = [
    "chat_chunk",
    "chat_response",
    "completion_chunk",
    "completion_response",
    "new_id",
    "server_hops",
    "with_hops",
]


def new_id(prefix: str) -> str:
    """An OpenAI-style object id (``chatcmpl-...``, ``cmpl-...``)."""
    return f"{prefix}-{uuid.uuid4().hex}"


def _usage(result: GenerationResult) -> dict[str, int]:
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "total_tokens": result.prompt_tokens + result.completion_tokens,
    }


def _extensions(body: dict[str, Any], result: GenerationResult) -> dict[str, Any]:
    """chainrt's extension fields: ``confidence_score`` and ``timings`` (prefill/decode ms)."""
    body["confidence_score"] = result.confidence
    if result.prefill_ms is not None or result.decode_ms is not None:
        body["timings"] = {"prefill_ms": result.prefill_ms, "decode_ms": result.decode_ms}
    return body


def server_hops(started: float, queued: float, admitted: float) -> dict[str, float]:
    """The worker's own hops before the engine (``perf_counter`` marks): ``queue_ms`` (waiting
    for an engine slot, and for readiness) and ``admission_ms`` (memory admission, faults)."""
    return {
        "queue_ms": round((queued - started) * 1000, 3),
        "admission_ms": round((admitted - queued) * 1000, 3),
    }


def with_hops(body: dict[str, Any], hops: dict[str, float]) -> dict[str, Any]:
    """``body`` with ``hops`` added to its ``timings``."""
    timings = body.get("timings")
    body["timings"] = {**hops, **(timings if isinstance(timings, dict) else {})}
    return body


def chat_response(
    rid: str,
    model: str,
    result: GenerationResult,
    *,
    content: str | None = None,
    tool_calls: list[ToolCall] | None = None,
) -> dict[str, Any]:
    """A ``chat.completion`` object. ``finish_reason`` may be ``deadline`` (chainrt's own).

    With ``tool_calls`` the message carries them (and no content), ``finish_reason`` is
    ``tool_calls``; ``content`` replaces the generated text (a tool answer's own content).
    """
    message: dict[str, Any] = {"role": "assistant", "content": result.text}
    finish: str = result.finish_reason
    if tool_calls:
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [call.to_openai() for call in tool_calls],
        }
        finish = "tool_calls"
    elif content is not None:
        message["content"] = content
    body = {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": _usage(result),
    }
    return _extensions(body, result)


def completion_response(rid: str, model: str, result: GenerationResult) -> dict[str, Any]:
    """A ``text_completion`` object."""
    body = {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "text": result.text,
                "finish_reason": result.finish_reason,
                "logprobs": None,
            }
        ],
        "usage": _usage(result),
    }
    return _extensions(body, result)


def _stream_chunk(
    rid: str, model: str, kind: str, usage: GenerationResult | None
) -> dict[str, Any]:
    """A streamed chunk's common fields, no choices; with ``usage``, the whole usage-only chunk."""
    chunk: dict[str, Any] = {
        "id": rid,
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": [],
    }
    if usage is not None:
        chunk["usage"] = _usage(usage)
        _extensions(chunk, usage)
    return chunk


def chat_chunk(
    rid: str,
    model: str,
    *,
    content: str | None = None,
    role: bool = False,
    finish: FinishReason | Literal["tool_calls"] | None = None,
    usage: GenerationResult | None = None,
    tool_calls: list[ToolCall] | None = None,
) -> dict[str, Any]:
    """One ``chat.completion.chunk``; a usage-only chunk has no choices (as OpenAI sends it).

    ``tool_calls`` are sent whole in one delta (each with its ``index``, as OpenAI streams them).
    """
    chunk = _stream_chunk(rid, model, "chat.completion.chunk", usage)
    if usage is not None:
        return chunk
    delta: dict[str, Any] = {"role": "assistant"} if role else {}
    if content is not None:
        delta["content"] = content
    if tool_calls:
        delta["tool_calls"] = [{"index": i, **c.to_openai()} for i, c in enumerate(tool_calls)]
    chunk["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
    return chunk


def completion_chunk(
    rid: str,
    model: str,
    *,
    text: str = "",
    finish: FinishReason | None = None,
    usage: GenerationResult | None = None,
) -> dict[str, Any]:
    """One streamed ``text_completion`` chunk (usage-only when ``usage`` is given)."""
    chunk = _stream_chunk(rid, model, "text_completion", usage)
    if usage is None:
        chunk["choices"] = [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}]
    return chunk
