"""Tool calling for :class:`~chainrt.langchain.ChatChainrt`: bound tools, ``tool_choice``
spellings, and tool calls read back from a constrained answer."""

from __future__ import annotations

from typing import Any

from .._errors import InputError
from ..dispatch import LlmAnswer
from ..toolcalls import InvalidSchema, ToolCall, ToolSpec, parse_tool_answer

__all__ = ["tool_calls", "tool_choice", "tool_specs"]


def tool_specs(tools: Any) -> list[ToolSpec]:
    """Bound OpenAI-format tools as specs; a malformed one is an InputError."""
    try:
        return [ToolSpec.from_openai(tool) for tool in tools or []]
    except InvalidSchema as exc:
        raise InputError(f"ChatChainrt cannot offer this tool: {exc}") from None


def tool_choice(choice: str | bool | dict[str, Any] | None) -> str:
    """LangChain's ``tool_choice`` spellings as ``auto``/``none``/``required`` or a tool name."""
    if choice is None or choice == "auto":
        return "auto"
    if choice is True or choice in ("any", "required"):
        return "required"
    if choice is False or choice == "none":
        return "none"
    if isinstance(choice, dict):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if isinstance(name, str):
            return name
        raise InputError(f"tool_choice {choice!r} names no function")
    if isinstance(choice, str):
        return choice
    raise InputError(f"tool_choice must be a string, a bool or a dict, not {choice!r}")


def tool_calls(answer: LlmAnswer, tools: list[ToolSpec]) -> tuple[str, list[ToolCall]]:
    """The answer's text and tool calls (none when no tools were bound)."""
    if not tools:
        return answer.text, []
    content, calls = parse_tool_answer(answer.text, tools)
    return content or "", calls
