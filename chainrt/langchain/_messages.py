"""LangChain messages as the ``(role, text)`` pairs of an :class:`~chainrt.dispatch.LlmCall`."""

from __future__ import annotations

import json
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

from .._errors import InputError

__all__ = ["to_chat_pairs", "with_json_instruction", "with_system_text"]

_ROLES = {
    "system": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "ai": "assistant",
    "tool": "tool",
}


_TOOL_BLOCKS = frozenset({"tool_use", "tool_call", "tool_call_chunk"})
"""Content blocks that restate an AI message's tool calls (Anthropic and LangChain v1 forms)."""


def _role(message: BaseMessage) -> str:
    if isinstance(message, SystemMessage):
        return "system"
    if isinstance(message, HumanMessage):
        return "user"
    if isinstance(message, AIMessage):
        return "assistant"
    if isinstance(message, ToolMessage):
        return "tool"
    if isinstance(message, ChatMessage) and message.role.lower() in _ROLES:
        return _ROLES[message.role.lower()]
    raise InputError(
        f"ChatChainrt cannot send a {type(message).__name__} (type {message.type!r}): only "
        "system, human, ai and tool messages"
    )


def _message_text(message: BaseMessage) -> str:
    """The text sent for ``message``; an AI message's tool calls in the form the model made them
    (``{"name": ..., "arguments": {...}}``, one per line) after any text."""
    text = _text(message.content)
    if isinstance(message, AIMessage) and message.tool_calls:
        calls = "\n".join(
            json.dumps({"name": c["name"], "arguments": c["args"]}) for c in message.tool_calls
        )
        return f"{text}\n{calls}" if text else calls
    return text


def _text(content: str | list[Any]) -> str:
    """The text of a message; non-text blocks (images, audio, files) are refused, not dropped."""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        elif isinstance(block, dict) and block.get("type") in _TOOL_BLOCKS:
            continue  # the same call is in the message's tool_calls, sent from there
        else:
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            raise InputError(
                f"ChatChainrt sends text only; a message holds a {kind!r} content block"
            )
    return "".join(parts)


def to_chat_pairs(messages: list[BaseMessage]) -> list[tuple[str, str]]:
    """``(role, text)`` pairs; consecutive messages of one role are joined by a blank line.

    Joining keeps small models' chat templates happy: several of them assume strictly
    alternating roles and a single system message.
    """
    if not messages:
        raise InputError("ChatChainrt needs at least one message")
    pairs: list[tuple[str, str]] = []
    for message in messages:
        role, text = _role(message), _message_text(message)
        if pairs and pairs[-1][0] == role:
            pairs[-1] = (role, f"{pairs[-1][1]}\n\n{text}")
        else:
            pairs.append((role, text))
    return pairs


def with_json_instruction(
    pairs: list[tuple[str, str]], schema: dict[str, Any]
) -> list[tuple[str, str]]:
    """Prepend (or extend) the system message with the JSON schema the answer must follow."""
    instruction = (
        "Reply with one JSON object that matches this JSON schema, and nothing else:\n"
        + json.dumps(schema, ensure_ascii=False, sort_keys=True)
    )
    return with_system_text(pairs, instruction)


def with_system_text(pairs: list[tuple[str, str]], text: str) -> list[tuple[str, str]]:
    """Append ``text`` to the system message (one is added first when there is none)."""
    if pairs and pairs[0][0] == "system":
        return [("system", f"{pairs[0][1]}\n\n{text}"), *pairs[1:]]
    return [("system", text), *pairs]
