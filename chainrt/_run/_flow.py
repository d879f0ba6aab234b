"""The budget loop of a chain with control flow: ``when`` on any step, and groups.

A chain without ``when`` and groups never comes here (the runner's own loop runs it). Here one
loop, :meth:`FlowRun.sequence`, runs any list of steps as a sub-chain: the chain's own steps
(ending the run as the runner's loop does), a switch branch, a parallel branch, a map item. Every
step of it is written under its *path* (``gather.kb.search``, ``per_item[3].classify``) as soon as
it ends, so a resume runs no recorded step again at any depth. The groups themselves are in
:mod:`._groups`; their budget rules are pure functions in :mod:`chainrt.budget._flow`.
"""

from __future__ import annotations

import time
from collections import ChainMap
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from .._errors import TemplateError
from .._progress import Progress
from .._records import FINAL_STEP_STATUSES, StepRecord
from ..budget import _steps as budget
from ..spec import ChainSpec, StepSpec, render_value
from ..spec._cache import PerSpec
from ..spec._flow import CHOICE_SUFFIX, has_flow
from ._intercept import BranchStart, RunInterceptor, chain_branches
from ._journal import RunJournal, _Unrecordable
from ._plan import step_budget
from ._recording import end_step, unrecorded
from ._step import settle, skipped_record

__all__ = ["FLOW", "Ended", "FlowRun", "InFlight", "StepCaller", "flows", "left_ms", "named"]

StepCaller = Callable[[StepSpec, float, dict[str, Any]], Awaitable[StepRecord]]
"""Runs one step (a leaf, or a group through :mod:`._groups`) allotted ms, against a scope."""

FLOW: ContextVar[FlowRun | None] = ContextVar("chainrt_flow", default=None)
"""The control flow of the run executing in this task (set only for chains that have some)."""


@dataclass(frozen=True, slots=True)
class Ended:
    """How a list of steps ended: ``stop`` None when every step ran to its end, else the status
    it stopped with (``partial``, ``failed``, ``rejected``), where and why; ``last`` is the
    output of its last step that ended (a group's output is built from it)."""

    stop: str | None
    stopped_at: str | None = None
    error: str | None = None
    last: Any = None


@dataclass(frozen=True, slots=True)
class InFlight:
    """A step being called: the step under its path, when it started, the ms it was allotted."""

    step: StepSpec
    started_at: float
    allotted_ms: float


_flows: PerSpec[bool] = PerSpec(lambda spec: has_flow(spec.steps))


def flows(spec: ChainSpec) -> bool:
    """True when ``spec`` has ``when`` or groups at its top level (computed once per spec)."""
    return _flows.get(spec)


def left_ms(deadline: float) -> float:
    """Milliseconds until ``deadline`` (unix seconds)."""
    return (deadline - time.time()) * 1000


def named(step: StepSpec, path: str) -> StepSpec:
    """``step`` under its path: records, events, keys' holders and ``ctx`` carry the path.

    A copy with another id (made without validation: a path is not a valid step id, on
    purpose, so it can never name a step of the chain itself)."""
    if path == step.id:
        return step
    # What model_copy(update=) does, less its deep-copy machinery (a copy per inner step run).
    copied = object.__new__(type(step))
    fields = dict(step.__dict__)
    fields["id"] = path
    object.__setattr__(copied, "__dict__", fields)
    object.__setattr__(copied, "__pydantic_fields_set__", step.__pydantic_fields_set__ | {"id"})
    object.__setattr__(copied, "__pydantic_extra__", step.__pydantic_extra__)
    object.__setattr__(copied, "__pydantic_private__", step.__pydantic_private__)
    return copied


class FlowRun:
    """The control flow of one execution: the journal it writes to, how it runs one step, and
    what ``when`` and ``switch`` see of the models (``models.<name>.p99_ms``)."""

    def __init__(
        self,
        journal: RunJournal,
        progress: Progress,
        call_step: StepCaller,
        models: Mapping[str, Any],
        interceptors: Sequence[RunInterceptor] = (),
    ) -> None:
        self.interceptors = interceptors
        self.journal = journal
        self.progress = progress
        self.call_step = call_step
        self.models = models
        self.running: dict[str, InFlight] = {}
        """The steps being called right now, by path (a group cancelling a branch records them)."""

    # -------------------------------------------------------------------------- scopes

    @staticmethod
    def child_scope(scope: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
        """The scope of a branch or item: its steps' outputs on top of the enclosing ones."""
        steps = scope["steps"]
        child = {k: v for k, v in scope.items() if k != "step"}
        child["steps"] = ChainMap({}, steps)
        child.update(extra)
        return child

    def condition_scope(self, scope: Mapping[str, Any]) -> dict[str, Any]:
        """What ``when`` and ``switch`` see: the step's scope and the models' live view."""
        return {**scope, "models": self.models}

    def choice(self, path: str) -> Any:
        """The branch a switch at ``path`` took (recorded before the branch ran), or None."""
        record = self.journal.done.get(path + CHOICE_SUFFIX)
        return None if record is None else record.output

    def _visible(self, scope: dict[str, Any], step: StepSpec, path: str, output: Any) -> None:
        entry: dict[str, Any] = {"output": output}
        if step.switch is not None:
            entry["branch"] = self.choice(path)
        scope["steps"][step.id] = entry

    # -------------------------------------------------------------------------- writes

    async def write(self, record: StepRecord, stop: str | None) -> str | None:
        """Write an inner step's record; the stop status (``failed`` if the store refused it)."""
        try:
            await self.journal.record_step(record)
        except _Unrecordable as exc:
            record, stop = unrecorded(record, exc.message), "failed"
            await self.journal.record_step(record)
        self.progress.step_finished(record)
        return stop

    async def write_choice(self, path: str, branch: str | None) -> None:
        """Record a switch's choice before its branch runs (a resume never changes branch)."""
        now = time.time()
        record = StepRecord(
            step_id=path + CHOICE_SUFFIX,
            status="completed",
            output=branch,
            started_at=now,
            finished_at=now,
        )
        await self.journal.record_step(record)

    # -------------------------------------------------------------------------- the loop

    async def branch(
        self,
        start: BranchStart,
        steps: list[StepSpec],
        scope: dict[str, Any],
        remaining: Callable[[], float],
    ) -> Ended:
        """Run a group's branch or map item (``steps`` under ``start.path``) as a sub-chain,
        through the interceptors' :meth:`~RunInterceptor.execute_branch` (its span)."""

        if not self.interceptors:
            return await self.sequence(steps, start.path + ".", scope, remaining)

        async def inner(branch: BranchStart) -> Ended:
            return await self.sequence(steps, branch.path + ".", scope, remaining)

        return await chain_branches(self.interceptors, inner)(start)

    def when_fails(self, step: StepSpec, scope: Mapping[str, Any]) -> str | None:
        """Why ``step`` does not run (its ``when`` is false, or cannot be read), else None."""
        if step.when is None:
            return None
        try:
            value = render_value(step.when, self.condition_scope(scope))
        except TemplateError as exc:
            return f"when: {exc.message}"
        return None if value else "when: false"

    async def sequence(
        self,
        steps: list[StepSpec],
        prefix: str,
        scope: dict[str, Any],
        remaining: Callable[[], float],
        *,
        top: bool = False,
    ) -> Ended:
        """Run ``steps`` in order as a sub-chain with ``remaining()`` ms; each written under
        ``prefix + id``. With ``top``, these are the chain's own steps: a stop ends the run."""
        done = self.journal.done
        todo = []
        for step in steps:
            record = done.get(prefix + step.id)
            if record is None or record.status not in FINAL_STEP_STATUSES:
                todo.append(step)
        plan = budget.Plan([step_budget(s) for s in todo])
        last: Any = None
        index = -1
        for step in steps:
            path = prefix + step.id
            record = done.get(path)
            if record is not None and record.status in FINAL_STEP_STATUSES:
                self._visible(scope, step, path, record.output)
                last = record.output
                continue
            index += 1
            ended = await self._one(plan, index, step, path, scope, remaining, top)
            if ended is not None:
                return Ended(ended.stop, ended.stopped_at, ended.error, last)
            last = scope["steps"][step.id]["output"]
        return Ended(None, last=last)

    async def _one(
        self,
        plan: budget.Plan,
        index: int,
        step: StepSpec,
        path: str,
        scope: dict[str, Any],
        remaining: Callable[[], float],
        top: bool,
    ) -> Ended | None:
        """One step of :meth:`sequence`: when, decide, run, settle, write. Ended if it stops."""
        skip = None if step.when is None else self.when_fails(step, {**scope, "step": {"id": path}})
        stop: str | None = None
        if skip is None:
            decision = plan.decide(index, remaining())
            if isinstance(decision, budget.Stop):
                error = f"budget: {decision.reason}"
                if top:
                    await self.journal.finish("partial", error=error, stopped_at=path)
                return Ended("partial", path, error)
            if isinstance(decision, budget.Skip):
                skip = decision.reason
            else:
                called = named(step, path)
                self.running[path] = InFlight(called, time.time(), decision.ms)
                try:
                    record = await self.call_step(called, decision.ms, scope)
                finally:
                    self.running.pop(path, None)
                record, stop = settle(step, record)
        if skip is not None:
            record = skipped_record(named(step, path), skip)
        if top:
            if await end_step(self.journal, self.progress, step, record, stop):
                return Ended(stop or "failed", path, record.error)
            stored = self.journal.done.get(path, record)
        else:
            stop = await self.write(record, stop)
            stored = record
        if stop is not None:
            return Ended(stop, path, stored.error)
        self._visible(scope, step, path, stored.output)
        return None
