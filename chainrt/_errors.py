"""The exceptions chainrt raises, all rooted at :class:`ChainRTError`.

The tree::

    ChainRTError                      anything chainrt raises on purpose
    ├── SpecError                     a chain YAML (or dict) is invalid: file, line, field
    ├── InputError                    a run's input does not match the chain's declared inputs
    ├── TemplateError                 a ``{{ ... }}`` template cannot be parsed or rendered
    ├── BudgetError                   a budget or duration is unusable (e.g. zero or negative)
    ├── StepError                     a step failed: which step, which attempt, why
    │   ├── StepTimeout               a step ran past its allotment
    │   └── ToolError                 a tool raised, or cannot be imported
    ├── ConcurrencyError              a concurrency key could not be taken
    │   └── ConcurrencyRejected       ... within the time the budget left (run ends ``rejected``)
    ├── CheckpointError               the checkpoint store cannot do what was asked
    │   ├── StoreUnavailable          the store cannot be reached (names the URL)
    │   ├── RunNotFound               no run with this id in this store
    │   ├── RunLocked                 the run's owner is alive; resuming would double-run it
    │   ├── FencedOut                 this process lost ownership of the run (fencing token)
    │   ├── RecordTooLarge            a record is over the store's size limit
    │   └── CorruptRecord             a stored record does not parse; nothing was loaded from it
    ├── DispatchError                 no model endpoint could answer an LLM step
    │   └── NoEndpoint                the model has no usable endpoint at all
    └── WorkerError                   an inference worker or engine failed
        ├── EngineOOM                 the engine ran out of (GPU) memory on one request
        ├── EngineDead                the engine is gone and must be restarted
        └── InsufficientMemory        admission refused a request for lack of memory

Every message says what happened, to what, and what to do next. Errors carry retry semantics as
data (``retryable``), so retry policies need no ``isinstance`` ladders.
"""

from __future__ import annotations

__all__ = [
    "BudgetError",
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
    "SpecError",
    "StepError",
    "StepTimeout",
    "StoreUnavailable",
    "TemplateError",
    "ToolError",
    "WorkerError",
]


class ChainRTError(Exception):
    """Root of every error chainrt raises on purpose.

    ``retryable`` tells retry policies whether trying the same thing again may help.
    """

    retryable: bool = False

    def __init__(self, message: str, *, retryable: bool | None = None) -> None:
        super().__init__(message)
        self.message = message
        if retryable is not None:
            self.retryable = retryable


class SpecError(ChainRTError):
    """A chain definition is invalid. ``str()`` reads ``file:line: field: problem``."""

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        field: str | None = None,
    ) -> None:
        self.file = file
        self.line = line
        self.field = field
        where = file or "<chain>"
        if line is not None:
            where = f"{where}:{line}"
        prefix = f"{where}: {field}: " if field else f"{where}: "
        super().__init__(prefix + message)


class InputError(ChainRTError):
    """The input given to a run does not match the chain's ``inputs`` (nothing was run)."""


class TemplateError(ChainRTError):
    """A ``{{ ... }}`` template is malformed or names something that does not exist."""


class BudgetError(ChainRTError):
    """A budget or duration value is unusable."""


class StepError(ChainRTError):
    """A step failed after all its attempts and fallbacks."""

    def __init__(
        self, message: str, *, step_id: str | None = None, retryable: bool | None = None
    ) -> None:
        super().__init__(message, retryable=retryable)
        self.step_id = step_id


class StepTimeout(StepError):
    """A step ran past its allotment and was cut off."""


class ToolError(StepError):
    """A tool raised an exception or could not be imported."""


class ConcurrencyError(ChainRTError):
    """A concurrency key could not be used."""


class ConcurrencyRejected(ConcurrencyError):
    """A concurrency key could not be taken within the remaining budget."""

    def __init__(self, message: str, *, key: str, waited_ms: float) -> None:
        super().__init__(message)
        self.key = key
        self.waited_ms = waited_ms


class CheckpointError(ChainRTError):
    """The checkpoint store failed."""


class StoreUnavailable(CheckpointError):
    """The store cannot be reached; the message names the URL (without password)."""

    retryable = True


class RunNotFound(CheckpointError):
    """No run with the given id exists in the store."""


class RunLocked(CheckpointError):
    """The run is owned by a live process; resuming it now would run steps twice."""


class FencedOut(CheckpointError):
    """Another process took the run over; this process must stop writing to it."""


class RecordTooLarge(CheckpointError):
    """A record exceeds the store's size limit; it was refused, not truncated."""


class CorruptRecord(CheckpointError):
    """A stored record could not be parsed."""


class DispatchError(ChainRTError):
    """No endpoint or fallback could answer an LLM request in time."""

    retryable = True


class NoEndpoint(DispatchError):
    """The model has no configured or healthy endpoint."""


class WorkerError(ChainRTError):
    """An inference engine or worker failed."""


class EngineOOM(WorkerError):
    """The engine ran out of memory serving one request; the worker recovers in process."""

    retryable = True


class EngineDead(WorkerError):
    """The engine died and must be restarted before it serves again."""

    retryable = True


class InsufficientMemory(WorkerError):
    """Admission control refused a request: it would not fit in free memory now."""

    retryable = True

    def __init__(self, message: str, *, advice_max_tokens: int, retry_after_s: float) -> None:
        super().__init__(message)
        self.advice_max_tokens = advice_max_tokens
        self.retry_after_s = retry_after_s
