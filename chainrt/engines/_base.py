"""The engine interface: what the runner's in-process ``local`` model and the worker service use.

An engine turns a :class:`GenerationRequest` into text. It raises ``chainrt.EngineOOM`` when one
request ran out of memory (only that request fails) and ``chainrt.EngineDead`` when the engine
itself is gone; the worker service then calls :meth:`Engine.recover`. Engines are async at the
surface; CPU- or GPU-bound work runs in a thread or the engine's own process. Every engine honours
the request's deadline: generation stops at it and returns what it has,
``finish_reason == "deadline"``.
"""

from __future__ import annotations

import abc
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import ContextLengthExceeded, WorkerError

__all__ = [
    "ChatMessage",
    "ContextLengthExceeded",
    "Engine",
    "EngineFaults",
    "EngineRetired",
    "FinishReason",
    "GenerationRequest",
    "GenerationResult",
    "MemoryStats",
    "StreamDelta",
]

FinishReason = Literal["stop", "length", "deadline", "abort"]


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One chat message."""

    role: str
    content: str


@dataclass(slots=True)
class GenerationRequest:
    """One generation: either chat ``messages`` or a raw ``prompt`` (completions API)."""

    messages: list[ChatMessage] | None = None
    prompt: str | None = None
    max_tokens: int = 256
    temperature: float = 0.0
    stop: list[str] | None = None
    json_output: bool = False
    """Constrain the answer to JSON: to ``json_schema`` when given, else to any JSON object."""
    json_schema: dict[str, Any] | None = None
    """A JSON Schema the answer must match (checked by :func:`check_json_schema` beforehand)."""
    deadline: float | None = None
    """Unix time (seconds) at which generation must stop."""
    priority: int = 0
    """Lower runs first (critical=0, high=1, normal=2, low=3); engines may ignore it."""
    request_id: str = ""
    seed: int | None = None

    @property
    def constrained(self) -> bool:
        """True when decoding is constrained to JSON (``json_output`` or a ``json_schema``)."""
        return self.json_output or self.json_schema is not None

    def seconds_left(self) -> float | None:
        """Seconds until the deadline (None when there is none; may be negative)."""
        return None if self.deadline is None else self.deadline - time.time()


@dataclass(frozen=True, slots=True)
class GenerationResult:
    """The text and why it ended, with token counts."""

    text: str
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    confidence: float | None = None
    """The answer's confidence score in [0, 1] (:mod:`chainrt.engines._confidence`); None when
    the engine could not tell (no token generated)."""
    prefill_ms: float | None = None
    """Time spent evaluating the prompt, up to the first generated token."""
    decode_ms: float | None = None
    """Time spent generating tokens after the first."""


@dataclass(frozen=True, slots=True)
class StreamDelta:
    """A piece of streamed text; the last one carries ``result`` (the whole generation)."""

    text: str
    result: GenerationResult | None = None


@dataclass(frozen=True, slots=True)
class MemoryStats:
    """Memory an engine can still give to requests, for admission control."""

    total_bytes: int
    free_bytes: int
    kv_bytes_per_token: int
    extra: dict[str, float] = field(default_factory=dict)


class EngineFaults:
    """Fault hooks an engine consults where a real failure would surface (thread-safe).

    The worker's fault injection (``--enable-fault-injection``) arms them; an engine calls
    :meth:`take_oom` right where its own out-of-memory error would be raised and, when it returns
    True, raises that engine's *native* out-of-memory error there, so the injected fault travels
    through exactly the same ``except`` branch as a real one. Unarmed, the check is one lock-free
    integer test.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._oom = 0

    def arm_oom(self, count: int) -> None:
        """Make the next ``count`` generations hit an out-of-memory error (0 disarms)."""
        with self._lock:
            self._oom = max(0, count)

    @property
    def pending_oom(self) -> int:
        """How many injected out-of-memory errors are still armed."""
        return self._oom

    def take_oom(self) -> bool:
        """True (and one fewer armed) when this generation must fail with an OOM."""
        if self._oom <= 0:  # fast path: faults off
            return False
        with self._lock:
            if self._oom <= 0:
                return False
            self._oom -= 1
            return True

    def reset(self) -> None:
        """Disarm every fault."""
        with self._lock:
            self._oom = 0


class EngineRetired(WorkerError):
    """A hot reload retired this engine before the request's generation started.

    Nothing was generated; the worker runs the request again on the engine that replaced this
    one (:meth:`Engine.retire`), so a client never sees it.
    """

    retryable = True


class Engine(abc.ABC):
    """A loaded model that generates text. One engine per process (or per worker)."""

    name: str
    """Engine kind: ``local``, ``vllm`` or ``torch``."""
    model_name: str
    """The model name it serves (what ``/v1/models`` lists)."""

    @property
    def faults(self) -> EngineFaults:
        """The fault hooks of this engine (created on first use; subclasses need no __init__)."""
        hooks: EngineFaults | None = self.__dict__.get("_engine_faults")
        if hooks is None:
            hooks = self.__dict__.setdefault("_engine_faults", EngineFaults())
        return hooks

    @abc.abstractmethod
    async def start(self) -> None:
        """Load the model. Idempotent."""

    async def warm_like(self, serving: Engine) -> None:
        """Before a hot reload's swap: bring this engine's caches to where ``serving``'s are.

        Without it the first requests after the swap meet a cold cache the old engine did not
        have (a prompt prefix evaluated again). Best effort; the default does nothing.
        """
        del serving  # nothing to carry over by default

    def retire(self) -> int:
        """A hot reload swapped this engine out: hand back what has not started generating.

        From now on every generation this engine has not started yet (queued now, or asked for
        later) fails at once with :class:`EngineRetired`, so the worker can run it on the new
        engine; generations already under way finish here. Returns how many queued generations
        were handed back now. The default (an engine with no queue of its own, vLLM's scheduler
        say) hands back nothing.
        """
        return 0

    @abc.abstractmethod
    async def close(self) -> None:
        """Free the model and its memory."""

    @abc.abstractmethod
    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Generate the whole answer (stops at the deadline with what it has)."""

    @abc.abstractmethod
    def stream(self, request: GenerationRequest) -> AsyncIterator[StreamDelta]:
        """Generate piece by piece; the final delta carries the result."""

    @abc.abstractmethod
    def count_tokens(self, request: GenerationRequest) -> int:
        """Prompt tokens this request would use (after the chat template)."""

    def check_request(self, request: GenerationRequest) -> None:
        """Raise WorkerError for a request this engine can never serve (default: accept all).

        Called before the request queues, so a bad one (a schema the engine cannot compile, say)
        fails at once; ``stream`` checks again.
        """
        return None

    def memory(self) -> MemoryStats | None:
        """Memory figures for admission control; None when the engine cannot tell."""
        return None

    def state(self) -> dict[str, Any]:
        """Engine-specific facts for ``/health/ready`` (vLLM: engine core pids, standby)."""
        return {}

    def recovery_estimate_s(self) -> float | None:
        """Seconds a rebuild by :meth:`recover` is expected to take (None: no idea; quick).

        The worker sizes ``Retry-After`` with it until it has timed a recovery of its own.
        """
        return None

    async def recover(self) -> None:
        """Bring the engine back after EngineOOM/EngineDead: free memory, restart what died.

        Called by the worker service while it reports not-ready; the default does nothing.
        """
        return None
