"""Tool calls by constrained decoding: JSON Schema checks, the call schema, reading the answer (public).

Every engine constrains its sampling to a JSON Schema (llama.cpp: a GBNF grammar built from the
schema; vLLM: its structured outputs; torch: an llguidance token mask). Tool calling is built on
the same constraint for models that have no native tool calling: the tools are offered in a
system message and the answer is decoded into :func:`tool_call_schema`, a JSON object that names
one tool and its arguments (or, when the model may choose, a plain ``{"content": ...}`` answer);
:func:`parse_tool_answer` turns it back into OpenAI-style tool calls.

Pure functions on plain JSON values, imported by the engines (:mod:`chainrt.engines`), the worker
server (``workers.server``) and chainrt's LangChain model (:mod:`chainrt.langchain`), so the three
cannot drift apart. Like :mod:`chainrt.wire`, it imports only the standard library (``jsonschema``
on first use): it sits in the bottom layer (docs/architecture.md).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ANY_JSON_OBJECT",
    "InvalidSchema",
    "ToolCall",
    "ToolSpec",
    "check_json_schema",
    "parse_tool_answer",
    "tool_call_schema",
    "tools_instruction",
]

ANY_JSON_OBJECT: dict[str, Any] = {"type": "object"}
"""What ``response_format: json_object`` (and ``llm.json: true``) constrains to."""
_MAX_SCHEMA_BYTES = 64 * 1024


class InvalidSchema(ValueError):
    """A JSON Schema that is not one (``str()`` says where and why), or tools that are unusable."""


def check_json_schema(schema: Any, *, what: str = "json_schema") -> dict[str, Any]:
    """``schema`` if it is a valid JSON Schema object (Draft 2020-12 metaschema), else raise.

    Raises :class:`InvalidSchema` with a one-line message naming the offending keyword's path.
    """
    if not isinstance(schema, dict):
        raise InvalidSchema(f"{what} must be a JSON object, not {type(schema).__name__}")
    size = len(json.dumps(schema))
    if size > _MAX_SCHEMA_BYTES:
        raise InvalidSchema(f"{what} is {size} bytes; the limit is {_MAX_SCHEMA_BYTES}")
    try:
        from jsonschema import Draft202012Validator
        from jsonschema.exceptions import SchemaError
    except ImportError:  # pragma: no cover - jsonschema is a dependency; shape checks only
        return schema
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(top level)"
        raise InvalidSchema(
            f"{what} is not a valid JSON Schema: at {where}: {exc.message}"
        ) from None
    return schema


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One callable tool: its name, what it does and the JSON Schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]

    @classmethod
    def from_openai(cls, tool: Any) -> ToolSpec:
        """From an OpenAI ``tools`` entry: ``{"type": "function", "function": {...}}``."""
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise InvalidSchema('each tool must be {"type": "function", "function": {...}}')
        function = tool.get("function")
        if not isinstance(function, dict):
            raise InvalidSchema("a tool's function must be an object with a name")
        name = function.get("name")
        if not isinstance(name, str) or not name or len(name) > 64:
            raise InvalidSchema("a tool's function.name must be a string of 1-64 characters")
        description = function.get("description") or ""
        if not isinstance(description, str):
            raise InvalidSchema(f"tool {name!r}: description must be a string")
        params = function.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}}
        check_json_schema(params, what=f"tool {name!r} parameters")
        return cls(name, description, params)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call decoded from the model: OpenAI's shape, arguments as a JSON object."""

    id: str
    name: str
    arguments: dict[str, Any]

    def to_openai(self) -> dict[str, Any]:
        """As an entry of an OpenAI ``message.tool_calls`` (arguments as a JSON string)."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments)},
        }


def _call_schema(tool: ToolSpec) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": tool.name}, "arguments": tool.parameters},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


_CONTENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"content": {"type": "string"}},
    "required": ["content"],
    "additionalProperties": False,
}


def tool_call_schema(tools: list[ToolSpec], choice: str) -> dict[str, Any] | None:
    """The schema the answer is decoded into, for ``tool_choice`` ``choice``.

    ``choice`` is ``auto`` (a call of any tool, or ``{"content": ...}``), ``required`` (a call of
    any tool), ``none`` (None: no constraint, the tools are not offered) or a tool's name (a call
    of that tool).
    """
    if not tools or choice == "none":
        return None
    if choice not in ("auto", "required"):
        chosen = [t for t in tools if t.name == choice]
        if not chosen:
            names = ", ".join(t.name for t in tools)
            raise InvalidSchema(f"tool_choice names {choice!r}, which is not a tool ({names})")
        return _call_schema(chosen[0])
    options = [_call_schema(t) for t in tools]
    if choice == "auto":
        options.append(_CONTENT_SCHEMA)
    return options[0] if len(options) == 1 else {"anyOf": options}


def tools_instruction(tools: list[ToolSpec], choice: str) -> str | None:
    """The system-message text that offers the tools to the model (None when not offered)."""
    if not tools or choice == "none":
        return None
    listed = "\n".join(
        f"- {t.name}: {t.description or '(no description)'} Arguments: "
        f"{json.dumps(t.parameters, sort_keys=True)}"
        for t in tools
        if choice in ("auto", "required") or t.name == choice
    )
    example = '{"name": "<tool name>", "arguments": {...}}'
    text = f"You can call these tools:\n{listed}\nTo call a tool, reply with JSON {example}."
    if choice == "auto":
        text += ' To answer without a tool, reply with JSON {"content": "<your answer>"}.'
    return text


def parse_tool_answer(text: str, tools: list[ToolSpec]) -> tuple[str | None, list[ToolCall]]:
    """(content, tool calls) of an answer decoded into :func:`tool_call_schema`.

    Text that is not such JSON (a cut-off answer, an unconstrained backend) comes back as
    content with no tool calls.
    """
    try:
        data = json.loads(text)
    except ValueError:
        return text, []
    if isinstance(data, dict):
        names = {t.name for t in tools}
        name, arguments = data.get("name"), data.get("arguments")
        if name in names and isinstance(arguments, dict):
            return None, [ToolCall(f"call_{uuid.uuid4().hex[:24]}", str(name), arguments)]
        content = data.get("content")
        if isinstance(content, str) and set(data) == {"content"}:
            return content, []
    return text, []
