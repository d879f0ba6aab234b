"""What the runner hands to dispatch for one LLM step, and what it gets back."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._records import AttemptRecord
from ..wire import Priority

__all__ = ["LlmAnswer", "LlmCall", "Priority"]


@dataclass(slots=True)
class LlmCall:
    """One LLM step, rendered: the models to try in order and the request itself."""

    model: str
    messages: list[tuple[str, str]]
    """(role, content) pairs, already rendered."""
    max_tokens: int = 256
    temperature: float = 0.0
    json_output: bool = False
    json_schema: dict[str, Any] | None = None
    """A JSON Schema the answer must match (constrained decoding at the engine; implies JSON)."""
    stop: list[str] | None = None
    fallbacks: list[str] = field(default_factory=list)
    static_answer: str | None = None
    attempts: int = 1
    """Tries per model (first included); retries happen only while they fit the deadline."""
    backoff_ms: float = 100.0
    max_backoff_ms: float = 5000.0
    attempt_timeout_ms: float | None = None
    keep_partial: bool = False
    """on_timeout: partial — return the text generated so far when the deadline hits."""
    shrink_on_memory_pressure: bool = False
    priority: Priority = "normal"
    hedge_quantile: float | None = None
    """Hedging (``llm.hedge``): start a second attempt on another endpoint of the model when
    the first has not answered after this quantile of its endpoint's recent answer times."""
    hedge_after_ms: float | None = None
    """Hedging with a fixed delay instead of a percentile (``llm.hedge: {after: 250ms}``)."""
    low_confidence_below: float | None = None
    """An answer scored below this counts as a ``low_confidence`` outcome for the endpoint's
    breaker (the step's ``verify.below``; None: the pool model's ``low_confidence_below``)."""
    run_id: str = ""
    step_id: str = ""
    traceparent: str | None = None
    """W3C trace context to send with the request (tracing sets it for each attempt)."""
    attempt: int = 1
    """Number of this attempt within the step (the dispatcher sets it on each attempt's copy)."""
    judged_after_s: float = 0.0
    """A timeout of this attempt counts against its endpoint (its breaker) only when the attempt
    ran at least this long: one cut sooner than the model usually needs (to keep a fallback's
    reserve) says nothing about the endpoint (the dispatcher sets it on each attempt's copy)."""
    trial_s: float | None = None
    """When the endpoint picked for this attempt is a half-open ``timeout`` breaker's trial,
    the attempt is cut after this many seconds (if its own end is later), and a trial cut there
    counts as a timeout against the endpoint (the dispatcher sets it on each attempt's copy:
    :func:`~chainrt.dispatch._policy.trial_span`; None: no cap)."""
    tokens_left: int | None = None
    """Tokens the run may still use (its ``max_tokens_total`` less what it used) when the step
    started; an attempt that may need more is not started (None: no token budget)."""
    on_token: Callable[[str], None] | None = None
    """Set: stream the answer — each piece of generated text is passed here as it arrives (from
    every attempt: after a failed one, the next attempt's text starts over)."""
    on_attempt: Callable[[AttemptRecord], None] | None = None
    """Set: each entry of the attempt log is passed here as soon as it is written."""
    on_endpoint: Callable[[str], None] | None = None
    """Set by the dispatcher on an attempt's copy: the backend tells the endpoint it picked."""
    not_endpoint: str | None = None
    """Set by the dispatcher on a hedge's copy: the endpoint it must not go to (the first's)."""


@dataclass(slots=True)
class LlmAnswer:
    """The answer, who gave it, and every attempt made on the way."""

    text: str
    model: str
    """The model that answered (``static`` for the static answer)."""
    endpoint: str | None
    finish_reason: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    attempts: list[AttemptRecord] = field(default_factory=list)
    confidence: float | None = None
    """The answering model's confidence score in [0, 1]; None when it reported none."""

    @property
    def partial(self) -> bool:
        """True when the deadline cut the generation short."""
        return self.finish_reason == "deadline"
