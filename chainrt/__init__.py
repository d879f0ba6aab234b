"""chainrt — a runtime for agent chains that answer inside their latency budget.

import chainrt
chain = chainrt.load("chains/support_agent.yaml")
result = chain.run({"user_id": "u1", "session_id": "s1", "question": "Where is order 1042?"})
result = chainrt.resume(result.run_id)
"""

from __future__ import annotations

from ._chain import Chain, aresume, load, resume
from ._context import StepContext
from ._errors import (
    BudgetError,
    ChainRTError,
    CheckpointError,
    ConcurrencyError,
    ConcurrencyRejected,
    CorruptRecord,
    DispatchError,
    EngineDead,
    EngineOOM,
    FencedOut,
    InputError,
    InsufficientMemory,
    NoEndpoint,
    RecordTooLarge,
    RunLocked,
    RunNotFound,
    SpecError,
    StepError,
    StepTimeout,
    StoreUnavailable,
    TemplateError,
    ToolError,
    WorkerError,
)
from ._result import BudgetSummary, RunResult, StepSummary
from ._settings import Settings

__version__ = "0.1.0"

__all__ = [
    "BudgetError",
    "BudgetSummary",
    "Chain",
    "ChainRTError",
    "CheckpointError",
    "ConcurrencyError",
    "ConcurrencyRejected",
    "CorruptRecord",
    "DispatchError",
    "EngineDead",
    "EngineOOM",
    "FencedOut",
    "InputError",
    "InsufficientMemory",
    "NoEndpoint",
    "RecordTooLarge",
    "RunLocked",
    "RunNotFound",
    "RunResult",
    "Settings",
    "SpecError",
    "StepContext",
    "StepError",
    "StepSummary",
    "StepTimeout",
    "StoreUnavailable",
    "TemplateError",
    "ToolError",
    "WorkerError",
    "__version__",
    "aresume",
    "load",
    "resume",
]
