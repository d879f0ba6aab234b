"""The OpenAI-compatible wire format: request models and response bodies.

Request models validate strictly the fields the worker uses (wrong types are a 400, never coerced:
``"max_tokens": "5"`` is refused). Other parameters of the OpenAI API are accepted and ignored
(``extra="ignore"``), because OpenAI adds some every few months and stock clients send them; the
few that would change the meaning of the answer (``n > 1``, ``functions``, logprobs, echo, a
non-empty ``logit_bias``) are refused; the ignored ones are listed in ``docs/workers.md``.
``response_format`` (``json_object``, ``json_schema``) and ``tools`` / ``tool_choice`` are served
by constrained decoding (:mod:`chainrt.toolcalls`): a schema that is not a valid
JSON Schema is a 400 naming where it is wrong. Response bodies are built in
:mod:`workers.server._responses` (re-exported here), except :func:`chat_answer`, which reads the
request.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from chainrt.engines import ChatMessage, GenerationResult
from chainrt.toolcalls import (
    InvalidSchema,
    ToolSpec,
    check_json_schema,
    parse_tool_answer,
    tool_call_schema,
    tools_instruction,
)
from chainrt.wire import error_body

from ._responses import (
    chat_chunk,
    chat_response,
    completion_chunk,
    completion_response,
    new_id,
)

__all__ = [
    "ChatCompletionRequest",
    "CompletionRequest",
    "InvalidBody",
    "chat_answer",
    "chat_chunk",
    "chat_response",
    "completion_chunk",
    "completion_response",
    "error_body",
    "new_id",
    "parse_body",
]

_STRICT_IGNORE = ConfigDict(strict=True, extra="ignore")
MAX_SEED = 2**32 - 1
"""Largest ``seed`` accepted: every engine takes a 32-bit seed (llama.cpp's is unsigned)."""
_UNSUPPORTED: list[tuple[str, Any, str]] = [
    ("n", lambda v: v in (None, 1), "one choice per request"),
    ("best_of", lambda v: v in (None, 1), "one choice per request"),
    ("functions", lambda v: not v, "no function calling"),
    ("logprobs", lambda v: v in (None, False, 0), "no log-probabilities"),
    ("echo", lambda v: v in (None, False), "the prompt is not echoed"),
    ("suffix", lambda v: v in (None, ""), "no insertion"),
    ("logit_bias", lambda v: not v, "no logit bias: the answer would not be what was asked"),
]
"""(field, accepted(value), reason): OpenAI parameters the worker refuses unless left default."""


class TextPart(BaseModel):
    """A text part of a multi-part message content."""

    model_config = _STRICT_IGNORE
    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    """The function of an assistant's earlier tool call (``arguments`` is a JSON string)."""

    model_config = _STRICT_IGNORE
    name: str
    arguments: str = "{}"


class MessageToolCall(BaseModel):
    """A tool call in an assistant message of the history."""

    model_config = _STRICT_IGNORE
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    """One chat message; content may be a string or a list of text parts."""

    model_config = _STRICT_IGNORE
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        """The content as one string (text parts joined; earlier tool calls as their JSON)."""
        if self.tool_calls:
            # The form the model produced them in (chainrt.toolcalls.tool_call_schema).
            return "\n".join(
                json.dumps({"name": c.function.name, "arguments": _arguments(c.function)})
                for c in self.tool_calls
            )
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


def _arguments(function: FunctionCall) -> Any:
    try:
        return json.loads(function.arguments)
    except ValueError:
        return function.arguments


class JsonSchemaFormat(BaseModel):
    """``response_format.json_schema``: a named JSON Schema the answer must match."""

    model_config = ConfigDict(strict=True, extra="ignore", populate_by_name=True)
    name: str = Field(default="response", max_length=64)
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=lambda: {"type": "object"}, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """``response_format``: ``json_object`` / ``json_schema`` turn on JSON-constrained output."""

    model_config = _STRICT_IGNORE
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _check(self) -> ResponseFormat:
        if self.type == "json_schema":
            if self.json_schema is None:
                raise ValueError('type "json_schema" needs a json_schema: {"schema": {...}}')
            try:
                check_json_schema(self.json_schema.schema_, what="json_schema.schema")
            except InvalidSchema as exc:
                raise ValueError(str(exc)) from None
        return self


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
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)

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
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=64)
    tool_choice: str | dict[str, Any] | None = None
    _specs: list[ToolSpec] = PrivateAttr(default_factory=list)
    _tool_schema: dict[str, Any] | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _check_stops(self) -> ChatCompletionRequest:
        self.stops()
        try:
            self._specs = [ToolSpec.from_openai(tool) for tool in self.tools or []]
            if len({s.name for s in self._specs}) != len(self._specs):
                raise InvalidSchema("two tools have the same name")
            self._tool_schema = tool_call_schema(self._specs, self.choice())
        except InvalidSchema as exc:
            raise ValueError(str(exc)) from None
        if self._tool_schema is not None and self.json_output:
            raise ValueError("response_format cannot be combined with tools (tool_choice none)")
        return self

    def tool_specs(self) -> list[ToolSpec]:
        """The tools offered (validated when the body was)."""
        return self._specs

    def choice(self) -> str:
        """``tool_choice`` as ``auto``/``none``/``required`` or the one tool's name."""
        choice = self.tool_choice
        if choice is None:
            return "auto"
        if isinstance(choice, str):
            if choice not in ("auto", "none", "required"):
                raise InvalidSchema(
                    f"tool_choice must be auto, none, required or a function, not {choice!r}"
                )
            return choice
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if choice.get("type") != "function" or not isinstance(name, str):
            raise InvalidSchema(
                'tool_choice must be {"type": "function", "function": {"name": ...}}'
            )
        return name

    def tool_schema(self) -> dict[str, Any] | None:
        """The schema a tool call is decoded into (None: no tools in play)."""
        return self._tool_schema

    def limit(self) -> int | None:
        """The completion-token limit asked for (``max_completion_tokens`` wins)."""
        return self.max_completion_tokens or self.max_tokens

    def chat_messages(self) -> list[ChatMessage]:
        """The messages in engine form; offered tools are described in the system message."""
        messages = [ChatMessage(m.role, m.text()) for m in self.messages]
        offer = tools_instruction(self.tool_specs(), self.choice())
        if offer is None:
            return messages
        if messages[0].role == "system":
            return [ChatMessage("system", f"{messages[0].content}\n\n{offer}"), *messages[1:]]
        return [ChatMessage("system", offer), *messages]

    @property
    def json_output(self) -> bool:
        """True when the caller asked for JSON."""
        fmt = self.response_format
        return fmt is not None and fmt.type != "text"

    @property
    def json_schema(self) -> dict[str, Any] | None:
        """The schema the answer must match: the tool-call schema or ``response_format``'s."""
        tools = self.tool_schema()
        if tools is not None:
            return tools
        fmt = self.response_format
        if fmt is not None and fmt.type == "json_schema" and fmt.json_schema is not None:
            return fmt.json_schema.schema_
        return None


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


def chat_answer(
    rid: str, parsed: ChatCompletionRequest, result: GenerationResult
) -> dict[str, Any]:
    """The ``chat.completion`` for ``parsed``: tool calls decoded when tools were offered."""
    if parsed.tool_schema() is None:
        return chat_response(rid, parsed.model, result)
    content, calls = parse_tool_answer(result.text, parsed.tool_specs())
    return chat_response(rid, parsed.model, result, content=content, tool_calls=calls)


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
