"""The dispatch loop: primary, retries and fallbacks, all inside the step's deadline (DESIGN §7).

Decisions (which model next, whether a retry fits) are plain functions of the clock and the
attempt history; the loop only awaits backends and sleeps.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping

from .._errors import DispatchError, NoEndpoint
from .._hooks import NO_HOOKS, Hooks
from ..store._records import AttemptRecord
from ._backend import BackendAnswer, BackendError, ModelBackend
from ._types import LlmAnswer, LlmCall

__all__ = ["MIN_ATTEMPT_S", "DispatchFailed", "Dispatcher"]

MIN_ATTEMPT_S = 0.005
"""An attempt is not started with less time than this left."""


class DispatchFailed(DispatchError):
    """Every model (and the static answer, if any) failed; ``attempts`` says what was tried."""

    def __init__(self, message: str, attempts: list[AttemptRecord]) -> None:
        super().__init__(message, retryable=False)
        self.attempts = attempts


class Dispatcher:
    """Sends LLM calls to model backends, with retries and fallbacks inside a deadline."""

    def __init__(self, backends: Mapping[str, ModelBackend], *, hooks: Hooks = NO_HOOKS) -> None:
        self._backends = dict(backends)
        self._hooks = hooks

    @property
    def models(self) -> list[str]:
        """Model names this dispatcher knows."""
        return sorted(self._backends)

    async def complete(self, call: LlmCall, deadline: float) -> LlmAnswer:
        """Answer ``call`` before ``deadline`` (unix seconds) or raise DispatchFailed."""
        attempts: list[AttemptRecord] = []
        for model in [call.model, *call.fallbacks]:
            answer = await self._try_model(call, model, deadline, attempts)
            if answer is not None:
                return answer
        if call.static_answer is not None:
            attempts.append(
                AttemptRecord(attempt=len(attempts) + 1, model="static", status="ok", elapsed_ms=0)
            )
            return LlmAnswer(
                text=call.static_answer,
                model="static",
                endpoint=None,
                finish_reason="static",
                attempts=attempts,
            )
        tried = "; ".join(f"{a.model}: {a.status} ({a.detail})" for a in attempts) or "nothing"
        raise DispatchFailed(f"no model answered step {call.step_id!r}: {tried}", attempts)

    async def _try_model(
        self, call: LlmCall, model: str, deadline: float, attempts: list[AttemptRecord]
    ) -> LlmAnswer | None:
        backend = self._backends.get(model)
        if backend is None or not backend.available():
            detail = "no endpoint configured" if backend is None else "no healthy endpoint"
            attempts.append(
                AttemptRecord(
                    attempt=len(attempts) + 1,
                    model=model,
                    status="skipped",
                    elapsed_ms=0,
                    detail=detail,
                )
            )
            return None
        max_tokens = call.max_tokens
        backoff_s = call.backoff_ms / 1000
        for try_no in range(1, call.attempts + 1):
            left = deadline - time.time()
            if left < MIN_ATTEMPT_S:
                attempts.append(
                    AttemptRecord(
                        attempt=len(attempts) + 1,
                        model=model,
                        status="skipped",
                        elapsed_ms=0,
                        detail="no time left",
                    )
                )
                return None
            attempt_deadline = deadline
            if call.attempt_timeout_ms is not None:
                attempt_deadline = min(deadline, time.time() + call.attempt_timeout_ms / 1000)
            started = time.perf_counter()
            with self._hooks.span(
                "llm.dispatch",
                {
                    "chainrt.model": model,
                    "chainrt.attempt": try_no,
                    "chainrt.step_id": call.step_id,
                },
            ) as span:
                try:
                    got = await _bounded(
                        backend.complete(call, model, max_tokens, attempt_deadline),
                        attempt_deadline,
                    )
                    _check_answer(call, got)
                except BackendError as exc:
                    span.error(exc)
                    elapsed = (time.perf_counter() - started) * 1000
                    attempts.append(
                        AttemptRecord(
                            attempt=len(attempts) + 1,
                            model=model,
                            endpoint=exc.endpoint,
                            status=exc.error_class,
                            elapsed_ms=round(elapsed, 3),
                            detail=exc.message,
                        )
                    )
                    if exc.advice_max_tokens and call.shrink_on_memory_pressure:
                        max_tokens = max(1, min(max_tokens, exc.advice_max_tokens))
                    wait_s = min(backoff_s, call.max_backoff_ms / 1000)
                    if exc.retry_after_s is not None:
                        wait_s = max(wait_s, exc.retry_after_s)
                    if not exc.retryable or try_no == call.attempts:
                        return None
                    if time.time() + wait_s + MIN_ATTEMPT_S >= deadline:
                        return None  # a retry would not fit: next fallback at once
                    await asyncio.sleep(wait_s)
                    backoff_s *= 2
                    continue
                elapsed = (time.perf_counter() - started) * 1000
                span.set(
                    **{
                        "gen_ai.usage.input_tokens": got.prompt_tokens,
                        "gen_ai.usage.output_tokens": got.completion_tokens,
                    }
                )
            attempts.append(
                AttemptRecord(
                    attempt=len(attempts) + 1,
                    model=model,
                    endpoint=got.endpoint,
                    status="ok" if got.finish_reason != "deadline" else "deadline",
                    elapsed_ms=round(elapsed, 3),
                )
            )
            return LlmAnswer(
                text=got.text,
                model=model,
                endpoint=got.endpoint,
                finish_reason=got.finish_reason,
                prompt_tokens=got.prompt_tokens,
                completion_tokens=got.completion_tokens,
                attempts=attempts,
            )
        return None

    async def close(self) -> None:
        """Close every backend."""
        for backend in self._backends.values():
            await backend.close()


async def _bounded(awaitable: object, deadline: float) -> BackendAnswer:
    """Await a backend attempt, cancelling it at ``deadline`` (backends should stop by then)."""
    assert asyncio.iscoroutine(awaitable)
    try:
        # A little slack: backends stop themselves at the deadline and return partial text.
        return await asyncio.wait_for(awaitable, timeout=max(deadline - time.time(), 0) + 0.05)
    except TimeoutError:
        raise BackendError(
            "attempt ran past the deadline", error_class="timeout", retryable=False
        ) from None


def _check_answer(call: LlmCall, got: BackendAnswer) -> None:
    if got.finish_reason == "deadline" and not call.keep_partial:
        raise BackendError(
            "generation cut off by the deadline",
            error_class="timeout",
            retryable=False,
            endpoint=got.endpoint,
        )
    if call.json_output and got.finish_reason != "deadline":
        try:
            json.loads(got.text)
        except ValueError:
            raise BackendError(
                f"output is not valid JSON: {got.text[:80]!r}",
                error_class="bad_output",
                endpoint=got.endpoint,
            ) from None


def no_endpoint(model: str) -> NoEndpoint:
    """The error for a model with no endpoint at all."""
    return NoEndpoint(f"model {model!r} has no endpoint; add it to the pool file (--pool)")
