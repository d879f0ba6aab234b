"""Tracing as interceptors: spans wrapped around the runtime's parts at assembly, not opened inline.

As the Temporal SDK's ``TracingInterceptor`` does, tracing here wraps what the runtime is built
from — once, in :func:`chainrt._runtime.open_runtime` and :func:`chainrt.dispatch.make_dispatcher`
— and the runner and dispatcher never name a span:

    TracingInterceptor  chain.run (one execution of a run), chain.step (one step),
                        chain.branch / chain.item (a group's branch or map item),
                        agent.turn / agent.call (an agent step's model turn or tool call)
    TracedStore         checkpoint.write (each atomic commit)
    TracedLimiter       concurrency.acquire (each wait for keys)
    TracedBackend       llm.dispatch (each attempt on a model; CLIENT span), whose context goes
                        to the worker as the call's ``traceparent`` (in :mod:`._backend`, so
                        that dispatch can wrap its backends without importing the runner's
                        interceptor)

Every span opens as a child of the current one (a context variable), so the tree follows the
call tree: ``chain.run`` › ``chain.step`` › ``concurrency.acquire`` / ``llm.dispatch`` (› the
worker's server span), with ``checkpoint.write`` under ``chain.run``. Span and attribute names
come from :mod:`._attributes`. This module works on the :class:`~chainrt._hooks.Hooks` seam only
and never imports OpenTelemetry; when tracing is off nothing is wrapped at all.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .._errors import ChainRTError, ConcurrencyRejected
from .._hooks import Hooks
from .._records import (
    FINAL_STEP_STATUSES,
    OwnerLease,
    RunProgress,
    RunRecord,
    RunStatus,
    StepRecord,
    TokenUsage,
)
from .._result import RunResult, step_usage
from .._run import BranchCall, BranchStart, RunCall, RunInterceptor, RunStart, StepCall, StepStart
from .._run._intercept import AgentPart, AgentPartCall
from ..concurrency import Holding, KeyRequest, KeyState, Limiter
from ..store._answers import AnswerCache
from ..store._protocol import CheckpointStore
from ..store._signals import KeptSignal, SignalRecord
from . import _attributes as attr
from ._backend import delegate

if TYPE_CHECKING:
    from .._run._flow import Ended

__all__ = [
    "TracedLimiter",
    "TracedStore",
    "TracingInterceptor",
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
            span.set(**_usage_attributes(result.usage))
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
            span.set(**_usage_attributes(step_usage(record)))
            if record.error and record.status not in FINAL_STEP_STATUSES:
                span.error(ChainRTError(record.error))
        return record

    async def execute_branch(self, branch: BranchStart, call_next: BranchCall) -> Ended:
        """Open ``chain.branch`` (a switch or parallel branch) or ``chain.item`` (a map item)."""
        item = branch.kind == "item"
        attributes: dict[str, Any] = {
            attr.RUN_ID: branch.run_id,
            attr.PATH: branch.path,
            attr.GROUP: branch.group,
        }
        attributes[attr.ITEM_INDEX if item else attr.BRANCH] = (
            int(branch.name) if item else branch.name
        )
        with self.hooks.span(attr.SPAN_ITEM if item else attr.SPAN_BRANCH, attributes) as span:
            try:
                ended = await call_next(branch)
            except asyncio.CancelledError:  # join any / a quorum met, or the deadline's cut
                span.set(**{attr.STATUS: "cancelled"})
                raise
            span.set(**{attr.STATUS: ended.stop or "completed"})
            if ended.stop is not None:
                span.error(ChainRTError(f"step {ended.stopped_at}: {ended.error or ended.stop}"))
        return ended

    async def execute_agent_part(self, part: AgentPart, call_next: AgentPartCall) -> AgentPart:
        """Open ``agent.turn`` (a model turn) or ``agent.call`` (a tool call) of an agent step;
        one that ended neither completed nor waiting for its approval marks its span failed."""
        turn = part.kind == "turn"
        attributes: dict[str, Any] = {
            attr.RUN_ID: part.run_id,
            attr.STEP_ID: part.step,
            attr.PATH: part.path,
        }
        if turn:
            attributes[attr.AGENT_FINAL] = part.final
        else:
            attributes[attr.AGENT_TOOL] = part.tool
        with self.hooks.span(
            attr.SPAN_AGENT_TURN if turn else attr.SPAN_AGENT_CALL, attributes
        ) as span:
            try:
                ended = await call_next(part)
            except asyncio.CancelledError:  # the step's deadline, or a group's join met
                span.set(**{attr.STATUS: "cancelled"})
                raise
            span.set(**{attr.STATUS: ended.status, attr.ATTEMPTS: ended.attempts})
            if turn:
                span.set(**{attr.MODEL: ended.model, attr.AGENT_FINAL: ended.final})
            if ended.error and ended.status not in ("completed", "waiting"):
                span.error(ChainRTError(f"{part.path}: {ended.error}"))
        return ended


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

    async def put_signal(self, run_id: str, signal: SignalRecord) -> KeptSignal:
        """Passed through."""
        return await self.inner.put_signal(run_id, signal)

    async def get_signal(self, run_id: str, name: str) -> SignalRecord | None:
        """Passed through."""
        return await self.inner.get_signal(run_id, name)

    async def list_runs(
        self,
        status: RunStatus | None = None,
        limit: int = 100,
        *,
        before: tuple[float, str] | None = None,
        chain: str | None = None,
    ) -> list[RunRecord]:
        """Passed through."""
        return await self.inner.list_runs(status, limit, before=before, chain=chain)

    async def close(self) -> None:
        """Passed through."""
        await self.inner.close()

    def answer_cache(self) -> AnswerCache:
        """The inner store's (in Redis or the SQLite file, as without tracing)."""
        return self.inner.answer_cache()

    def __getattr__(self, name: str) -> Any:
        # What a particular store offers beyond the protocol stays reachable through the wrapper.
        return delegate(self, name)


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
        return delegate(self, name)


def _usage_attributes(usage: TokenUsage | None) -> dict[str, Any]:
    """The token attributes of a step or run span (none when no usage was reported)."""
    if usage is None:
        return {}
    return {
        attr.TOKENS_PROMPT: usage.prompt_tokens,
        attr.TOKENS_COMPLETION: usage.completion_tokens,
        attr.TOKENS_CACHED: usage.cached_tokens,
        attr.COST: usage.cost,
    }
