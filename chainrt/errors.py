"""The exceptions chainrt raises, all rooted at :class:`ChainRTError` (public, light).

``import chainrt.errors`` imports nothing but the standard library: the workers, a web backend or
a test can catch chainrt's errors without loading the runtime. ``chainrt`` re-exports every name.

The tree::

    ChainRTError                      anything chainrt raises on purpose
    ├── SpecError                     a chain YAML (or dict) is invalid: file, line, field
    ├── InputError                    a run's input does not match the chain's declared inputs
    ├── TemplateError                 a ``{{ ... }}`` template cannot be parsed or rendered
    ├── BudgetError                   a budget or duration is unusable (e.g. zero or negative)
    ├── StepError                     a step failed: which step, which attempt, why
    │   ├── ToolError                 a tool raised, or cannot be imported
    │   └── RunIncomplete             (chainrt.langchain) a Runnable's chain run did not complete
    ├── UnknownChain                  (chainrt.serve) no chain of that name is served here (404)
    ├── Draining                      (chainrt.serve) the runner is shutting down; the run is handed over
    ├── BadCursor                     (chainrt.serve) a runs-list cursor the API did not hand out
    ├── PoisonEntry                   (chainrt.serve._handling) a queue entry no runner can handle (dead-lettered)
    ├── SignalRefused                 a signal its run cannot take: unknown name, bad payload, run ended
    ├── BadCall                       (chainrt.agent._tools) an agent's proposed call cannot run; told to the model
    ├── ConcurrencyError              a concurrency key could not be taken
    │   └── ConcurrencyRejected       ... within the time the budget left (run ends ``rejected``)
    ├── CheckpointError               the checkpoint store cannot do what was asked
    │   ├── StoreUnavailable          the store cannot be reached (names the URL)
    │   ├── RunNotFound               no run with this id in this store
    │   ├── RunLocked                 the run's owner is alive; resuming would double-run it
    │   ├── FencedOut                 this process lost ownership of the run (fencing token)
    │   │   └── LeaseReleased         its lease is gone with its own token: its final commit landed
    │   ├── RecordTooLarge            a record is over the store's size limit
    │   ├── CorruptRecord             a stored record does not parse; nothing was loaded from it
    │   └── UntrustedRecord           a stored run this runner will not execute (chain roots, HMAC)
    ├── DispatchError                 an LLM request could not be answered
    │   ├── BackendError              one attempt at one backend failed; ``error_class`` says how
    │   │   └── InsufficientMemory    a worker's admission refused it for lack of memory (429)
    │   └── DispatchFailed            every model, retry and fallback failed; ``attempts`` says so
    │       └── NoEndpoint            no model of the step had an endpoint to try at all
    └── WorkerError                   an inference worker or engine failed
        ├── EngineOOM                 the engine ran out of (GPU) memory on one request
        ├── EngineDead                the engine is gone and must be restarted
        │   ├── CoreKilled            (chainrt.engines._vllm_support) a signal ended vLLM's core under it
        │   └── CoreFailedElsewhere   (chainrt.engines._vllm_support) vLLM's core failed on another request
        ├── EngineRetired             (chainrt.engines) a hot reload replaced the engine before the request started
        └── ContextLengthExceeded     the prompt can never fit the engine's context window

A step that runs past its allotment raises nothing: it is recorded as ``timed_out`` in the run's
result, which then ends ``partial`` or ``failed`` (docs/chain-format.md, Budget).

Every message says what happened, to what, and what to do next. Errors carry retry semantics as
data (``retryable``), so retry policies need no ``isinstance`` ladders.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._records import AttemptRecord

__all__ = [
    "BackendError",
    "BudgetError",
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
    "RunLocked",
    "RunNotFound",
    "SignalRefused",
    "SpecError",
    "StepError",
    "StoreUnavailable",
    "TemplateError",
    "ToolError",
    "UntrustedRecord",
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


class ToolError(StepError):
    """A tool raised an exception or could not be imported."""


class SignalRefused(ChainRTError):
    """A signal was refused and nothing was kept: its run's chain has no ``wait`` for that name,
    its payload does not match the wait's schema, or the run has ended. ``conflict`` is True
    when the run cannot take it whatever the payload (HTTP 409; else 422)."""

    def __init__(self, message: str, *, conflict: bool = False) -> None:
        super().__init__(message)
        self.conflict = conflict


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


class LeaseReleased(FencedOut):
    """The run's owner lease is gone though its fencing token is still this process's: the
    process's own final commit (or release) landed, e.g. while its reply was lost in a
    failover. Nothing is left to renew, and nobody took the run over."""


class RecordTooLarge(CheckpointError):
    """A record exceeds the store's size limit; it was refused, not truncated."""


class CorruptRecord(CheckpointError):
    """A stored record could not be parsed."""


class UntrustedRecord(CheckpointError):
    """A stored run names code this runner will not execute: a chain folder outside its chain
    roots, a reference it refuses, or a record whose signature (``CHAINRT_RECORD_KEY``) does not
    match. Nothing of the run was claimed or changed (docs/security.md)."""


class DispatchError(ChainRTError):
    """An LLM request could not be answered (by one backend, or by any model in time)."""

    retryable = True


class BackendError(DispatchError):
    """One attempt at one backend failed.

    ``error_class`` groups causes for the endpoint's circuit breakers and the retry decision:
    ``connect``, ``timeout``, ``5xx``, ``oom``, ``overloaded`` (the breaker classes), or
    ``bad_request``, ``unavailable``, ``engine``, ``bad_output``, ``skipped``.
    ``retry_after_s`` is the server's hint; ``advice_max_tokens`` a size the worker would admit.
    """

    def __init__(
        self,
        message: str,
        *,
        error_class: str,
        retryable: bool = True,
        retry_after_s: float | None = None,
        endpoint: str | None = None,
        advice_max_tokens: int | None = None,
    ) -> None:
        super().__init__(message, retryable=retryable)
        self.error_class = error_class
        self.retry_after_s = retry_after_s
        self.endpoint = endpoint
        self.advice_max_tokens = advice_max_tokens


class InsufficientMemory(BackendError):
    """A worker's admission refused the request: it would not fit in free memory now.

    The worker's ``429`` ``insufficient_memory`` answer (:mod:`chainrt.wire`): ask for at most
    ``advice_max_tokens`` now, or retry the same request after ``retry_after_s``.
    """

    def __init__(
        self,
        message: str,
        *,
        advice_max_tokens: int | None,
        retry_after_s: float | None,
        endpoint: str | None = None,
    ) -> None:
        super().__init__(
            message,
            error_class="overloaded",
            retry_after_s=retry_after_s,
            endpoint=endpoint,
            advice_max_tokens=advice_max_tokens,
        )


class DispatchFailed(DispatchError):
    """Every model (and the static answer, if any) failed; ``attempts`` says what was tried."""

    def __init__(self, message: str, attempts: list[AttemptRecord]) -> None:
        super().__init__(message, retryable=False)
        self.attempts = attempts


class NoEndpoint(DispatchFailed):
    """No model of the step (primary or fallback) had an endpoint to try: nothing was sent.

    The models are missing from the pool, or every endpoint is unhealthy or circuit-open;
    ``attempts`` names each model and why it was skipped.
    """


class WorkerError(ChainRTError):
    """An inference engine or worker failed."""


class EngineOOM(WorkerError):
    """The engine ran out of memory serving one request; the worker recovers in process."""

    retryable = True


class EngineDead(WorkerError):
    """The engine died and must be restarted before it serves again."""

    retryable = True


class ContextLengthExceeded(WorkerError):
    """A prompt (plus at least one generated token) can never fit the engine's context window.

    Not retryable: the same request fails the same way; the caller must shorten the prompt.
    """

    def __init__(self, message: str, *, prompt_tokens: int, context_tokens: int) -> None:
        super().__init__(message, retryable=False)
        self.prompt_tokens = prompt_tokens
        self.context_tokens = context_tokens
