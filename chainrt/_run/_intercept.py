"""Interceptors: code wrapped around each run and each step, as the Temporal SDK's interceptors
wrap activities and workflows.

An interceptor sees a unit of work's input, calls ``call_next`` to run it (and the interceptors
inside it), and sees its result or exception; it may pass on a changed input. Tracing is one
(``chain.run`` and ``chain.step`` spans, :mod:`chainrt.tracing._intercept`); the runner knows
none of them by name. With no interceptors the runner calls its own code directly.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._records import RunRecord, StepRecord
from .._result import RunResult
from ._step import StepStart

if TYPE_CHECKING:
    from ._flow import Ended

__all__ = [
    "AgentPart",
    "AgentPartCall",
    "BranchCall",
    "BranchStart",
    "RunCall",
    "RunInterceptor",
    "RunStart",
    "StepCall",
    "chain_agent_parts",
    "chain_branches",
    "chain_runs",
    "chain_steps",
]


@dataclass(frozen=True, slots=True)
class BranchStart:
    """A branch of a group about to run as a sub-chain (a ``switch`` or ``parallel`` branch, a
    ``map`` item): the input of :meth:`RunInterceptor.execute_branch`."""

    run_id: str
    group: str
    """The group's path (``gather``, ``route.refund.inner``)."""
    kind: str
    """``branch`` (a switch case or a parallel branch) or ``item`` (a map item)."""
    name: str
    """The branch's name, or the item's index."""
    path: str
    """The branch's own path, its inner steps' prefix (``gather.kb``, ``per_item[3]``)."""


@dataclass(slots=True)
class AgentPart:
    """One model turn or one tool call of an ``agent`` step about to run: the input of
    :meth:`RunInterceptor.execute_agent_part`, whose ``call_next`` fills in how it ended."""

    run_id: str
    step: str
    """The agent step's path."""
    kind: str
    """``turn`` (a model turn) or ``call`` (a tool call)."""
    path: str
    """The part's record id: ``agent.turn[2]``, ``agent.call[2.1]``."""
    tool: str | None = None
    """A call's tool name (as the model named it)."""
    final: bool = False
    """A turn without tools that asks for the answer."""
    status: str | None = None
    """How it ended: its record's status (``waiting``: a call parked for its approval)."""
    error: str | None = None
    attempts: int = 0
    model: str | None = None
    """The model that answered a turn."""


@dataclass(frozen=True, slots=True)
class RunStart:
    """An execution of a run about to start (a new run, or a resume): the input of
    :meth:`RunInterceptor.execute_run`."""

    record: RunRecord
    """The run record as this execution starts (owner lease and fencing token taken)."""
    budget_ms: float
    """The run's total budget (a resume with a new budget: what was used plus the new one)."""
    resumed: bool = False
    links: list[dict[str, Any]] = field(default_factory=list)
    """Trace contexts of the executions this one resumes (empty for a new run)."""
    trace: dict[str, Any] | None = None
    """Trace context to store with the run (so a later resume can link back to it); an
    interceptor that opens a trace sets it, the runner writes it before the first step."""

    @property
    def run_id(self) -> str:
        """The run's id."""
        return self.record.run_id


RunCall = Callable[[RunStart], Awaitable[RunResult]]
StepCall = Callable[[StepStart], Awaitable[StepRecord]]
BranchCall = Callable[[BranchStart], Awaitable["Ended"]]
AgentPartCall = Callable[[AgentPart], Awaitable[AgentPart]]


class RunInterceptor:
    """Wraps executions of runs and of steps. Override what you need; the defaults pass through.

    ``execute_run`` covers an execution from its first checkpoint to its last (the lease given
    back); ``execute_step`` covers one step from its allotment to its record (key waits, retries,
    fallbacks), before the record is written. Both run in the run's own task.
    """

    async def execute_run(self, run: RunStart, call_next: RunCall) -> RunResult:
        """Run an execution: ``return await call_next(run)``."""
        return await call_next(run)

    async def execute_step(self, step: StepStart, call_next: StepCall) -> StepRecord:
        """Run one step: ``return await call_next(step)``."""
        return await call_next(step)

    async def execute_branch(self, branch: BranchStart, call_next: BranchCall) -> Ended:
        """Run one branch or map item of a group (its inner steps go through
        :meth:`execute_step` inside it): ``return await call_next(branch)``."""
        return await call_next(branch)

    async def execute_agent_part(self, part: AgentPart, call_next: AgentPartCall) -> AgentPart:
        """Run one model turn or tool call of an agent step (not a replayed one): ``return
        await call_next(part)``."""
        return await call_next(part)


def chain_runs(interceptors: Sequence[RunInterceptor], inner: RunCall) -> RunCall:
    """``inner`` wrapped by ``interceptors``, the first one outermost."""
    call = inner
    for interceptor in reversed(interceptors):
        call = functools.partial(_run_through, interceptor, call)
    return call


def chain_steps(interceptors: Sequence[RunInterceptor], inner: StepCall) -> StepCall:
    """``inner`` wrapped by ``interceptors``, the first one outermost."""
    call = inner
    for interceptor in reversed(interceptors):
        call = functools.partial(_step_through, interceptor, call)
    return call


def chain_branches(interceptors: Sequence[RunInterceptor], inner: BranchCall) -> BranchCall:
    """``inner`` wrapped by ``interceptors``, the first one outermost."""
    call = inner
    for interceptor in reversed(interceptors):
        call = functools.partial(_branch_through, interceptor, call)
    return call


def chain_agent_parts(
    interceptors: Sequence[RunInterceptor], inner: AgentPartCall
) -> AgentPartCall:
    """``inner`` wrapped by ``interceptors``, the first one outermost."""
    call = inner
    for interceptor in reversed(interceptors):
        call = functools.partial(_part_through, interceptor, call)
    return call


async def _part_through(
    interceptor: RunInterceptor, call_next: AgentPartCall, part: AgentPart
) -> AgentPart:
    return await interceptor.execute_agent_part(part, call_next)


async def _branch_through(
    interceptor: RunInterceptor, call_next: BranchCall, branch: BranchStart
) -> Ended:
    return await interceptor.execute_branch(branch, call_next)


async def _run_through(interceptor: RunInterceptor, call_next: RunCall, run: RunStart) -> RunResult:
    return await interceptor.execute_run(run, call_next)


async def _step_through(
    interceptor: RunInterceptor, call_next: StepCall, step: StepStart
) -> StepRecord:
    return await interceptor.execute_step(step, call_next)
