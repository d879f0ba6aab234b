"""The OpenAI-compatible wire format: request models and response bodies.

Request models validate strictly the fields the worker uses (wrong types are a 400, never coerced:
``"max_tokens": "5"`` is refused). Other parameters of the OpenAI API are accepted and ignored
(``extra="ignore"``), because OpenAI adds some every few months and stock clients send them; the
few that would change the meaning of the answer (``n > 1``, tools, logprobs, echo) are refused.
Responses are built as plain dicts: they are on the hot path and need no validation.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from chainrt.wire import error_body
from workers.engines import ChatMessage, FinishReason, GenerationResult

__all__ = [
    "ChatCompletionRequest",
    "CompletionRequest",
    "InvalidBody",
    "chat_chunk",
    "chat_response",
    "completion_chunk",
    "completion_response",
    "error_body",
    "new_id",
    "parse_body",
]

_STRICT_IGNORE = ConfigDict(strict=True, extra="ignore")
_UNSUPPORTED: list[tuple[str, Any, str]] = [
    ("n", lambda v: v in (None, 1), "one choice per request"),
    ("best_of", lambda v: v in (None, 1), "one choice per request"),
    ("tools", lambda v: not v, "no tool calling"),
    ("functions", lambda v: not v, "no function calling"),
    ("logprobs", lambda v: v in (None, False, 0), "no log-probabilities"),
    ("echo", lambda v: v in (None, False), "the prompt is not echoed"),
    ("suffix", lambda v: v in (None, ""), "no insertion"),
]
"""(field, accepted(value), reason): OpenAI parameters the worker refuses unless left default."""


class TextPart(BaseModel):
    """A text part of a multi-part message content."""

    model_config = _STRICT_IGNORE
    type: Literal["text"]
    text: str


class Message(BaseModel):
    """One chat message; content may be a string or a list of text parts."""

    model_config = _STRICT_IGNORE
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        """The content as one string (text parts joined)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ResponseFormat(BaseModel):
    """``response_format``: ``json_object`` / ``json_schema`` turn on JSON-constrained output."""

    model_config = _STRICT_IGNORE
    type: Literal["text", "json_object", "json_schema"]


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` adds a final chunk carrying token counts."""

    model_config = _STRICT_IGNORE
    include_usage: bool = False


class _Common(BaseModel):
    """Sampling fields shared by the chat and completions endpoints."""

    model_config = _STRICT_IGNORE
    model: str = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data: Any) -> Any:
        # Parameters that would change what the answer means get a clear refusal, not silence.
        if isinstance(data, dict):
            for key, ok, why in _UNSUPPORTED:
                if key in data and not ok(data[key]):
                    raise ValueError(f"{key} is not supported by this worker ({why})")
        return data

    def stops(self) -> list[str] | None:
        """``stop`` as a list (OpenAI allows a bare string)."""
        if self.stop is None:
            return None
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        if len(stops) > 4:
            raise ValueError("stop takes at most 4 sequences")
        return stops

    @property
    def include_usage(self) -> bool:
        """Whether a streamed answer ends with a usage chunk."""
        return self.stream_options is not None and self.stream_options.include_usage


class ChatCompletionRequest(_Common):
    """Body of ``POST /v1/chat/completions``."""

    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    response_format: ResponseFormat | None = None

    @model_validator(mode="after")
    def _check_stops(self) -> ChatCompletionRequest:
        self.stops()
        return self

    def limit(self) -> int | None:
        """The completion-token limit asked for (``max_completion_tokens`` wins)."""
        return self.max_completion_tokens or self.max_tokens

    def chat_messages(self) -> list[ChatMessage]:
        """The messages in engine form."""
        return [ChatMessage(m.role, m.text()) for m in self.messages]

    @property
    def json_output(self) -> bool:
        """True when the caller asked for JSON."""
        fmt = self.response_format
        return fmt is not None and fmt.type != "text"


class CompletionRequest(_Common):
    """Body of ``POST /v1/completions`` (one string prompt; OpenAI's default of 16 tokens)."""

    prompt: str | list[str]
    max_tokens: int | None = Field(default=16, ge=1)

    @model_validator(mode="after")
    def _check(self) -> CompletionRequest:
        self.stops()
        if isinstance(self.prompt, list) and len(self.prompt) != 1:
            raise ValueError("prompt must be one string (batches of prompts are not supported)")
        return self

    def limit(self) -> int | None:
        """The completion-token limit asked for."""
        return self.max_tokens

    def text(self) -> str:
        """The prompt as one string."""
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


def new_id(prefix: str) -> str:
    """An OpenAI-style object id (``chatcmpl-...``, ``cmpl-...``)."""
    return f"{prefix}-{uuid.uuid4().hex}"


def _usage(result: GenerationResult) -> dict[str, int]:
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "total_tokens": result.prompt_tokens + result.completion_tokens,
    }


def chat_response(rid: str, model: str, result: GenerationResult) -> dict[str, Any]:
    """A ``chat.completion`` object. ``finish_reason`` may be ``deadline`` (chainrt's own)."""
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": result.text},
                "finish_reason": result.finish_reason,
                "logprobs": None,
            }
        ],
        "usage": _usage(result),
    }


def completion_response(rid: str, model: str, result: GenerationResult) -> dict[str, Any]:
    """A ``text_completion`` object."""
    return {
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


def chat_chunk(
    rid: str,
    model: str,
    *,
    content: str | None = None,
    role: bool = False,
    finish: FinishReason | None = None,
    usage: GenerationResult | None = None,
) -> dict[str, Any]:
    """One ``chat.completion.chunk``; a usage-only chunk has no choices (as OpenAI sends it)."""
    chunk: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [],
    }
    if usage is not None:
        chunk["usage"] = _usage(usage)
        return chunk
    delta: dict[str, str] = {"role": "assistant"} if role else {}
    if content is not None:
        delta["content"] = content
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
    chunk: dict[str, Any] = {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [],
    }
    if usage is not None:
        chunk["usage"] = _usage(usage)
    else:
        chunk["choices"] = [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}]
    return chunk


class InvalidBody(ValueError):
    """A request body that does not parse or validate; ``str()`` says where and why."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def parse_body(body: bytes, *, chat: bool) -> ChatCompletionRequest | CompletionRequest:
    """Validate a chat or completions body (raises InvalidBody naming up to three problems)."""
    model = ChatCompletionRequest if chat else CompletionRequest
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        # include_input=False: never echo a (possibly huge) body back in the error.
        errors = exc.errors(include_input=False, include_url=False)
    if errors and errors[0]["type"] == "json_invalid":
        raise InvalidBody(f"the request body is not valid JSON: {errors[0]['msg']}")
    problems = "; ".join(
        f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in errors[:3]
    )
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    param = ".".join(map(str, errors[0]["loc"])) if errors and errors[0]["loc"] else None
    raise InvalidBody(f"invalid request: {problems}{more}", param)
