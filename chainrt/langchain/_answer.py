"""An answer from dispatch as LangChain output: a whole ``ChatResult`` or streamed chunks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_core.messages.ai import UsageMetadata
from langchain_core.messages.tool import ToolCall as ToolCallDict
from langchain_core.messages.tool import ToolCallChunk
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult

from ..dispatch import LlmAnswer, LlmCall
from ..toolcalls import ToolSpec
from ._tools import tool_calls

__all__ = ["answer_chunks", "answer_metadata", "answer_usage", "chat_result"]


def answer_usage(answer: LlmAnswer) -> UsageMetadata:
    """The token counts of ``answer`` as LangChain usage metadata."""
    return UsageMetadata(
        input_tokens=answer.prompt_tokens,
        output_tokens=answer.completion_tokens,
        total_tokens=answer.prompt_tokens + answer.completion_tokens,
    )


def answer_metadata(call: LlmCall, answer: LlmAnswer) -> dict[str, Any]:
    """The response metadata of ``answer`` (model, finish reason, endpoint, fallback, attempts)."""
    return {
        "model_name": answer.model,
        "finish_reason": answer.finish_reason,
        "endpoint": answer.endpoint,
        "fallback": answer.model if answer.model != call.model else None,
        "attempts": [a.model_dump(mode="json", exclude_none=True) for a in answer.attempts],
    }


def chat_result(call: LlmCall, answer: LlmAnswer, tools: list[ToolSpec]) -> ChatResult:
    """``answer`` as one LangChain chat result: the text or the tool calls, usage, metadata."""
    text, calls = tool_calls(answer, tools)
    metadata = answer_metadata(call, answer)
    if calls:
        metadata["finish_reason"] = "tool_calls"
    message = AIMessage(
        content=text,
        tool_calls=[
            ToolCallDict(name=c.name, args=c.arguments, id=c.id, type="tool_call") for c in calls
        ],
        usage_metadata=answer_usage(answer),
        response_metadata=metadata,
    )
    usage = {
        "prompt_tokens": answer.prompt_tokens,
        "completion_tokens": answer.completion_tokens,
        "total_tokens": answer.prompt_tokens + answer.completion_tokens,
    }
    return ChatResult(
        generations=[ChatGeneration(message=message)],
        llm_output={"model_name": answer.model, "token_usage": usage},
    )


def answer_chunks(
    call: LlmCall, answer: LlmAnswer, tools: list[ToolSpec]
) -> Iterator[ChatGenerationChunk]:
    """The text (or the tool call), then a closing chunk: usage and metadata appear once, so
    merging adds no twice."""
    text, calls = tool_calls(answer, tools)
    if text or calls:
        yield ChatGenerationChunk(
            message=AIMessageChunk(
                content=text,
                tool_call_chunks=[
                    ToolCallChunk(name=c.name, args=json.dumps(c.arguments), id=c.id, index=i)
                    for i, c in enumerate(calls)
                ],
            )
        )
    metadata = answer_metadata(call, answer)
    if calls:
        metadata["finish_reason"] = "tool_calls"
    yield ChatGenerationChunk(
        message=AIMessageChunk(
            content="",
            usage_metadata=answer_usage(answer),
            response_metadata=metadata,
            chunk_position="last",
        )
    )
