"""Model engines behind one interface (:class:`Engine`): ``local`` (llama.cpp), ``vllm``, ``torch``.

Only the interface and the llama.cpp engine are re-exported here; importing this package imports
neither llama.cpp, vLLM nor torch (each engine imports its library when it loads its model).

    from workers.engines import get_local_engine, GenerationRequest, ChatMessage
    engine = get_local_engine()          # the process's shared local model, loaded on first use
    result = await engine.generate(GenerationRequest(messages=[ChatMessage("user", "Hi")]))

Every engine decodes into a JSON Schema when asked (``GenerationRequest.json_schema``); the
helpers of :mod:`workers.engines._schema` check schemas and build tool calls on top of that.
"""

from __future__ import annotations

import threading

from ._base import (
    ChatMessage,
    ContextLengthExceeded,
    Engine,
    EngineFaults,
    EngineRetired,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    MemoryStats,
    StreamDelta,
)
from ._llamacpp import LocalEngine
from ._llamacpp_model import resolve_model_path
from ._schema import (
    ANY_JSON_OBJECT,
    InvalidSchema,
    ToolCall,
    ToolSpec,
    check_json_schema,
    parse_tool_answer,
    tool_call_schema,
    tools_instruction,
)

__all__ = [
    "ANY_JSON_OBJECT",
    "ChatMessage",
    "ContextLengthExceeded",
    "Engine",
    "EngineFaults",
    "EngineRetired",
    "FinishReason",
    "GenerationRequest",
    "GenerationResult",
    "InvalidSchema",
    "LocalEngine",
    "MemoryStats",
    "StreamDelta",
    "ToolCall",
    "ToolSpec",
    "check_json_schema",
    "get_local_engine",
    "parse_tool_answer",
    "resolve_model_path",
    "tool_call_schema",
    "tools_instruction",
]

_local_lock = threading.Lock()
_local_engine: LocalEngine | None = None


def get_local_engine() -> LocalEngine:
    """The process-wide ``local`` engine (created on first call; the model loads on first use).

    One llama.cpp model per process: every runner, chain and thread shares it, and its single
    model thread serialises their generations by priority.
    """
    global _local_engine
    with _local_lock:
        if _local_engine is None:
            _local_engine = LocalEngine()
        return _local_engine
