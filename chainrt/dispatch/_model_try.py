"""The tries of one model for one call, the dispatch loop's per-attempt driver (docs/dispatch.md).

:class:`ModelTry` asks :mod:`._policy` and :mod:`._latency` whether to skip the model, when to cut
an attempt (keeping the next fallback's reserve) and, after a failure, whether a retry fits
(tenacity drives the retries). An attempt runs plain, hedged (:mod:`._hedge`) or beside the
fallbacks (:mod:`._beside`), and lands in the attempt log; its figures go to :mod:`._state`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import Awaitable
from typing import Protocol

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type

from .._records import AttemptRecord
from ..budget._tokens import token_shortfall
from ..errors import BackendError
from ._adapt import slow_after
from ._backend import BackendAnswer, ModelBackend, TextSink
from ._beside import Beside, run_beside
from ._checks import bounded, check_answer, worth_saving_for
from ._hedge import log_pair, run_hedged, wants_hedge
from ._hops import answer_hops
from ._latency import estimate_prompt_tokens, too_slow, work_units
from ._policy import (
    MIN_ATTEMPT_S,
    ContextFit,
    Failure,
    MoveOn,
    Retry,
    attempt_plan,
    decide_retry,
    fallback_need,
    judged_after,
    next_tried,
    queued_out,
    reserve_for,
    trial_span,
    worth_starting,
)
from ._state import DispatchState
from ._types import LlmAnswer, LlmCall
from ._usage import answer_usage

__all__ = ["ModelTry", "Through"]


class Through(Protocol):
    """The dispatcher's loop over the models of ``order``: the answer (None: none) and whether
    any model was tried; ``beside``: these are fallbacks started beside a running attempt."""

    def __call__(
        self,
        call: LlmCall,
        order: list[str],
        deadline: float,
        attempts: list[AttemptRecord],
        *,
        beside: bool = False,
    ) -> Awaitable[tuple[LlmAnswer | None, bool]]: ...


class _Skipped(BackendError):
    """The model is not tried (any more): no time, too slow, no endpoint. Never retried."""

    def __init__(self, message: str) -> None:
        super().__init__(message, error_class="skipped", retryable=False)


class ModelTry:
    """The tries of one model for one call: tenacity drives them, decide_retry decides."""

    def __init__(
        self,
        dispatcher: DispatchState,
        through: Through,
        call: LlmCall,
        model: str,
        backend: ModelBackend,
        rest: list[str],
        deadline: float,
        attempts: list[AttemptRecord],
        fit: ContextFit,
    ) -> None:
        self.d = dispatcher
        self.through = through
        """The dispatcher's loop over models, for the fallbacks started beside an attempt."""
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
        self.beside = False
        """These tries run beside another model's attempt (a fallback started early)."""
        self.rest_tried = False
        """The fallbacks after this model were started beside its attempt (and are done)."""
        self.picked: str | None = None
        """The endpoint the current attempt went to."""

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
        if call.tokens_left is not None:  # the run's max_tokens_total
            short = token_shortfall(
                estimate_prompt_tokens(call.messages),
                self.max_tokens,
                call.tokens_left,
                spent=sum(a.usage.total_tokens for a in self.attempts if a.usage is not None),
            )
            if short is not None:
                self._log("skipped", 0.0, None, short)
                raise _Skipped(short)
        p50 = self.d.expected(model, call, self.max_tokens, 0.5)
        slow = self.d.slow_endpoints(model, call, self.max_tokens)
        coming = self.d.paces.running_on(f"{model}@{url}" for url in slow)
        rest = self.d.next_candidates(self.rest, call, self.max_tokens, coming=coming)
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
        end, retry_elsewhere = attempt_plan(
            now,
            self.deadline,
            reserve_s=self.reserve_s,
            own_p50_s=p50,
            attempt_timeout_s=call.attempt_timeout_ms and call.attempt_timeout_ms / 1000,
            retry_elsewhere=retry_elsewhere,
            retry_queue=self.backend.busiest_in_flight(frozenset(self.avoid)),
            keep_s=fallback_need(rest, left, keep_partial=call.keep_partial),
            streamed=call.on_token is not None,
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
        # An endpoint slow now is chosen only when no other is usable (avoided, as one that
        # failed during this step is).
        steer = avoid | slow
        self.paired = False
        self.picked = None
        try:
            if wants_hedge(call, self.backend, avoid):
                got, started = await self._hedged(attempt, steer, end, started)
            elif self.reserve_s > 0 and call.on_token is None and not retry_elsewhere:
                # No retry elsewhere comes after this attempt: instead of a cut that leaves the
                # fallback its reserve, the fallback starts beside it when the attempt's answer
                # can no longer come before the fallback's time, and the first answer wins.
                beside = await self._beside(attempt, steer, queue, p90)
                if isinstance(beside, LlmAnswer):
                    return beside
                got = beside
            else:
                got = await self._launch(attempt, steer, call.on_token, end)
        except asyncio.CancelledError:
            if self.beside and not self.paired:
                elapsed = (time.perf_counter() - started) * 1000
                self._log("cancelled", elapsed, self.picked, "the attempt it ran beside answered")
            raise
        except BackendError as exc:
            if self.paired or isinstance(exc, _Skipped):  # already in the log
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
        """One attempt on the backend, bounded by its end, its answer checked; its pace is
        kept for the endpoint it went to (:class:`~._adapt.PaceBook`)."""
        in_flight = self.d._in_flight
        self.ahead = in_flight.get(self.model, 0)
        in_flight[self.model] = self.ahead + 1
        paces = self.d.paces
        work = work_units(estimate_prompt_tokens(self.call.messages), self.max_tokens)
        tokens: list[int] = []
        told, went = attempt.on_endpoint, list[str]()  # went: where it went (bounded names it)

        def picked(url: str) -> None:
            went.append(url)
            key = f"{self.model}@{url}"
            tokens.append(paces.start(key, time.monotonic(), work, group=self.model))
            self.picked = url
            if told is not None:
                told(url)

        got: BackendAnswer | None = None
        try:
            got = await bounded(
                self.backend.complete(
                    dataclasses.replace(attempt, on_endpoint=picked),
                    self.model,
                    self.max_tokens,
                    end,
                    avoid=avoid,
                    on_text=sink,
                ),
                end,
                went,
            )
        finally:
            in_flight[self.model] -= 1
            for token in tokens:
                self._paced(token, got)
        check_answer(self.call, got)
        return got

    def _paced(self, token: int, got: BackendAnswer | None) -> None:
        """An attempt's end, for its endpoint's pace: an answer's rate, or the time so far of
        one cut, failed or cancelled when it is already slower than the model's usual."""
        now = time.monotonic()
        if got is not None and got.finish_reason != "deadline":
            prompt = got.prompt_tokens or estimate_prompt_tokens(self.call.messages)
            self.d.paces.end(token, now, work=work_units(prompt, got.completion_tokens))
        else:
            self.d.paces.end(token, now, keep_if_above=self.d.usual_rate(self.model))

    async def _beside(
        self, attempt: LlmCall, avoid: frozenset[str], queue: int, p90: float | None
    ) -> BackendAnswer | LlmAnswer:
        """The attempt until the step's deadline, the fallbacks started beside it
        (:mod:`._beside`): the first answer. ``queue``: requests ahead of it, ``p90``: its
        model's expected 90th percentile for the request."""
        work = work_units(estimate_prompt_tokens(self.call.messages), self.max_tokens)
        mark = slow_after(self.d.usual_rate(self.model), work)

        def own_slow() -> bool:
            slow = self.d.slow_endpoints(self.model, self.call, self.max_tokens)
            return self.picked is not None and self.picked in slow

        def fallbacks() -> Awaitable[tuple[LlmAnswer | None, bool]]:
            self.rest_tried = True
            return self.through(self.call, self.rest, self.deadline, self.attempts, beside=True)

        def failed(exc: BackendError) -> None:
            if exc.endpoint is not None:
                self.avoid.add(exc.endpoint)

        view = Beside(
            deadline=self.deadline,
            need_s=self.reserve_s,
            expected_s=None if p90 is None else p90 * (1 + queue),
            slow_mark_s=None if mark is None else mark * (1 + queue),
            own_slow=own_slow,
            picked=lambda: self.picked,
        )
        got = await run_beside(
            self._launch(attempt, avoid, None, self.deadline),
            fallbacks,
            view,
            lambda status, ms, endpoint, detail, at: self._log(status, ms, endpoint, detail, at=at),
            failed,
            lambda: len(self.attempts),
        )
        if got is None:
            raise _Skipped("neither this attempt nor the fallbacks beside it answered")
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
            slow=lambda url: url in self.d.slow_endpoints(self.model, self.call, self.max_tokens),
            other_expected_s=self.d.expected(self.model, self.call, self.max_tokens, 0.5),
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
        at: int | None = None,
    ) -> None:
        """Add an entry to the attempt log; ``final``: tell ``on_attempt`` now (a failure is
        told once the retry decision has been added to its detail, in :meth:`_wait`); ``at``:
        put it at this place of the log, renumbering the entries after it (an attempt that
        ran beside the fallbacks and was cancelled goes before their entries: the answer
        stays last)."""
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
            usage=None if got is None else answer_usage(got),
            **({} if got is None else answer_hops(got, elapsed_ms)),
        )
        if at is None or at >= len(self.attempts):
            self.attempts.append(record)
        else:
            self.attempts.insert(at, record)
            for number, entry in enumerate(self.attempts[at:], start=at + 1):
                entry.attempt = number
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
