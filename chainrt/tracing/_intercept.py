"""Tracing as interceptors: spans wrapped around the runtime's parts at assembly, not opened inline.

As the Temporal SDK's ``TracingInterceptor`` does, tracing here wraps what the runtime is built
from — once, in :func:`chainrt._runtime.open_runtime` and :func:`chainrt.dispatch.make_dispatcher`
— and the runner and dispatcher never name a span:

    TracingInterceptor  chain.run (one execution of a run), chain.step (one step)
    TracedStore         checkpoint.write (each atomic commit)
    TracedLimiter       concurrency.acquire (each wait for keys)
    TracedBackend       llm.dispatch (each attempt on a model; CLIENT span), whose context goes
                        to the worker as the call's ``traceparent``

Every span opens as a child of the current one (a context variable), so the tree follows the
call tree: ``chain.run`` › ``chain.step`` › ``concurrency.acquire`` / ``llm.dispatch`` (› the
worker's server span), with ``checkpoint.write`` under ``chain.run``. Span and attribute names
come from :mod:`._attributes`. This module works on the :class:`~chainrt._hooks.Hooks` seam only
and never imports OpenTelemetry; when tracing is off nothing is wrapped at all.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

from .._errors import ChainRTError, ConcurrencyRejected
from .._hooks import Hooks
from .._result import RunResult
from .._run import RunCall, RunInterceptor, RunStart, StepCall, StepStart
from ..concurrency import Holding, KeyRequest, KeyState, Limiter
from ..dispatch._backend import BackendAnswer, BackendError, ModelBackend, TextSink
from ..dispatch._hops import answer_hops
from ..dispatch._latency import Sample
from ..dispatch._types import LlmCall
from ..store._protocol import CheckpointStore
from ..store._records import (
    FINAL_STEP_STATUSES,
    OwnerLease,
    RunProgress,
    RunRecord,
    RunStatus,
    StepRecord,
)
from ..store._url import redact_text
from . import _attributes as attr

__all__ = [
    "TracedBackend",
    "TracedLimiter",
    "TracedStore",
    "TracingInterceptor",
    "trace_backends",
]


class TracingInterceptor(RunInterceptor):
    """``chain.run`` around each execution of a run, ``chain.step`` around each step.

    The run's span is linked to the executions it resumes, and its trace context is handed to
    the runner to store with the run, so that a later resume links back to it.
    """

    def __init__(self, hooks: Hooks) -> None:
        self.hooks = hooks

    async def execute_run(self, run: RunStart, call_next: RunCall) -> RunResult:
        """Open ``chain.run``; record the run's final status and the budget it used."""
        attributes = {
            attr.RUN_ID: run.run_id,
            attr.CHAIN: run.record.chain,
            attr.BUDGET_MS: run.budget_ms,
            attr.RESUMED: run.resumed,
        }
        with self.hooks.span(attr.SPAN_RUN, attributes, links=run.links) as span:
            ids = self.hooks.current_ids()
            if ids:
                run = dataclasses.replace(run, trace={**ids, "resumed_from": run.links})
            result = await call_next(run)
            span.set(**{attr.STATUS: result.status, attr.USED_MS: result.budget.used_ms})
        return result

    async def execute_step(self, step: StepStart, call_next: StepCall) -> StepRecord:
        """Open ``chain.step``; a step that did not complete marks its span failed."""
        spec = step.step
        attributes = {
            attr.RUN_ID: step.run_id,
            attr.STEP_ID: spec.id,
            attr.STEP_KIND: spec.kind,
            attr.WEIGHT: spec.weight,
            attr.ALLOTTED_MS: step.allotted_ms,
        }
        with self.hooks.span(attr.SPAN_STEP, attributes) as span:
            record = await call_next(step)
            span.set(
                **{
                    attr.STATUS: record.status,
                    attr.USED_MS: record.elapsed_ms,
                    attr.FALLBACK: record.fallback,
                    attr.ATTEMPTS: record.attempts,
                }
            )
            if record.error and record.status not in FINAL_STEP_STATUSES:
                span.error(ChainRTError(record.error))
        return record


class TracedStore(CheckpointStore):
    """A checkpoint store whose commits are ``checkpoint.write`` spans; the rest passes through."""

    def __init__(self, inner: CheckpointStore, hooks: Hooks) -> None:
        self.inner = inner
        self.hooks = hooks
        self.url = inner.url
        self.raw_url = inner.raw_url
        self.max_record_bytes = inner.max_record_bytes

    async def commit(
        self, run_id: str, token: int, progress: RunProgress, step: StepRecord | None = None
    ) -> None:
        """Commit, inside a ``checkpoint.write`` span naming the step written (if any)."""
        with self.hooks.span(
            attr.SPAN_CHECKPOINT, {attr.STEP_ID: step.step_id if step is not None else None}
        ):
            await self.inner.commit(run_id, token, progress, step)

    async def create_run(self, run: RunRecord) -> None:
        """Passed through."""
        await self.inner.create_run(run)

    async def get_run(self, run_id: str) -> RunRecord:
        """Passed through."""
        return await self.inner.get_run(run_id)

    async def get_steps(self, run_id: str) -> dict[str, StepRecord]:
        """Passed through."""
        return await self.inner.get_steps(run_id)

    async def claim(self, run_id: str, expected_token: int, owner: OwnerLease) -> int:
        """Passed through."""
        return await self.inner.claim(run_id, expected_token, owner)

    async def renew(self, run_id: str, token: int, expires_at: float) -> None:
        """Passed through."""
        await self.inner.renew(run_id, token, expires_at)

    async def list_runs(
        self,
        status: RunStatus | None = None,
        limit: int = 100,
        *,
        before: tuple[float, str] | None = None,
    ) -> list[RunRecord]:
        """Passed through."""
        return await self.inner.list_runs(status, limit, before=before)

    async def close(self) -> None:
        """Passed through."""
        await self.inner.close()

    def __getattr__(self, name: str) -> Any:
        # What a particular store offers beyond the protocol stays reachable through the wrapper.
        return _delegate(self, name)


class TracedLimiter(Limiter):
    """A limiter whose waits for keys are ``concurrency.acquire`` spans (none for no keys)."""

    def __init__(self, inner: Limiter, hooks: Hooks) -> None:
        self.inner = inner
        self.hooks = hooks

    async def acquire(
        self, requests: Sequence[KeyRequest], *, timeout_s: float, holder: str
    ) -> Holding:
        """Acquire, inside a span naming the keys, how long it waited, and a key refused."""
        if not requests:
            return await self.inner.acquire(requests, timeout_s=timeout_s, holder=holder)
        with self.hooks.span(attr.SPAN_ACQUIRE, {attr.KEYS: [r.key for r in requests]}) as span:
            try:
                holding = await self.inner.acquire(requests, timeout_s=timeout_s, holder=holder)
            except ConcurrencyRejected as exc:
                span.set(**{attr.KEY: exc.key, attr.WAITED_MS: exc.waited_ms})
                span.error(exc)
                raise
            span.set(**{attr.WAITED_MS: sum(holding.waits_ms.values())})
        return holding

    async def snapshot(self, key: str) -> KeyState:
        """Passed through."""
        return await self.inner.snapshot(key)

    async def close(self) -> None:
        """Passed through."""
        await self.inner.close()

    def __getattr__(self, name: str) -> Any:
        return _delegate(self, name)


class TracedBackend(ModelBackend):
    """A model backend whose attempts are ``llm.dispatch`` CLIENT spans.

    The attempt's call goes on with the span's ``traceparent``, so the worker's server span is
    the attempt's child. The span tells what the backend returned (endpoint, tokens, ``ok`` or
    ``deadline``) or how it failed; the dispatcher's verdict on the answer's content (a JSON
    step's invalid output) is in the step's attempt log.
    """

    def __init__(self, inner: ModelBackend, hooks: Hooks) -> None:
        self.inner = inner
        self.hooks = hooks

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
        """One attempt inside its span."""
        attributes = {
            attr.RUN_ID: call.run_id,
            attr.STEP_ID: call.step_id,
            attr.MODEL: model,
            attr.ATTEMPT: call.attempt,
            # Same meaning as on chain.step: the fallback model's name, absent on the primary.
            attr.FALLBACK: model if model != call.model else None,
            attr.GEN_AI_REQUEST_MODEL: model,
            attr.ATTEMPT_MS: round((deadline - time.time()) * 1000, 3),
            attr.GEN_AI_REQUEST_MAX_TOKENS: max_tokens,
            attr.HEDGE: True if call.not_endpoint is not None else None,
        }
        started = time.perf_counter()
        with self.hooks.span(attr.SPAN_DISPATCH, attributes) as span:
            traceparent = self.hooks.traceparent() or call.traceparent
            call = dataclasses.replace(call, traceparent=traceparent)
            try:
                got = await self.inner.complete(
                    call, model, max_tokens, deadline, avoid=avoid, on_text=on_text
                )
            except BackendError as exc:
                span.error(exc)
                endpoint = redact_text(exc.endpoint) if exc.endpoint else exc.endpoint
                span.set(**{attr.ENDPOINT: endpoint, attr.STATUS: exc.error_class})
                raise
            except asyncio.CancelledError:  # a hedge's loser, or the step was cancelled
                span.set(**{attr.STATUS: "cancelled"})
                raise
            span.set(
                **{
                    attr.ENDPOINT: redact_text(got.endpoint) if got.endpoint else got.endpoint,
                    attr.STATUS: "deadline" if got.finish_reason == "deadline" else "ok",
                    attr.GEN_AI_USAGE_INPUT_TOKENS: got.prompt_tokens,
                    attr.GEN_AI_USAGE_OUTPUT_TOKENS: got.completion_tokens,
                }
            )
            hops = answer_hops(got, (time.perf_counter() - started) * 1000)
            span.set(
                **{attr.CONFIDENCE: hops["confidence"]},
                **{attr.HOP_PREFIX + name: ms for name, ms in (hops["hops_ms"] or {}).items()},
            )
        return got

    def available(self) -> bool:
        """Passed through."""
        return self.inner.available()

    def usable_elsewhere(self, avoid: frozenset[str]) -> bool:
        """Passed through."""
        return self.inner.usable_elsewhere(avoid)

    def usable_count(self, avoid: frozenset[str]) -> int:
        """Passed through."""
        return self.inner.usable_count(avoid)

    def why_unavailable(self) -> str:
        """Passed through."""
        return self.inner.why_unavailable()

    async def prepare(self) -> None:
        """Passed through."""
        await self.inner.prepare()

    def baseline(self) -> tuple[Sample, ...]:
        """Passed through."""
        return self.inner.baseline()

    def context_window(self) -> int | None:
        """Passed through."""
        return self.inner.context_window()

    async def close(self) -> None:
        """Passed through."""
        await self.inner.close()

    def __getattr__(self, name: str) -> Any:
        return _delegate(self, name)


def _delegate(wrapper: Any, name: str) -> Any:
    if name == "inner":  # not set yet (a half-built copy): never recurse
        raise AttributeError(name)
    return getattr(wrapper.inner, name)


def trace_backends(backends: Mapping[str, ModelBackend], hooks: Hooks) -> dict[str, ModelBackend]:
    """Every backend of ``backends`` wrapped in a :class:`TracedBackend`."""
    return {name: TracedBackend(backend, hooks) for name, backend in backends.items()}
