"""Model engines behind one interface (:class:`Engine`): ``local`` (llama.cpp), ``vllm``, ``torch``.

A layer of its own below the runtime (docs/architecture.md): the runtime's in-process ``local``
model (:mod:`chainrt.dispatch`) and the worker server (``workers.server``) both stand on it, and
it imports nothing of chainrt but the bottom layer (:mod:`chainrt.errors`, :mod:`chainrt.toolcalls`
and the settings). Only the interface and the llama.cpp engine are re-exported here; importing
this package imports neither llama.cpp, vLLM nor torch (each engine imports its library when it
loads its model, and :func:`engine_class` imports only the module of the kind asked for).

    from chainrt.engines import get_local_engine, GenerationRequest, ChatMessage
    engine = get_local_engine()          # the process's shared local model, loaded on first use
    result = await engine.generate(GenerationRequest(messages=[ChatMessage("user", "Hi")]))

Every engine decodes into a JSON Schema when asked (``GenerationRequest.json_schema``); the
helpers of :mod:`chainrt.toolcalls` check schemas and build tool calls on top of that.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

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

__all__ = [
    "ENGINES",
    "ChatMessage",
    "ContextLengthExceeded",
    "Engine",
    "EngineFaults",
    "EngineRetired",
    "FinishReason",
    "GenerationRequest",
    "GenerationResult",
    "LocalEngine",
    "MemoryStats",
    "StreamDelta",
    "create_engine",
    "engine_class",
    "get_local_engine",
    "resolve_model_path",
]

ENGINES: dict[str, str] = {
    "local": "chainrt.engines._llamacpp:LocalEngine",
    "vllm": "chainrt.engines._vllm:VllmEngine",
    "torch": "chainrt.engines._torch:TorchEngine",
}
"""Engine kind → ``module:class``; each class takes ``model`` / ``model_name`` keywords."""


def engine_class(kind: str) -> type[Engine]:
    """The engine class of ``kind`` (a key of :data:`ENGINES`), importing only its module.

    Raises KeyError for an unknown kind, and ImportError when the kind's library (its extra:
    llama-cpp-python, vllm, torch) is not installed.
    """
    module_name, _, class_name = ENGINES[kind].partition(":")
    cls: type[Engine] = getattr(importlib.import_module(module_name), class_name)
    return cls


def create_engine(
    kind: str,
    model: str | None = None,
    *,
    model_name: str | None = None,
    max_model_len: int | None = None,
    standby: bool = False,
    dtype: str = "auto",
) -> Engine:
    """Create (not start) an engine of ``kind``: ``model`` and the options in its own keywords.

    ``model`` is a GGUF path (``local``) or a model id/folder (``vllm``, ``torch``); None is the
    engine's default. ``standby`` (vllm only) keeps a warm standby engine core; ``dtype`` (vllm,
    torch): ``auto`` is float32 on a CPU and bfloat16 on a GPU. Raises as :func:`engine_class`.
    """
    kwargs: dict[str, Any] = {}
    if model_name:
        kwargs["model_name"] = model_name
    if max_model_len is not None:
        kwargs["n_ctx" if kind == "local" else "max_model_len"] = max_model_len
    if standby:
        kwargs["standby"] = True
    if dtype != "auto":
        kwargs["dtype"] = dtype
    if kind == "local":
        kwargs["model_path"] = model
    elif model is not None:
        kwargs["model"] = model
    return engine_class(kind)(**kwargs)


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
