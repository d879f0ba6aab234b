"""Model backends: where one model's requests go (in-process engine, or a pool of HTTP workers)."""

from __future__ import annotations

import abc
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import BackendError, WorkerError
from ..wire import PRIORITIES
from ._latency import Sample
from ._types import LlmCall

__all__ = ["BackendAnswer", "BackendError", "LocalBackend", "ModelBackend", "TextSink"]

TextSink = Callable[[str], None]
"""Receives each piece of generated text as it arrives (a streamed attempt)."""


@dataclass(frozen=True, slots=True)
class BackendAnswer:
    """Text from one backend attempt."""

    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    endpoint: str | None = None
    confidence: float | None = None
    """The worker's ``confidence_score`` (None when it sent none)."""
    prefill_ms: float | None = None
    decode_ms: float | None = None
    queue_ms: float | None = None
    """Time the worker kept the request waiting for an engine slot."""
    admission_ms: float | None = None
    """Time the worker's memory admission took."""
    cached_tokens: int | None = None
    """Prompt tokens the server took from its cache (None: not reported)."""
    cost: float | None = None
    """What the tokens cost at the pool's ``price`` for the model (None: no price)."""


class ModelBackend(abc.ABC):
    """Serves one model name."""

    @abc.abstractmethod
    def available(self) -> bool:
        """False when the model has no usable endpoint right now (skip it at once)."""

    def usable_elsewhere(self, avoid: frozenset[str]) -> bool:
        """True when an endpoint other than those in ``avoid`` could take a request now.

        A backend with a single place to send requests (the in-process model) has no elsewhere.
        """
        return False

    def usable_count(self, avoid: frozenset[str]) -> int:
        """How many endpoints outside ``avoid`` could take a request now."""
        return 1 if self.available() else 0

    def least_in_flight(self, avoid: frozenset[str]) -> int | None:
        """Requests in flight on the least busy usable endpoint outside ``avoid`` (None: the
        backend does not count them; the dispatcher's count of the model's attempts stands in)."""
        return None

    def busiest_in_flight(self, avoid: frozenset[str]) -> int:
        """Requests in flight on the busiest usable endpoint outside ``avoid``: what a retry on
        another endpoint than the least busy one may find ahead of it (0: not counted)."""
        return 0

    def places(self) -> int:
        """How many places requests go to (endpoints); 1 for the in-process model.

        With one place, a timed-out attempt tells about the model itself (its latency figures
        take it in); with several, it may only tell about one endpoint (a hung one).
        """
        return 1

    def why_unavailable(self) -> str:
        """Why :meth:`available` is False, for the attempt log."""
        return "no usable endpoint"

    @abc.abstractmethod
    async def complete(
        self,
        call: LlmCall,
        model: str,
        max_tokens: int,
        deadline: float,
        *,
        avoid: frozenset[str] = frozenset(),
        on_text: TextSink | None = None,
    ) -> BackendAnswer:
        """One attempt, stopping at ``deadline`` (unix seconds). BackendError on failure.

        ``avoid`` names endpoints that already failed during this step: pick another one when
        there is one. With ``on_text`` the answer is streamed: each piece of text goes to it as
        it is generated, and the returned answer holds the whole text.
        """

    async def prepare(self) -> None:
        """Pay one-time costs (loading a model) before a run's budget clock starts."""
        return None

    def context_window(self) -> int | None:
        """Tokens the model's context holds (prompt + answer); None when unknown."""
        return None

    def baseline(self) -> tuple[Sample, ...]:
        """Answers measured when the model was loaded (by :meth:`prepare`); empty when none.

        Dispatch expects this model's latency from them until real answers arrive.
        """
        return ()

    async def close(self) -> None:
        """Release connections."""
        return None


CALIBRATION_PROMPT = "Count from one to twenty, separated by commas."
CALIBRATION_TOKENS = 16
"""The generation measured when the local model loads: short, deterministic, a typical rate."""

_calibrations: dict[int, tuple[Sample, ...]] = {}
"""Measured baselines by ``id(engine)``: the process-wide engine is measured once."""


class LocalBackend(ModelBackend):
    """The in-process small model (SmolLM2 on llama.cpp), loaded lazily on first use.

    :meth:`prepare` loads it and, the first time, measures one short generation (after a
    one-token warm-up): its latency is the model's :meth:`baseline`, so that a step's reserve
    for the local fallback is sized before the model has answered any real request.
    """

    def available(self) -> bool:
        return True

    async def prepare(self) -> None:
        from ..engines import get_local_engine

        engine = get_local_engine()
        try:
            await engine.start()
            if id(engine) not in _calibrations:
                _calibrations[id(engine)] = await _measure(engine)
        except WorkerError as exc:
            raise BackendError(
                f"local model failed to load: {exc.message}", error_class="engine", retryable=False
            ) from exc

    def baseline(self) -> tuple[Sample, ...]:
        from ..engines import get_local_engine

        return _calibrations.get(id(get_local_engine()), ())

    def context_window(self) -> int | None:
        from ..engines import get_local_engine

        return int(get_local_engine().context_tokens)

    async def complete(
        self,
        call: LlmCall,
        model: str,
        max_tokens: int,
        deadline: float,
        *,
        avoid: frozenset[str] = frozenset(),
        on_text: TextSink | None = None,
    ) -> BackendAnswer:
        from ..engines import ChatMessage, GenerationRequest, get_local_engine

        request = GenerationRequest(
            messages=[ChatMessage(role, content) for role, content in call.messages],
            max_tokens=max_tokens,
            temperature=call.temperature,
            stop=call.stop,
            json_output=call.json_output,
            json_schema=call.json_schema,
            deadline=deadline,
            priority=PRIORITIES[call.priority],
            request_id=f"{call.run_id}:{call.step_id}",
        )
        try:
            engine = get_local_engine()
            await engine.start()
            if on_text is None:
                result = await engine.generate(request)
            else:
                result = await _streamed(engine, request, on_text)
        except WorkerError as exc:
            raise BackendError(
                f"local model failed: {exc.message}", error_class="engine", retryable=exc.retryable
            ) from exc
        return BackendAnswer(
            text=result.text,
            finish_reason=result.finish_reason,
            prompt_tokens=result.prompt_tokens,
            completion_tokens=result.completion_tokens,
            endpoint="in-process",
            confidence=result.confidence,
            prefill_ms=result.prefill_ms,
            decode_ms=result.decode_ms,
        )


async def _streamed(engine: Any, request: Any, on_text: TextSink) -> Any:
    """Generate piece by piece, each piece to ``on_text``; the whole result at the end."""
    async for delta in engine.stream(request):
        if delta.text:
            on_text(delta.text)
        if delta.result is not None:
            return delta.result
    raise WorkerError("the local engine ended a stream without a result")


async def _measure(engine: Any) -> tuple[Sample, ...]:
    """One warm-up token, then the calibration generation, timed."""
    from ..engines import ChatMessage, GenerationRequest

    def request(max_tokens: int) -> Any:
        return GenerationRequest(
            messages=[ChatMessage("user", CALIBRATION_PROMPT)],
            max_tokens=max_tokens,
            request_id="chainrt-calibration",
        )

    await engine.generate(request(1))
    started = time.perf_counter()
    result = await engine.generate(request(CALIBRATION_TOKENS))
    seconds = time.perf_counter() - started
    return (Sample(seconds, result.prompt_tokens, result.completion_tokens),)
