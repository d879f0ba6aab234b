"""The async runner: a budget loop over collaborators (docs/chain-format.md, Budget).

A run is a loop over the chain's steps. For each step the pure :func:`chainrt.budget._steps.decide`
says allot, skip or stop; the step kind's executor runs the step inside its allotment; the pure
:func:`~chainrt._run.settle` says what its record means for the run; the journal commits the
record atomically with the run's progress before the next step starts. The loop only awaits.

Collaborators (``chainrt/_run/``): the :class:`~chainrt._run.RunJournal` (clock, in-memory run
state, every checkpoint write), one executor per step kind (``_llm``, ``_tool``, ``_runnable``),
and :class:`~chainrt._run.RunInterceptor`\\ s wrapped around each execution and each step
(tracing is one). Owner leases — waiting for a live owner, claiming, the heartbeat — are in
:mod:`chainrt.runs._lease`. People and event streams watch through :class:`~chainrt._progress.Progress`.

One runner serves any number of concurrent runs: everything about a run lives in its journal and
its own task, so cancelling that task abandons the step in flight and gives the lease back.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from ._bounded import TaskHost
from ._errors import (
    BudgetError,
    ChainRTError,
    CheckpointError,
    ConcurrencyError,
    ConcurrencyRejected,
    FencedOut,
    StoreUnavailable,
    TemplateError,
)
from ._progress import NO_PROGRESS, STEP_PROGRESS, Progress
from ._records import RunRecord, StepRecord
from ._result import RunResult
from ._run import (
    TOOL_HOST,
    TOOL_JOURNAL,
    Clock,
    KindExecutor,
    LlmExecutor,
    RunInterceptor,
    RunJournal,
    RunnableExecutor,
    RunStart,
    StepStart,
    ToolExecutor,
    acquire_keys,
    chain_runs,
    chain_steps,
    check_budget,
    check_inputs,
    check_new_run_id,
    end_step,
    finish_output,
    new_run_id,
    plan_for,
    repeats_side_effects,
    run_output,
    run_step,
    settle,
    skipped_record,
)
from ._run._agent import AgentExecutor
from ._run._flow import FLOW, FlowRun, flows
from ._run._groups import GroupExecutor
from ._run._models_view import ModelsView
from ._run._wait import WaitExecutor
from ._settings import get_settings
from .budget import _steps as budget
from .budget._tokens import start_run_tokens
from .concurrency import Limiter
from .dispatch import Dispatcher
from .runs._lease import Heartbeat, claim, new_lease, this_host, wait_for_owner
from .runs._signals import continue_parked
from .runs._trust import RecordTrust
from .spec import ChainSpec, StepSpec
from .spec._dump import spec_dump, spec_json
from .spec._roots import add_chain_root
from .spec._stored import stored_spec
from .store._protocol import CheckpointStore

__all__ = ["Runner", "check_inputs", "new_run_id"]


class Runner:
    """Runs and resumes chains against one store, one dispatcher and one limiter.

    ``interceptors`` wrap every execution and every step (first one outermost); ``progress``
    hears of every run (a run may bring its own); ``host`` is the name its owner leases carry.
    ``trust`` says which stored runs it will resume (chain roots, record key; default: the
    settings, see docs/security.md).
    """

    def __init__(
        self,
        store: CheckpointStore,
        dispatcher: Dispatcher,
        limiter: Limiter,
        *,
        interceptors: Sequence[RunInterceptor] = (),
        progress: Progress = NO_PROGRESS,
        lease_ttl_s: float = 10.0,
        allowed_modules: tuple[str, ...] = (),
        runnable_executor: Callable[..., Any] | None = None,
        host: str | None = None,
        trust: RecordTrust | None = None,
    ) -> None:
        self.store = store
        self.dispatcher = dispatcher
        self.limiter = limiter
        self.interceptors = tuple(interceptors)
        self.progress = progress
        self.lease_ttl_s = lease_ttl_s
        self.host = host or this_host()
        self.trust = trust or RecordTrust.from_settings(get_settings(), allowed_modules)
        self._llm = LlmExecutor(dispatcher, store)
        self._tool = ToolExecutor(allowed_modules)
        self._runnable = RunnableExecutor(allowed_modules, runnable_executor)
        self._group = GroupExecutor()
        self._wait = WaitExecutor(store)
        self._agent = AgentExecutor(dispatcher, limiter, allowed_modules, self.interceptors)

    # ------------------------------------------------------------------ entry points

    async def run(
        self,
        spec: ChainSpec,
        inputs: Any,
        *,
        source_dir: Path | None = None,
        run_id: str | None = None,
        budget_ms: float | None = None,
        progress: Progress | None = None,
    ) -> RunResult:
        """Start a new run of ``spec`` and execute it to the end (or to its budget).

        ``source_dir`` is the folder its tool files resolve in (the chain file's); the caller
        chose it, so it becomes one of this process's chain roots (a resume may use it).
        """
        inputs = check_inputs(spec, inputs)
        run_id = check_new_run_id(run_id)
        total = check_budget(spec, budget_ms)
        if source_dir is not None:
            add_chain_root(source_dir)
        record = RunRecord(
            run_id=run_id,
            chain=spec.name,
            spec=spec_dump(spec),
            source=str(source_dir) if source_dir is not None else None,
            input=inputs,
            budget_total_ms=total,
            owner=new_lease(self.host, 1, self.lease_ttl_s),
            fencing_token=1,
        )
        record = self.trust.sign(record)
        record.attach_spec_json(spec_json(spec))  # the store writes it without serialising it
        await self._prepare(spec)
        await self.store.create_run(record)
        journal = RunJournal(self.store, record, {}, Clock(total))
        result = await self._execute(
            RunStart(record, total),
            spec,
            journal,
            source_dir=source_dir,
            progress=progress or self.progress,
        )
        return await self._parked(result, progress)

    async def resume(
        self,
        run_id: str,
        *,
        budget_ms: float | None = None,
        wait: bool = True,
        progress: Progress | None = None,
        record: RunRecord | None = None,
    ) -> RunResult:
        """Take over a run whose owner is gone and finish it; recorded steps do not run again.

        The run continues with the budget it had left, or with ``budget_ms`` more when given.
        With ``wait`` the call waits for a live owner's lease to expire; without, it refuses.
        A ``queued`` run (submitted to ``chainrt serve``) starts here for the first time.
        A record this runner does not trust (:class:`RecordTrust`) is refused before anything
        is claimed or run (UntrustedRecord); a completed run is returned as it is, running
        nothing. ``record``: the run's record as the caller has just read it (``chainrt
        serve``'s queue handler), not read again; one that went stale meanwhile fails the claim
        (its fencing token), as a change between this call's own read and its claim would.
        """
        if record is None or record.run_id != run_id:
            record = await self.store.get_run(run_id)
        first_start = record.status == "queued"
        done = await self._final(record)  # nothing runs: no code is resolved for it
        if done is not None:
            return done
        record = await wait_for_owner(
            self.store, record, host=self.host, ttl_s=self.lease_ttl_s, wait=wait
        )
        done = await self._final(record)  # its owner may have finished it while we waited
        if done is not None:
            return done
        # Checked on the record that will run (re-read while waiting), before the claim.
        spec = stored_spec(record)
        source_dir = self.trust.check(record, spec)
        if budget_ms is not None and budget_ms <= 0:
            raise BudgetError(f"budget must be greater than zero, got {budget_ms:g}ms")
        total = record.budget_total_ms if budget_ms is None else record.budget_used_ms + budget_ms
        if total - record.budget_used_ms < budget.DEFAULT_MIN_STEP_MS:
            raise BudgetError(
                f"run {run_id} has used {record.budget_used_ms:.0f}ms of its "
                f"{record.budget_total_ms:.0f}ms budget; resume it with a new budget (--budget)"
            )
        try:
            token = await claim(self.store, record, host=self.host, ttl_s=self.lease_ttl_s)
        except CheckpointError as exc:
            # Another process may have finished it between our read and our claim.
            if isinstance(exc, StoreUnavailable):
                raise
            done = await self._final(await self.store.get_run(run_id))
            if done is None:
                raise
            return done
        record = record.model_copy(
            update={"fencing_token": token, "budget_total_ms": total, "status": "running"}
        )
        # A queued run never claimed before (token 0) has no steps: nothing to read.
        fresh = first_start and token == 1
        steps = {} if fresh else await self.store.get_steps(run_id)
        await self._prepare(spec)
        links = [record.trace] if record.trace.get("trace_id") else []
        journal = RunJournal(self.store, record, steps, Clock(total, record.budget_used_ms))
        start = RunStart(record, total, resumed=not first_start, links=links)
        result = await self._execute(
            start,
            spec,
            journal,
            source_dir=source_dir,
            progress=progress or self.progress,
            new_total=budget_ms is not None,
        )
        return await self._parked(result, progress)

    async def _parked(self, result: RunResult, progress: Progress | None) -> RunResult:
        """A run that parked at a wait whose signal came meanwhile continues now
        (chainrt/runs/_signals.py); any other result is returned as it is."""
        if result.status != "waiting":
            return result
        return await continue_parked(
            self.store, result, lambda run_id: self.resume(run_id, wait=False, progress=progress)
        )

    async def _final(self, record: RunRecord) -> RunResult | None:
        """The result of a run a resume must leave as it is, else None: a completed run, or a
        failed run whose failing step ran but could not be recorded (a resume would run it
        again, side effects and all, and fail the same way)."""
        if record.status not in ("completed", "failed"):
            return None
        steps = await self.store.get_steps(record.run_id)
        if record.status == "failed" and repeats_side_effects(steps) is None:
            return None
        return RunResult.from_records(record, steps)

    async def _prepare(self, spec: ChainSpec) -> None:
        """Pay one-time process costs before the budget clock starts: loading the in-process
        model, importing the LangChain step executor. A long-lived runner pays them once."""
        self._runnable.prepare(spec)
        await self._llm.prepare(spec)
        await self._agent.prepare(spec)

    # ------------------------------------------------------------------ one execution

    async def _execute(
        self,
        start: RunStart,
        spec: ChainSpec,
        journal: RunJournal,
        *,
        source_dir: Path | None,
        progress: Progress,
        new_total: bool = False,
    ) -> RunResult:
        progress.run_started(journal.record, resumed=start.resumed)
        body = functools.partial(self._body, spec, journal, source_dir, progress, new_total)
        result = await chain_runs(self.interceptors, body)(start)
        progress.run_finished(result)
        return result

    async def _body(
        self,
        spec: ChainSpec,
        journal: RunJournal,
        source_dir: Path | None,
        progress: Progress,
        new_total: bool,
        start: RunStart,
    ) -> RunResult:
        """An execution inside its interceptors: heartbeat on, the loop, the lease given back."""
        task = asyncio.current_task()
        assert task is not None
        heartbeat = Heartbeat(
            self.store,
            journal.run_id,
            journal.token,
            self.lease_ttl_s,
            on_fenced=lambda: _cancel(task),
        )
        heartbeat.start()
        host = TaskHost()
        hosting = TOOL_HOST.set(host)
        journaling = TOOL_JOURNAL.set(journal)  # tools taking ctx write each attempt first
        # The run's token budget (max_tokens_total), what recorded steps used already spent.
        start_run_tokens(spec.max_tokens_total, journal.done.values())
        final = False
        release = True
        try:
            if start.trace or new_total:
                await journal.commit(
                    trace=start.trace,
                    budget_total=journal.clock.total_ms if new_total else None,
                )
            await self._loop(spec, journal, source_dir, progress)
            final = True
        except StoreUnavailable:
            # A write just failed against this store: a release would only wait on it
            # again, past the budget, and cannot land either.
            release = False
            raise
        except asyncio.CancelledError:
            if heartbeat.fenced:
                raise FencedOut(
                    f"run {journal.run_id} was taken over by another process; this one stopped "
                    f"({heartbeat.why})"
                ) from None
            raise
        finally:
            TOOL_HOST.reset(hosting)
            TOOL_JOURNAL.reset(journaling)
            host.close()
            await heartbeat.stop()
            if not final and release:
                # Cancelled or crashed inside the loop: give the lease back so that a
                # resume can start at once; the recorded steps stay.
                with contextlib.suppress(ChainRTError, asyncio.CancelledError):
                    await asyncio.shield(journal.release())
            journal.close()
        return journal.result()

    async def _loop(
        self, spec: ChainSpec, journal: RunJournal, source_dir: Path | None, progress: Progress
    ) -> None:
        """The budget loop: decide, run, settle, commit — step after step."""
        try:
            run_keys = await acquire_keys(
                self.limiter,
                spec.concurrency,
                journal.scope,
                within_ms=journal.clock.remaining_ms(),
                holder=f"{journal.run_id}:run",
            )
        except ConcurrencyRejected as exc:
            await journal.finish("rejected", error=exc.message, stopped_at=spec.steps[0].id)
            return
        except (ConcurrencyError, TemplateError) as exc:  # a key that cannot be a key
            await journal.finish(
                "failed", error=f"concurrency: {exc.message}", stopped_at=spec.steps[0].id
            )
            return
        journal.waits_ms.update(run_keys.waits_ms)
        scope, run_id = journal.scope, journal.run_id
        # With no interceptor a step is called directly: no StepStart is made that none would see.
        step_call = (
            chain_steps(
                self.interceptors, functools.partial(self._step, scope, source_dir, progress)
            )
            if self.interceptors
            else None
        )
        try:
            if flows(spec):  # when or groups: chainrt/_run/_flow.py (a straight chain: below)
                await self._flow(spec, journal, source_dir, progress)
                return
            pending = journal.pending(spec.steps)
            plan = plan_for(spec, pending)  # sums the weights once: a step's decision costs O(1)
            for index, step in enumerate(pending):
                decision = plan.decide(index, journal.clock.remaining_ms())
                if isinstance(decision, budget.Stop):
                    await journal.finish(
                        "partial", error=f"budget: {decision.reason}", stopped_at=step.id
                    )
                    return
                if isinstance(decision, budget.Skip):
                    skipped = skipped_record(step, decision.reason)
                    if await end_step(journal, progress, step, skipped, None):
                        return
                    continue
                if step_call is None:
                    done = await self._run_step(
                        scope, source_dir, progress, run_id, step, decision.ms
                    )
                else:
                    done = await step_call(StepStart(run_id, step, decision.ms))
                record, stop = settle(step, done)
                if await end_step(journal, progress, step, record, stop):
                    return
            try:
                output = run_output(spec, journal.scope)
            except ChainRTError as exc:
                await journal.finish("failed", error=f"output: {exc.message}")
                return
            await finish_output(journal, output)
        finally:
            await run_keys.release()

    async def _flow(
        self, spec: ChainSpec, journal: RunJournal, source_dir: Path | None, progress: Progress
    ) -> None:
        """The budget loop of a chain with ``when`` or groups: every step at every depth."""

        def call(step: StepSpec, allot_ms: float, scope: dict[str, Any]) -> Any:
            if not self.interceptors:
                return self._run_step(scope, source_dir, progress, run_id, step, allot_ms)
            inner = functools.partial(self._step, scope, source_dir, progress)
            return chain_steps(self.interceptors, inner)(StepStart(run_id, step, allot_ms))

        run_id = journal.run_id
        flow = FlowRun(journal, progress, call, ModelsView(self.dispatcher), self.interceptors)
        token = FLOW.set(flow)
        try:
            clock = journal.clock
            ended = await flow.sequence(spec.steps, "", journal.scope, clock.remaining_ms, top=True)
            if ended.stop is not None:
                return
            try:
                output = run_output(spec, journal.scope)
            except ChainRTError as exc:
                await journal.finish("failed", error=f"output: {exc.message}")
                return
            await finish_output(journal, output)
        finally:
            FLOW.reset(token)

    def _step(
        self,
        scope: dict[str, Any],
        source_dir: Path | None,
        progress: Progress,
        start: StepStart,
    ) -> Coroutine[Any, Any, StepRecord]:
        """One step inside its interceptors."""
        return self._run_step(
            scope, source_dir, progress, start.run_id, start.step, start.allotted_ms
        )

    async def _run_step(
        self,
        scope: dict[str, Any],
        source_dir: Path | None,
        progress: Progress,
        run_id: str,
        step: StepSpec,
        allot_ms: float,
    ) -> StepRecord:
        """One step, from its allotment to its record."""
        model = step.llm.model if step.llm is not None else None
        if model is None and step.agent is not None:
            model = step.agent.model
        if model is None:  # only LLM and agent steps' executors report attempts and tokens
            progress.step_started(step, allot_ms, None)
            executor = self._executor(step)
            return await run_step(run_id, step, allot_ms, scope, self.limiter, executor, source_dir)
        progress.step_started(step, allot_ms, model)
        token = STEP_PROGRESS.set(progress)
        try:
            executor = self._llm if step.llm is not None else self._agent
            return await run_step(run_id, step, allot_ms, scope, self.limiter, executor, source_dir)
        finally:
            STEP_PROGRESS.reset(token)

    def _executor(self, step: StepSpec) -> KindExecutor:
        if step.wait is not None:
            return self._wait
        if step.llm is not None:
            return self._llm
        if step.agent is not None:
            return self._agent
        if step.tool is not None:
            return self._tool
        return self._runnable if step.runnable is not None else self._group


def _cancel(task: asyncio.Task[Any]) -> None:
    task.cancel()
