"""chainrt — a runtime for agent chains that answer inside their latency budget.

import chainrt
chain = chainrt.load("chains/support_agent.yaml")
result = chain.run({"user_id": "u1", "session_id": "s1", "question": "Where is order 1042?"})
result = chainrt.resume(result.run_id)

``import chainrt`` is light: the error tree (:mod:`chainrt.errors`) is imported at once, everything
else (the runner, pydantic, the store drivers, httpx) on first use of its name (PEP 562), so the
CLI, the workers and ``chainrt.errors``/``chainrt.wire`` users pay only for what they touch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .errors import (
    BackendError,
    BudgetError,
    ChainRTError,
    CheckpointError,
    ConcurrencyError,
    ConcurrencyRejected,
    ContextLengthExceeded,
    CorruptRecord,
    DispatchError,
    DispatchFailed,
    EngineDead,
    EngineOOM,
    FencedOut,
    InputError,
    InsufficientMemory,
    LeaseReleased,
    NoEndpoint,
    RecordTooLarge,
    RunLocked,
    RunNotFound,
    SignalRefused,
    SpecError,
    StepError,
    StoreUnavailable,
    TemplateError,
    ToolError,
    UntrustedRecord,
    WorkerError,
)

if TYPE_CHECKING:
    from ._chain import Chain, aresume, load, resume
    from ._context import StepContext
    from ._events import RunEvent
    from ._result import BudgetSummary, RunResult, StepSummary
    from ._runtime import Runtime
    from ._settings import Settings

_LAZY = {
    "Chain": "._chain",
    "aresume": "._chain",
    "load": "._chain",
    "resume": "._chain",
    "StepContext": "._context",
    "RunEvent": "._events",
    "Runtime": "._runtime",
    "BudgetSummary": "._result",
    "RunResult": "._result",
    "StepSummary": "._result",
    "Settings": "._settings",
}
"""Public names imported on first use, and the module that defines each."""

__all__ = [
    "BackendError",
    "BudgetError",
    "BudgetSummary",
    "Chain",
    "ChainRTError",
    "CheckpointError",
    "ConcurrencyError",
    "ConcurrencyRejected",
    "ContextLengthExceeded",
    "CorruptRecord",
    "DispatchError",
    "DispatchFailed",
    "EngineDead",
    "EngineOOM",
    "FencedOut",
    "InputError",
    "InsufficientMemory",
    "LeaseReleased",
    "NoEndpoint",
    "RecordTooLarge",
    "RunEvent",
    "RunLocked",
    "RunNotFound",
    "RunResult",
    "Runtime",
    "Settings",
    "SignalRefused",
    "SpecError",
    "StepContext",
    "StepError",
    "StepSummary",
    "StoreUnavailable",
    "TemplateError",
    "ToolError",
    "UntrustedRecord",
    "WorkerError",
    "__version__",
    "aresume",
    "load",
    "resume",
]


def __getattr__(name: str) -> Any:
    """Import a lazy public name on first use (and keep it, so the next use is a plain lookup)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'chainrt' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """Every public name, the lazy ones included (for completion and ``help``)."""
    return sorted(set(globals()) | set(__all__))
