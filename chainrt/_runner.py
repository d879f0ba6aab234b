"""The async runner: executes a chain step by step under its budget, checkpointing each step.

A run is a loop over the chain's steps. For each step the budget decides (allot / skip / stop),
step-scoped concurrency keys are taken inside the allotment, the step runs under its deadline,
and its record is committed atomically with the run's progress before the next step starts. A
resumed run re-enters the same loop with the recorded steps already done.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import _budget as budget
from ._errors import (
    BudgetError,
    ChainRTError,
    ConcurrencyRejected,
    FencedOut,
    InputError,
    RunLocked,
    StoreUnavailable,
)
from ._hooks import NO_HOOKS, Hooks
from ._lease import Heartbeat, owner_state, this_host
from ._progress import NO_PROGRESS, Progress
from ._result import RunResult
from ._steps import StepOutcome, run_llm, run_tool
from .concurrency import KeyRequest, Limiter
from .dispatch import Dispatcher, LlmCall
from .spec import ChainSpec, StepSpec, render_value, resolve_callable, spec_from_dict
from .spec._models import INPUT_TYPES, ConcurrencyKeySpec, rate_per_second
from .store._protocol import CheckpointStore
from .store._records import (
    FINAL_STEP_STATUSES,
    OwnerLease,
    RunProgress,
    RunRecord,
    StepRecord,
)

__all__ = ["Runner", "check_inputs", "new_run_id"]

_RUN_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
_COMMIT_GRACE_S = 0.5
"""Time a checkpoint write may take even when the budget has run out (the result must land)."""


def new_run_id() -> str:
    """A fresh, unique run id."""
    return uuid.uuid4().hex


def check_inputs(spec: ChainSpec, inputs: Any) -> dict[str, Any]:
    """Validate a run's input against the chain's declared inputs (before anything runs)."""
    if not isinstance(inputs, dict):
        raise InputError(
            f"input of chain {spec.name!r} must be a JSON object, got {type(inputs).__name__}"
        )
    missing = [name for name in spec.inputs if name not in inputs]
    if missing:
        raise InputError(f"input of chain {spec.name!r} lacks {', '.join(missing)}")
    if spec.inputs:
        unknown = [name for name in inputs if name not in spec.inputs]
        if unknown:
            allowed = ", ".join(spec.inputs)
            raise InputError(
                f"input of chain {spec.name!r} has unknown field(s) {', '.join(unknown)} (declared: {allowed})"
            )
    for name, type_name in spec.inputs.items():
        value = inputs[name]
        types = INPUT_TYPES[type_name]
        if isinstance(value, bool) and bool not in types and type_name != "any":
            ok = False
        else:
            ok = isinstance(value, types)
        if not ok:
            raise InputError(
                f"input field {name!r} of chain {spec.name!r} must be {type_name}, got {type(value).__name__}"
            )
    return dict(inputs)


def _key_requests(keys: list[ConcurrencyKeySpec], scope: dict[str, Any]) -> list[KeyRequest]:
    requests = []
    for key in keys:
        rendered = render_value(key.key, scope)
        requests.append(
            KeyRequest(
                key=str(rendered),
                limit=key.limit,
                rate_per_s=rate_per_second(key.rate) if key.rate else None,
                burst=key.burst or 1,
            )
        )
    return requests


class _Clock:
    """Budget bookkeeping of one execution: ms used so far, ms left."""

    def __init__(self, total_ms: float, used_before_ms: float) -> None:
        self.total_ms = total_ms
        self.used_before_ms = used_before_ms
        self._t0 = time.perf_counter()

    def used_ms(self) -> float:
        return self.used_before_ms + (time.perf_counter() - self._t0) * 1000

    def remaining_ms(self) -> float:
        return self.total_ms - self.used_ms()


class Runner:
    """Runs and resumes chains against one store, one dispatcher and one limiter."""

    def __init__(
        self,
        store: CheckpointStore,
        dispatcher: Dispatcher,
        limiter: Limiter,
        *,
        hooks: Hooks = NO_HOOKS,
        progress: Progress = NO_PROGRESS,
        lease_ttl_s: float = 10.0,
        allowed_modules: tuple[str, ...] = (),
        runnable_executor: Callable[..., Any] | None = None,
    ) -> None:
        self.store = store
        self.dispatcher = dispatcher
        self.limiter = limiter
        self.hooks = hooks
        self.progress = progress
        self.lease_ttl_s = lease_ttl_s
        self.allowed_modules = allowed_modules
        self.runnable_executor = runnable_executor
        self._host = this_host()
        self._tools: dict[tuple[str, str], Callable[..., Any]] = {}

    # ------------------------------------------------------------------ entry points

    async def run(
        self,
        spec: ChainSpec,
        inputs: Any,
        *,
        source_dir: Path | None = None,
        run_id: str | None = None,
        budget_ms: float | None = None,
    ) -> RunResult:
        """Start a new run of ``spec`` and execute it to the end (or to its budget)."""
        inputs = check_inputs(spec, inputs)
        run_id = run_id or new_run_id()
        if not _RUN_ID.match(run_id):
            raise InputError(f"run id must match [A-Za-z0-9_.:-]{{1,128}}, got {run_id!r}")
        total = spec.budget if budget_ms is None else budget_ms
        if total <= 0:
            raise BudgetError(f"budget must be greater than zero, got {total:g}ms")
        owner = OwnerLease(
            host=self._host, pid=os.getpid(), token=1, expires_at=time.time() + self.lease_ttl_s
        )
        record = RunRecord(
            run_id=run_id,
            chain=spec.name,
            spec=spec.model_dump(mode="json", by_alias=True),
            source=str(source_dir) if source_dir is not None else None,
            input=inputs,
            budget_total_ms=total,
            owner=owner,
            fencing_token=1,
        )
        await self._prepare(spec)
        await self.store.create_run(record)
        return await self._execute(record, spec, {}, _Clock(total, 0.0), links=[])

    async def resume(
        self, run_id: str, *, budget_ms: float | None = None, wait: bool = True
    ) -> RunResult:
        """Take over a run whose owner is gone and finish it; recorded steps do not run again.

        The run continues with the budget it had left, or with ``budget_ms`` more when given.
        With ``wait`` the call waits for a live owner's lease to expire; without, it refuses.
        """
        record = await self.store.get_run(run_id)
        if record.status == "completed":
            return RunResult.from_records(record, await self.store.get_steps(run_id))
        while True:
            state = owner_state(record.owner, now=time.time(), host=self._host)
            if state.gone:
                break
            if not wait or state.expires_in_s > self.lease_ttl_s * 3:
                raise RunLocked(
                    f"run {run_id} is {state.why} for {state.expires_in_s:.1f}s more; "
                    "resume it after the lease expires (or wait for it)"
                )
            await asyncio.sleep(min(max(state.expires_in_s, 0.05), 0.5))
            record = await self.store.get_run(run_id)
        if budget_ms is not None and budget_ms <= 0:
            raise BudgetError(f"budget must be greater than zero, got {budget_ms:g}ms")
        total = record.budget_total_ms if budget_ms is None else record.budget_used_ms + budget_ms
        if total - record.budget_used_ms < budget.DEFAULT_MIN_STEP_MS:
            raise BudgetError(
                f"run {run_id} has used {record.budget_used_ms:.0f}ms of its "
                f"{record.budget_total_ms:.0f}ms budget; resume it with a new budget (--budget)"
            )
        token = await self.store.claim(
            run_id,
            record.fencing_token,
            OwnerLease(
                host=self._host,
                pid=os.getpid(),
                token=record.fencing_token + 1,
                expires_at=time.time() + self.lease_ttl_s,
            ),
        )
        record = record.model_copy(
            update={"fencing_token": token, "budget_total_ms": total, "status": "running"}
        )
        spec = spec_from_dict(record.spec, file=f"<stored spec of run {run_id}>")
        steps = await self.store.get_steps(run_id)
        await self._prepare(spec)
        links = [record.trace] if record.trace.get("trace_id") else []
        return await self._execute(
            record,
            spec,
            steps,
            _Clock(total, record.budget_used_ms),
            links=links,
            new_total=budget_ms is not None,
        )

    def _tool(self, ref: str, chain_dir: Path) -> Callable[..., Any]:
        """Resolve a tool reference once per runner (path checks cost more than the call)."""
        key = (ref, str(chain_dir))
        fn = self._tools.get(key)
        if fn is None:
            fn = resolve_callable(ref, chain_dir=chain_dir, allowed_modules=self.allowed_modules)
            self._tools[key] = fn
        return fn

    async def _prepare(self, spec: ChainSpec) -> None:
        """Pay one-time process costs before the budget clock starts: loading the in-process
        model, importing the LangChain step executor. A long-lived runner pays them once."""
        if any(step.runnable is not None for step in spec.steps) and self.runnable_executor is None:
            self.runnable_executor = _runnable_executor()
        models = {
            model
            for step in spec.steps
            if step.llm is not None
            for model in (step.llm.model, *step.fallbacks)
        }
        if models:
            with contextlib.suppress(ChainRTError):
                await self.dispatcher.prepare(sorted(models))  # failures show in the step

    # ------------------------------------------------------------------ the loop

    async def _execute(
        self,
        record: RunRecord,
        spec: ChainSpec,
        done: dict[str, StepRecord],
        clock: _Clock,
        *,
        links: list[dict[str, Any]],
        new_total: bool = False,
    ) -> RunResult:
        run_id = record.run_id
        token = record.fencing_token
        task = asyncio.current_task()
        assert task is not None
        heartbeat = Heartbeat(
            self.store, run_id, token, self.lease_ttl_s, on_fenced=lambda: _cancel(task)
        )
        heartbeat.start()
        source_dir = Path(record.source) if record.source else None
        scope: dict[str, Any] = {"input": record.input, "steps": {}, "run_id": run_id}
        for step_id, rec in done.items():
            if rec.status in FINAL_STEP_STATUSES:
                scope["steps"][step_id] = {"output": rec.output}
        self.progress.run_started(record, resumed=bool(done) or bool(links))
        state = _RunState(record, done)
        final = False
        release = True
        with self.hooks.span(
            "chain.run",
            {
                "chainrt.run_id": run_id,
                "chainrt.chain": spec.name,
                "chainrt.budget_ms": clock.total_ms,
                "chainrt.resumed": bool(links),
            },
            links=links,
        ) as span:
            try:
                ids = self.hooks.current_ids()
                if ids or new_total:
                    trace = {**ids, "resumed_from": links} if ids else None
                    await self._commit(
                        state,
                        token,
                        clock,
                        status="running",
                        trace=trace,
                        budget_total=clock.total_ms if new_total else None,
                    )
                await self._steps(spec, state, token, clock, scope, source_dir)
                final = True
            except FencedOut as exc:
                span.error(exc)
                raise
            except StoreUnavailable as exc:
                # A write just failed against this store: a release would only wait on it
                # again, past the budget, and cannot land either.
                span.error(exc)
                release = False
                raise
            except asyncio.CancelledError:
                if heartbeat.fenced:
                    raise FencedOut(
                        f"run {run_id} was taken over by another process; this one stopped"
                    ) from None
                raise
            finally:
                await heartbeat.stop()
                if not final and release:
                    # Cancelled or crashed inside the loop: give the lease back so that a
                    # resume can start at once; the recorded steps stay.
                    with contextlib.suppress(ChainRTError, asyncio.CancelledError):
                        await asyncio.shield(self._release(state, token, clock))
            span.set(**{"chainrt.status": state.record.status, "chainrt.used_ms": clock.used_ms()})
        result = RunResult.from_records(state.record, state.done)
        self.progress.run_finished(result)
        return result

    async def _steps(
        self,
        spec: ChainSpec,
        state: _RunState,
        token: int,
        clock: _Clock,
        scope: dict[str, Any],
        source_dir: Path | None,
    ) -> None:
        run_id = state.record.run_id
        try:
            run_holding = await self._acquire(
                spec.concurrency, scope, clock.remaining_ms(), f"{run_id}:run"
            )
        except ConcurrencyRejected as exc:
            await self._finish(
                state, token, clock, "rejected", error=exc.message, stopped_at=spec.steps[0].id
            )
            return
        state.waits_ms.update(run_holding.waits_ms)
        try:
            pending = [
                s
                for s in spec.steps
                if s.id not in state.done or state.done[s.id].status not in FINAL_STEP_STATUSES
            ]
            budgets = [_step_budget(s) for s in pending]
            for index, step in enumerate(pending):
                left = budgets[index:]
                decision = budget.decide(clock.remaining_ms(), left)
                if isinstance(decision, budget.Stop):
                    await self._finish(
                        state,
                        token,
                        clock,
                        "partial",
                        error=f"budget: {decision.reason}",
                        stopped_at=step.id,
                    )
                    return
                if isinstance(decision, budget.Skip):
                    rec = _record(
                        step, StepOutcome("skipped", error=decision.reason), 0.0, time.time(), 0.0
                    )
                    await self._commit(state, token, clock, step=rec)
                    self.progress.step_finished(rec)
                    continue
                _outcome, rec = await self._run_step(step, decision.ms, scope, run_id, source_dir)
                if rec.status in FINAL_STEP_STATUSES:
                    scope["steps"][step.id] = {"output": rec.output}
                    await self._commit(state, token, clock, step=rec)
                    self.progress.step_finished(rec)
                    continue
                if step.optional and rec.status in ("timed_out", "failed", "rejected"):
                    rec = rec.model_copy(
                        update={"status": "skipped", "error": f"{rec.status}: {rec.error}"}
                    )
                    await self._commit(state, token, clock, step=rec)
                    self.progress.step_finished(rec)
                    continue
                status = {"timed_out": "partial", "rejected": "rejected"}.get(rec.status, "failed")
                await self._finish(
                    state,
                    token,
                    clock,
                    status,
                    error=f"step {step.id}: {rec.error}",
                    stopped_at=step.id,
                    step=rec,
                )
                self.progress.step_finished(rec)
                return
            try:
                output = _output(spec, scope)
            except ChainRTError as exc:
                await self._finish(state, token, clock, "failed", error=f"output: {exc.message}")
                return
            await self._finish(state, token, clock, "completed", output=output)
        finally:
            await run_holding.release()

    async def _run_step(
        self,
        step: StepSpec,
        allot_ms: float,
        scope: dict[str, Any],
        run_id: str,
        source_dir: Path | None,
    ) -> tuple[StepOutcome, StepRecord]:
        started_at = time.time()
        t0 = time.perf_counter()
        deadline = started_at + allot_ms / 1000
        model = step.llm.model if step.llm is not None else None
        self.progress.step_started(step, allot_ms, model)
        with self.hooks.span(
            "chain.step",
            {
                "chainrt.run_id": run_id,
                "chainrt.step_id": step.id,
                "chainrt.step_kind": step.kind,
                "chainrt.weight": step.weight,
                "chainrt.allotted_ms": allot_ms,
            },
        ) as span:
            step_scope = {**scope, "step": {"id": step.id, "model": model, "weight": step.weight}}
            waits: dict[str, float] = {}
            try:
                holding = await self._acquire(
                    step.concurrency, step_scope, allot_ms, f"{run_id}:{step.id}"
                )
            except ConcurrencyRejected as exc:
                outcome = StepOutcome("rejected", error=exc.message)
            else:
                waits = holding.waits_ms
                try:
                    outcome = await self._dispatch_kind(
                        step, step_scope, run_id, deadline, source_dir
                    )
                finally:
                    await holding.release()
            elapsed = (time.perf_counter() - t0) * 1000
            rec = _record(step, outcome, allot_ms, started_at, elapsed, waits)
            span.set(
                **{
                    "chainrt.status": rec.status,
                    "chainrt.used_ms": elapsed,
                    "chainrt.fallback": rec.fallback,
                    "chainrt.attempts": rec.attempts,
                }
            )
            if rec.error and rec.status not in FINAL_STEP_STATUSES:
                span.error(ChainRTError(rec.error))
        return outcome, rec

    async def _dispatch_kind(
        self,
        step: StepSpec,
        scope: dict[str, Any],
        run_id: str,
        deadline: float,
        source_dir: Path | None,
    ) -> StepOutcome:
        try:
            if step.llm is not None:
                return await run_llm(self.dispatcher, self._llm_call(step, scope, run_id), deadline)
            if step.tool is not None:
                fn = self._tool(step.tool, source_dir or Path.cwd())
                kwargs = render_value(step.args, scope)
                return await run_tool(
                    fn,
                    kwargs,
                    run_id=run_id,
                    step_id=step.id,
                    deadline=deadline,
                    attempts=step.retry.attempts,
                    backoff_ms=step.retry.backoff,
                    max_backoff_ms=step.retry.max_backoff,
                    attempt_timeout_ms=step.attempt_timeout,
                )
            executor = self.runnable_executor or _runnable_executor()
            if executor is None:
                return StepOutcome(
                    "failed",
                    error="runnable steps need the LangChain integration: pip install 'chainrt[langchain]'",
                )
            outcome: StepOutcome = await executor(
                step,
                scope,
                run_id=run_id,
                deadline=deadline,
                source_dir=source_dir,
                allowed_modules=self.allowed_modules,
            )
            return outcome
        except ChainRTError as exc:
            return StepOutcome("failed", error=exc.message)

    def _llm_call(self, step: StepSpec, scope: dict[str, Any], run_id: str) -> LlmCall:
        llm = step.llm
        assert llm is not None
        messages: list[tuple[str, str]]
        if llm.messages is not None:
            messages = [(m.role, str(render_value(m.content, scope))) for m in llm.messages]
        else:
            messages = []
            if llm.system is not None:
                messages.append(("system", str(render_value(llm.system, scope))))
            messages.append(("user", str(render_value(llm.prompt, scope))))
        return LlmCall(
            model=llm.model,
            messages=messages,
            max_tokens=llm.max_tokens,
            temperature=llm.temperature,
            json_output=llm.json_output,
            stop=llm.stop,
            fallbacks=list(step.fallbacks),
            static_answer=None
            if step.static_answer is None
            else str(render_value(step.static_answer, scope)),
            attempts=step.retry.attempts,
            backoff_ms=step.retry.backoff,
            max_backoff_ms=step.retry.max_backoff,
            attempt_timeout_ms=step.attempt_timeout,
            keep_partial=step.on_timeout == "partial",
            shrink_on_memory_pressure=step.on_memory_pressure == "shrink",
            run_id=run_id,
            step_id=step.id,
            traceparent=self.hooks.traceparent(),
        )

    # ------------------------------------------------------------------ store and keys

    async def _acquire(
        self, keys: list[ConcurrencyKeySpec], scope: dict[str, Any], within_ms: float, holder: str
    ) -> Any:
        requests = _key_requests(keys, scope) if keys else []
        if not requests:
            return await self.limiter.acquire([], timeout_s=0.0, holder=holder)
        with self.hooks.span(
            "concurrency.acquire", {"chainrt.keys": [r.key for r in requests]}
        ) as span:
            try:
                holding = await self.limiter.acquire(
                    requests, timeout_s=max(within_ms, 0.0) / 1000, holder=holder
                )
            except ConcurrencyRejected as exc:
                span.set(**{"chainrt.key": exc.key, "chainrt.waited_ms": exc.waited_ms})
                span.error(exc)
                raise
            span.set(**{"chainrt.waited_ms": sum(holding.waits_ms.values())})
        return holding

    async def _commit(
        self,
        state: _RunState,
        token: int,
        clock: _Clock,
        *,
        step: StepRecord | None = None,
        status: str = "running",
        release: bool = False,
        trace: dict[str, Any] | None = None,
        budget_total: float | None = None,
        output: Any = None,
        error: str | None = None,
        stopped_at: str | None = None,
    ) -> None:
        progress = RunProgress(
            status=status,
            budget_used_ms=round(clock.used_ms(), 3),
            output=output,
            error=error,
            stopped_at=stopped_at,
            release_owner=release,
            waits_ms=state.waits_ms,
            budget_total_ms=budget_total,
            trace=trace,
        )
        timeout = max(clock.remaining_ms() / 1000, _COMMIT_GRACE_S)
        with self.hooks.span(
            "checkpoint.write", {"chainrt.step_id": step.step_id if step else None}
        ):
            try:
                # Not wait_for: on Python 3.11 a cancellation racing the write can leave the
                # write's own error (FencedOut) unretrieved in wait_for's inner task, printed
                # as a traceback at exit. Here the write runs in this task and its error is raised.
                async with asyncio.timeout(timeout):
                    await self.store.commit(state.record.run_id, token, progress, step)
            except TimeoutError:
                raise StoreUnavailable(
                    f"checkpoint of run {state.record.run_id} did not complete within the budget; "
                    f"the store ({self.store.url}) is too slow or down — resume the run when it is back"
                ) from None
        if step is not None:
            state.done[step.step_id] = step
        update: dict[str, Any] = {
            "status": status,
            "budget_used_ms": progress.budget_used_ms,
            "waits_ms": dict(state.waits_ms),
            "output": output,
            "error": error,
            "stopped_at": stopped_at,
            "updated_at": time.time(),
        }
        if budget_total is not None:
            update["budget_total_ms"] = budget_total
        if trace is not None:
            update["trace"] = trace
        if release:
            update["owner"] = None
        state.record = state.record.model_copy(update=update)

    async def _finish(
        self,
        state: _RunState,
        token: int,
        clock: _Clock,
        status: str,
        *,
        output: Any = None,
        error: str | None = None,
        stopped_at: str | None = None,
        step: StepRecord | None = None,
    ) -> None:
        await self._commit(
            state,
            token,
            clock,
            step=step,
            status=status,
            release=True,
            output=output,
            error=error,
            stopped_at=stopped_at,
        )

    async def _release(self, state: _RunState, token: int, clock: _Clock) -> None:
        await self._commit(state, token, clock, status="running", release=True)


def _cancel(task: asyncio.Task[Any]) -> None:
    task.cancel()


class _RunState:
    """The in-memory copy of the run record and the step records written so far."""

    def __init__(self, record: RunRecord, done: dict[str, StepRecord]) -> None:
        self.record = record
        self.done = dict(done)
        self.waits_ms: dict[str, float] = dict(record.waits_ms)


def _runnable_executor() -> Callable[..., Any] | None:
    """The LangChain step executor, imported on first use (langchain-core is a heavy import)."""
    try:
        from .langchain._steps import run_runnable_step
    except ImportError:
        return None
    return run_runnable_step


def _step_budget(step: StepSpec) -> budget.StepBudget:
    return budget.StepBudget(
        weight=step.weight, min_ms=step.min, max_ms=step.max, optional=step.optional
    )


def _record(
    step: StepSpec,
    outcome: StepOutcome,
    allot_ms: float,
    started_at: float,
    elapsed_ms: float,
    waits: dict[str, float] | None = None,
) -> StepRecord:
    return StepRecord(
        step_id=step.id,
        status=outcome.status,
        output=outcome.output,
        attempts=outcome.attempts,
        model=outcome.model,
        fallback=outcome.fallback,
        allotted_ms=round(allot_ms, 3),
        elapsed_ms=round(elapsed_ms, 3),
        started_at=started_at,
        finished_at=started_at + elapsed_ms / 1000,
        error=outcome.error,
        attempt_log=outcome.attempt_log,
        waits_ms=dict(waits or {}),
    )


def _output(spec: ChainSpec, scope: dict[str, Any]) -> Any:
    if spec.output is not None:
        return render_value(spec.output, scope)
    last = spec.steps[-1].id
    for step in reversed(spec.steps):
        if step.id in scope["steps"]:
            last = step.id
            break
    return scope["steps"].get(last, {}).get("output")
