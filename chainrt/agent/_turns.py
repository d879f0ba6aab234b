"""What an agent's model turns say and how their answers are read (pure functions, no I/O).

A turn with tools is decoded into :func:`turn_schema` (constrained decoding, on workers and on
the local model alike): either ``{"calls": [{"name": ..., "arguments": {...}}, ...]}`` — the calls
the model proposes together, run at once — or ``{"content": "..."}``, the answer. The tools are
offered in the system message (:func:`tools_text`); the calls' results go back as one user
message (:func:`results_text`). The last turn offers no tools: its answer is decoded into
:data:`ANSWER_SCHEMA` (``{"content": ...}``), or read as plain text from a backend that sends it.
:func:`read_turn` also reads what an unconstrained backend may send: a single call
``{"name": ..., "arguments": {...}}``, or plain text (the answer).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._tools import AgentTool

__all__ = [
    "ANSWER_SCHEMA",
    "FINAL_REQUEST",
    "MAX_RESULT_CHARS",
    "Proposed",
    "Turn",
    "read_turn",
    "results_text",
    "tools_text",
    "turn_schema",
    "unwrap_answer",
]

MAX_RESULT_CHARS = 4000
"""A call's result is cut to this many characters in the message back to the model."""

FINAL_REQUEST = "Stop calling tools now. Answer the user's request with what you have found."
"""The user message of the last turn (no tools offered)."""


@dataclass(frozen=True, slots=True)
class Proposed:
    """One call a turn proposed, as the model wrote it (not yet checked)."""

    name: Any
    arguments: Any

    def as_json(self) -> dict[str, Any]:
        """As recorded and shown: ``{"name": ..., "arguments": ...}``."""
        return {"name": self.name, "arguments": self.arguments}


@dataclass(frozen=True, slots=True)
class Turn:
    """How a turn's text reads: the answer (None when it proposes calls) and the calls."""

    answer: str | None
    calls: tuple[Proposed, ...] = ()


_ANY_CALL: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "arguments": {"type": "object"}},
    "required": ["name", "arguments"],
    "additionalProperties": False,
}


def turn_schema(tools: list[AgentTool], max_calls: int, *, strict: bool = True) -> dict[str, Any]:
    """The JSON Schema a turn with tools is decoded into: each call of a real tool with
    arguments matching its schema (``strict``), or calls of any shape (``constrain: shape``)."""
    one_call = [
        {
            "type": "object",
            "properties": {"name": {"const": t.name}, "arguments": t.parameters},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    if not strict:
        one_call = [_ANY_CALL]
    calls = {
        "type": "object",
        "properties": {
            "calls": {
                "type": "array",
                "items": one_call[0] if len(one_call) == 1 else {"anyOf": one_call},
                "minItems": 1,
                "maxItems": max_calls,
            }
        },
        "required": ["calls"],
        "additionalProperties": False,
    }
    return {"anyOf": [calls, ANSWER_SCHEMA]}


ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"content": {"type": "string"}},
    "required": ["content"],
    "additionalProperties": False,
}
"""An answer: what the last turn (no tools offered) is decoded into."""


def tools_text(tools: list[AgentTool], max_calls: int) -> str:
    """The system-message text that offers ``tools``."""
    listed = "\n".join(
        f"- {t.name}: {t.description} Arguments: {json.dumps(t.parameters, sort_keys=True)}"
        for t in tools
    )
    return (
        f"You can call these tools:\n{listed}\n"
        'To call tools, reply with JSON {"calls": [{"name": "<tool name>", "arguments": {...}}]} '
        f"(at most {max_calls} calls; calls in one reply run at once, so put calls that need "
        "another call's result in a later reply). "
        'To answer, reply with JSON {"content": "<your answer>"}.'
    )


def read_turn(text: str, max_calls: int) -> Turn:
    """What a turn with tools said: calls, or the answer (text that is no such JSON is the
    answer as it stands). Calls past ``max_calls`` are dropped."""
    try:
        data = json.loads(text)
    except ValueError:
        return Turn(answer=text)
    if isinstance(data, dict):
        calls = data.get("calls")
        if isinstance(calls, list) and calls:
            return Turn(None, tuple(_proposed(c) for c in calls[:max_calls]))
        if "name" in data and set(data) <= {"name", "arguments"}:
            return Turn(None, (_proposed(data),))
        content = data.get("content")
        if isinstance(content, str):
            return Turn(answer=content)
    return Turn(answer=text)


def _proposed(entry: Any) -> Proposed:
    if isinstance(entry, dict):
        return Proposed(entry.get("name"), entry.get("arguments", {}))
    return Proposed(None, entry)


def unwrap_answer(text: str) -> str:
    """The last turn's answer: its text, or the ``content`` of a ``{"content": ...}`` reply."""
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            data = json.loads(stripped)
        except ValueError:
            return text
        if isinstance(data, dict) and isinstance(data.get("content"), str):
            return str(data["content"])
    return text


def results_text(results: list[dict[str, Any]]) -> str:
    """The user message that gives a turn's calls' results (``result`` or ``error`` each)."""
    lines = ["Results of your tool calls:"]
    for entry in results:
        call = f"{entry.get('name')}({json.dumps(entry.get('arguments'), sort_keys=True)})"
        if "error" in entry:
            lines.append(f"- {call} failed: {entry['error']}")
        else:
            shown = json.dumps(entry.get("result"), ensure_ascii=False)
            if len(shown) > MAX_RESULT_CHARS:
                shown = shown[: MAX_RESULT_CHARS - 3] + "..."
            lines.append(f"- {call} returned: {shown}")
    lines.append("Call more tools if you need to, or answer.")
    return "\n".join(lines)
