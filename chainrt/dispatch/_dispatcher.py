"""The dispatch loop: primary, retries and fallbacks, all inside the step's deadline (DESIGN §7).

For each model in ``[call.model, *call.fallbacks]`` the loop asks the pure functions of
:mod:`._policy` and :mod:`._latency` what to do — skip the model (no usable endpoint, or its
expected median for this request's size cannot fit the time left), when to cut this attempt
(keeping the next fallback's expected time in reserve: measured at load for the in-process model,
then refreshed by its answers), and after a failure whether a retry fits (tenacity drives the retries, the decision is
:func:`~._policy.decide_retry`). It only awaits backends and sleeps. Every attempt lands in the
attempt log with its endpoint, status, milliseconds and why the loop moved on; the static answer,
when the step has one, closes the list.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import Mapping

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type

from ..errors import BackendError, DispatchFailed
from ..store._records import AttemptRecord
from ._backend import BackendAnswer, ModelBackend, TextSink
from ._checks import bounded, check_answer, worth_saving_for
from ._hedge import log_pair, run_hedged, wants_hedge
from ._hops import answer_hops
from ._latency import LatencyTracker, estimate_prompt_tokens, too_slow
from ._outcome import no_answer, skip, static_answer
from ._policy import (
    MIN_ATTEMPT_S,
    ContextFit,
    Failure,
    MoveOn,
    NextCandidate,
    Retry,
    attempt_end,
    decide_retry,
    fallback_need,
    fit_context,
    judged_after,
    next_tried,
    queued_out,
    reserve_for,
    trial_span,
    worth_starting,
)
from ._types import LlmAnswer, LlmCall

__all__ = ["MIN_ATTEMPT_S", "DispatchFailed", "Dispatcher"]


class Dispatcher:
    """Sends LLM calls to model backends, with retries and fallbacks inside a deadline."""

    def __init__(
        self,
        backends: Mapping[str, ModelBackend],
        *,
        latency: LatencyTracker | None = None,
    ) -> None:
        self._backends = dict(backends)
        self._in_flight: dict[str, int] = {}
        self.latency = latency or LatencyTracker()
        """Recent answer times per model and per ``model@endpoint``, with their sizes (the
        expected median decides skips and stuck cuts, the 90th percentile reserves)."""

    @property
    def models(self) -> list[str]:
        """Model names this dispatcher knows."""
        return sorted(self._backends)

    def backend(self, model: str) -> ModelBackend | None:
        """The backend serving ``model`` (None when unknown)."""
        return self._backends.get(model)

    async def complete(self, call: LlmCall, deadline: float) -> LlmAnswer:
        """Answer ``call`` before ``deadline`` (unix seconds) or raise DispatchFailed.

        NoEndpoint (a DispatchFailed) when no model of the call had an endpoint to try at all.
        """
        attempts: list[AttemptRecord] = []
        order = [call.model, *call.fallbacks]
        tried = False
        for index, model in enumerate(order):
            backend = self._backends.get(model)
            if backend is None:
                skip(
                    call, attempts, model, f"model {model!r} is not in the pool (add it to --pool)"
                )
                continue
            if not backend.available():
                skip(call, attempts, model, backend.why_unavailable())
                continue
            fit = fit_context(
                estimate_prompt_tokens(call.messages),
                call.max_tokens,
                backend.context_window(),
                shrink=call.shrink_on_memory_pressure,
            )
            if fit.max_tokens is None:
                skip(call, attempts, model, fit.why or "request does not fit")
                continue
            tried = True
            answer = await _ModelTry(
                self, call, model, backend, order[index + 1 :], deadline, attempts, fit
            ).run()
            if answer is not None:
                return answer
        if call.static_answer is not None:
            return static_answer(call, attempts)
        raise no_answer(call, attempts, tried=tried)

    def expected(self, key: str, call: LlmCall, max_tokens: int, q: float) -> float | None:
        """The ``q`` quantile of the seconds ``key`` is expected to need for ``call``."""
        return self.latency.expected(
            key,
            time.monotonic(),
            prompt_tokens=estimate_prompt_tokens(call.messages),
            max_tokens=max_tokens,
            q=q,
        )

    def next_candidates(
        self, names: list[str], call: LlmCall, max_tokens: int | None = None
    ) -> list[NextCandidate]:
        """The fallbacks still to come (and the static answer), as the reserve sees them."""
        tokens = call.max_tokens if max_tokens is None else max_tokens
        out = []
        for name in names:
            backend = self._backends.get(name)
            out.append(
                NextCandidate(
                    name,
                    self.expected(name, call, tokens, 0.5),
                    self.expected(name, call, tokens, 0.9),
                    usable=backend is not None and backend.available(),
                    in_flight=self._in_flight.get(name, 0),
                )
            )
        if call.static_answer is not None:
            out.append(NextCandidate("static", static=True))
        return out

    async def prepare(self, models: list[str]) -> None:
        """Get the backends of ``models`` ready (e.g. load the in-process model) ahead of a run."""
        for model in models:
            backend = self._backends.get(model)
            if backend is not None:
                await backend.prepare()
                if not self.latency.has_baseline(model):
                    baseline = backend.baseline()
                    if baseline:
                        self.latency.set_baseline(model, baseline)

    async def close(self) -> None:
        """Close every backend."""
        for backend in self._backends.values():
            await backend.close()


class _Skipped(BackendError):
    """The model is not tried (any more): no time, too slow, no endpoint. Never retried."""

    def __init__(self, message: str) -> None:
        super().__init__(message, error_class="skipped", retryable=False)


class _ModelTry:
    """The tries of one model for one call: tenacity drives them, decide_retry decides."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        call: LlmCall,
        model: str,
        backend: ModelBackend,
        rest: list[str],
        deadline: float,
        attempts: list[AttemptRecord],
        fit: ContextFit,
    ) -> None:
        self.d = dispatcher
        self.call = call
        self.model = model
        self.backend = backend
        self.rest = rest
        self.deadline = deadline
        self.attempts = attempts
        self.max_tokens = fit.max_tokens or call.max_tokens
        self.note = fit.why
        """Said once, in the first attempt's detail (max_tokens shrunk to fit the context)."""
        self.tries_used = 0
        self.next_counts = True
        self.backoff_s = call.backoff_ms / 1000
        self.avoid: set[str] = set()
        self.reserve_s = 0.0
        self.decision: Retry | MoveOn | None = None
        self.paired = False
        """The current attempt was a hedged pair (both already in the attempt log)."""
        self.ahead = 0
        """Attempts in flight on this model when the current one started (its queue)."""

    async def run(self) -> LlmAnswer | None:
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(BackendError),
            wait=self._wait,
            stop=self._stop,
            sleep=asyncio.sleep,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    return await self._attempt()
        except BackendError:
            return None
        return None  # pragma: no cover - tenacity either returns or raises

    async def _attempt(self) -> LlmAnswer:
        call, model = self.call, self.model
        if self.next_counts:
            self.tries_used += 1
        self.next_counts = True
        now = time.time()
        left = self.deadline - now
        if left < MIN_ATTEMPT_S:
            self._log("skipped", 0.0, None, "no time left")
            raise _Skipped("no time left")
        p50 = self.d.expected(model, call, self.max_tokens, 0.5)
        rest = self.d.next_candidates(self.rest, call, self.max_tokens)
        # Skipping a slow candidate saves time only for something after it: the last one is
        # tried with what is left (a near miss often answers; a skip never does).
        if too_slow(p50, left, keep_partial=call.keep_partial or not worth_saving_for(rest)):
            assert p50 is not None
            why = (
                f"its expected p50 of {p50 * 1000:.0f}ms for this request does not fit the "
                f"{left * 1000:.0f}ms left"
            )
            self._log("skipped", 0.0, None, why)
            raise _Skipped(why)
        self.reserve_s = reserve_for(rest, left, keep_partial=call.keep_partial)
        retry_elsewhere = (
            self.tries_used < call.attempts
            and self.backend.usable_count(frozenset(self.avoid)) >= 2
        )
        end = attempt_end(
            now,
            self.deadline,
            reserve_s=self.reserve_s,
            own_p50_s=p50,
            attempt_timeout_s=None
            if call.attempt_timeout_ms is None
            else call.attempt_timeout_ms / 1000,
            retry_elsewhere=retry_elsewhere,
            fallback_next=self.reserve_s > 0,
            keep_s=fallback_need(rest, left, keep_partial=call.keep_partial),
        )
        if not worth_starting(end - now, p50, fallback_next=self.reserve_s > 0):
            why = (
                f"the next fallback's reserve leaves it {max(end - now, 0) * 1000:.0f}ms, too "
                "little to answer"
            )
            self._log("skipped", 0.0, None, why)
            raise _Skipped(why)
        queue = self.backend.least_in_flight(frozenset(self.avoid))
        if queue is None:
            queue = self.d._in_flight.get(model, 0)
        fallback = next_tried(rest, left, call.keep_partial)
        if self.reserve_s > 0 and queued_out(queue, p50, end - now, fallback, left):
            assert p50 is not None
            assert fallback is not None
            why = (
                f"{queue} request(s) queued ahead: its expected answer in "
                f"{(queue + 1) * p50 * 1000:.0f}ms misses its {(end - now) * 1000:.0f}ms; "
                f"{fallback.name} is free"
            )
            self._log("skipped", 0.0, None, why)
            raise _Skipped(why)
        started = time.perf_counter()
        # The attempt's number goes with the call: interceptors of the backend (tracing) read it.
        p90 = self.d.expected(model, call, self.max_tokens, 0.9)
        attempt = dataclasses.replace(
            call,
            attempt=len(self.attempts) + 1,
            judged_after_s=judged_after(p90),
            trial_s=trial_span(p90, something_after=retry_elsewhere or self.reserve_s > 0),
        )
        avoid = frozenset(self.avoid)
        self.paired = False
        try:
            if wants_hedge(call, self.backend, avoid):
                got, started = await self._hedged(attempt, avoid, end, started)
            else:
                got = await self._launch(attempt, avoid, call.on_token, end)
        except BackendError as exc:
            if self.paired:  # both attempts of a hedged pair are in the log already
                raise
            elapsed = (time.perf_counter() - started) * 1000
            if exc.error_class == "unavailable":
                self._log("skipped", elapsed, None, exc.message)
                raise _Skipped(exc.message) from None
            self._log(exc.error_class, elapsed, exc.endpoint, exc.message, final=False)
            if exc.error_class == "timeout":
                self._record_timeout(elapsed / 1000)
            if exc.endpoint is not None:
                self.avoid.add(exc.endpoint)
            raise
        elapsed = (time.perf_counter() - started) * 1000
        status = "ok" if got.finish_reason != "deadline" else "deadline"
        if status == "ok":
            self._record(got, elapsed / 1000)
        if not self.paired:
            self._log(status, elapsed, got.endpoint, None, got=got)
        return LlmAnswer(
            text=got.text,
            model=model,
            endpoint=got.endpoint,
            finish_reason=got.finish_reason,
            prompt_tokens=got.prompt_tokens,
            completion_tokens=got.completion_tokens,
            attempts=self.attempts,
            confidence=got.confidence,
        )

    async def _launch(
        self, attempt: LlmCall, avoid: frozenset[str], sink: TextSink | None, end: float
    ) -> BackendAnswer:
        """One attempt on the backend, bounded by its end, its answer checked."""
        in_flight = self.d._in_flight
        self.ahead = in_flight.get(self.model, 0)
        in_flight[self.model] = self.ahead + 1
        try:
            got = await bounded(
                self.backend.complete(
                    attempt, self.model, self.max_tokens, end, avoid=avoid, on_text=sink
                ),
                end,
            )
        finally:
            in_flight[self.model] -= 1
        check_answer(self.call, got)
        return got

    async def _hedged(
        self, attempt: LlmCall, avoid: frozenset[str], end: float, started: float
    ) -> tuple[BackendAnswer, float]:
        """The attempt, hedged when slow (:mod:`._hedge`): the answer and when its leg started."""
        legs, winner = await run_hedged(
            attempt,
            functools.partial(self._launch, end=end),
            model=self.model,
            backend=self.backend,
            latency=self.d.latency,
            avoid=avoid,
            end=end,
        )
        if len(legs) == 1:  # no hedge started: an ordinary attempt
            if legs[0].error is not None:
                raise legs[0].error
            assert legs[0].answer is not None
            return legs[0].answer, started
        self.paired = True
        error = log_pair(legs, winner, self._log)
        for leg in legs:
            if leg.error is not None and leg.error.endpoint is not None:
                self.avoid.add(leg.error.endpoint)
        if winner is None:
            raise error or BackendError("hedged pair ended without an answer", error_class="5xx")
        assert winner.answer is not None
        return winner.answer, winner.started

    def _record(self, got: BackendAnswer, seconds: float) -> None:
        """An answer's time and size, for the model and for its endpoint."""
        prompt = got.prompt_tokens or estimate_prompt_tokens(self.call.messages)
        now = time.monotonic()
        keys = (
            [self.model] if got.endpoint is None else [self.model, f"{self.model}@{got.endpoint}"]
        )
        for key in keys:
            self.d.latency.record(
                key, seconds, now, prompt_tokens=prompt, completion_tokens=got.completion_tokens
            )

    def _record_timeout(self, seconds: float) -> None:
        """A timed-out attempt of a one-place model (the in-process one) refreshes its figures
        when it ran longer than they expect (:meth:`LatencyTracker.record_timeout`): under load
        its slow attempts are the ones cut, and answers alone would keep the estimate quick."""
        if self.backend.places() != 1:
            return  # one hung endpoint of several says nothing about the model
        self.d.latency.record_timeout(
            self.model,
            seconds,
            time.monotonic(),
            prompt_tokens=estimate_prompt_tokens(self.call.messages),
            max_tokens=self.max_tokens,
            ahead=self.ahead,
        )

    def _log(
        self,
        status: str,
        elapsed_ms: float,
        endpoint: str | None,
        detail: str | None,
        *,
        final: bool = True,
        got: BackendAnswer | None = None,
        hedge: int | None = None,
    ) -> None:
        """Add an entry to the attempt log; ``final``: tell ``on_attempt`` now (a failure is
        told once the retry decision has been added to its detail, in :meth:`_wait`)."""
        if self.note is not None:
            detail = f"{self.note}; {detail}" if detail else self.note
            self.note = None
        record = AttemptRecord(
            attempt=len(self.attempts) + 1,
            model=self.model,
            endpoint=endpoint,
            status=status,
            elapsed_ms=round(elapsed_ms, 3),
            detail=detail,
            hedge=hedge,
            **({} if got is None else answer_hops(got, elapsed_ms)),
        )
        self.attempts.append(record)
        if final and self.call.on_attempt is not None:
            self.call.on_attempt(record)

    # ------------------------------------------------------------------ tenacity hooks

    def _wait(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome is not None else None
        if isinstance(exc, _Skipped) or not isinstance(exc, BackendError):
            self.decision = MoveOn("")
            return 0.0
        failure = Failure(
            error_class=exc.error_class,
            retryable=exc.retryable,
            retry_after_s=exc.retry_after_s,
            advice_max_tokens=exc.advice_max_tokens,
            elsewhere=self.backend.usable_elsewhere(frozenset(self.avoid)),
        )
        decision = decide_retry(
            failure,
            now=time.time(),
            deadline=self.deadline,
            reserve_s=self.reserve_s,
            tries_used=self.tries_used,
            max_tries=self.call.attempts,
            backoff_s=self.backoff_s,
            max_backoff_s=self.call.max_backoff_ms / 1000,
            max_tokens=self.max_tokens,
            shrink=self.call.shrink_on_memory_pressure,
        )
        self.decision = decision
        last = self.attempts[-1]
        last.detail = f"{last.detail}; {decision.why}" if last.detail else decision.why
        if self.call.on_attempt is not None:
            self.call.on_attempt(last)
        if isinstance(decision, MoveOn):
            return 0.0
        self.max_tokens = decision.max_tokens
        self.next_counts = decision.counts
        if decision.counts and decision.wait_s > 0:
            self.backoff_s *= 2
        return decision.wait_s

    def _stop(self, state: RetryCallState) -> bool:
        return isinstance(self.decision, MoveOn)
