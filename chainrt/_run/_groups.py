"""The group step kinds: ``switch``, ``parallel`` and ``map`` (their budget: chainrt/budget/_flow.py).

A group runs like any step: the runner allots it time, takes its concurrency keys and calls
:meth:`GroupExecutor.run` with its deadline. Inside, each branch or item is a sub-chain run by
:meth:`~chainrt._run._flow.FlowRun.sequence`, which writes every inner step under its path. The
group's own record (its output, its status) is written by the loop that called it, after it.

- ``switch``: the expression picks a case (or ``default``); the choice is recorded first, under
  ``<path>#branch``, and a resume reads it instead of evaluating again. Output: the branch's last
  output (``steps.<id>.branch`` names the branch).
- ``parallel``: every branch runs at once until the group's deadline; ``join`` says when the
  group ends; branches still running then are cancelled (when the join was met, their steps in
  flight are recorded ``cancelled``). Output: ``{branch: last output}`` of the
  branches that completed.
- ``map``: one sub-chain per item, ``max_concurrency`` at a time, wave after wave. Output: the
  items' last outputs, in item order (``null`` for an item that did not complete).
"""

from __future__ import annotations

import asyncio
import functools
import time
from pathlib import Path
from typing import Any

from .._errors import TemplateError
from .._records import FINAL_STEP_STATUSES, StepRecord
from ..budget import _flow as rules
from ..spec import StepSpec, render_value
from ..spec._filters import kind
from ..spec._flow import CHOICE_SUFFIX, DEFAULT_BRANCH, item_path
from ._flow import FLOW, Ended, FlowRun, InFlight, left_ms
from ._intercept import BranchStart
from ._step import StepOutcome

__all__ = ["CUT_GRACE_S", "GroupExecutor"]

CUT_GRACE_S = 0.05
"""How long past the group's deadline a branch that has not ended is waited for before it is
cancelled (its steps end at their own deadlines, inside the group's; this is a backstop)."""

MAX_ITEMS = 100_000
"""The most items one map runs."""


class GroupExecutor:
    """The executor of group steps (the runner's executor for ``switch``, ``parallel``, ``map``)."""

    async def run(
        self,
        step: StepSpec,
        scope: dict[str, Any],
        *,
        run_id: str,
        deadline: float,
        source_dir: Path | None,
    ) -> StepOutcome:
        """Run the group ``step`` (named by its path) until ``deadline`` (unix seconds)."""
        flow = FLOW.get()
        if flow is None:  # a group outside a flow run: the runner always sets one
            return StepOutcome("failed", error="a group step ran outside a chain run")
        try:
            if step.switch is not None:
                return await _switch(flow, step, scope, deadline)
            if step.parallel is not None:
                return await _parallel(flow, step, scope, deadline)
            return await _map(flow, step, scope, deadline)
        except TemplateError as exc:
            return StepOutcome("failed", error=exc.message)


def _outcome(ended: Ended, where: str, output: Any) -> StepOutcome:
    if ended.stop is None:
        return StepOutcome("completed", output=output)
    why = f"{where}: step {ended.stopped_at}: {ended.error or ended.stop}"
    return StepOutcome(ended.stop, output=output, error=why)


async def _switch(
    flow: FlowRun, step: StepSpec, scope: dict[str, Any], deadline: float
) -> StepOutcome:
    path = step.id
    cases = step.cases or {}
    recorded = flow.journal.done.get(path + CHOICE_SUFFIX)
    if recorded is not None:
        branch = recorded.output  # chosen before a crash: a resume never changes branch
        shown = "its value"
    else:
        value = render_value(step.switch, flow.condition_scope(scope))
        branch = rules.switch_branch(value, list(cases), step.default is not None)
        shown = repr(value)[:60]
        await flow.write_choice(path, branch)
    if branch is None:
        return StepOutcome("skipped", error=f"switch: no case for {shown} and no default")
    steps = step.default if branch == DEFAULT_BRANCH else cases.get(branch)
    if not steps:  # a stored choice this spec has no branch for
        return StepOutcome("failed", error=f"switch: the recorded branch {branch!r} is unknown")
    ended = await flow.branch(
        BranchStart(flow.journal.run_id, path, "branch", branch, f"{path}.{branch}"),
        steps,
        flow.child_scope(scope),
        functools.partial(left_ms, deadline),
    )
    return _outcome(ended, f"branch {branch}", ended.last)


async def _parallel(
    flow: FlowRun, step: StepSpec, scope: dict[str, Any], deadline: float
) -> StepOutcome:
    path = step.id
    join: str | dict[str, int] = (
        step.join if isinstance(step.join, str) else {"quorum": step.join.quorum}
    )
    branches = step.parallel or {}
    to_run = _branches_to_run(flow, path, branches, join)
    if len(to_run) < len(branches):  # the join was met before a crash: close what it cut
        await _close_losers(flow, [f"{path}.{name}." for name in branches if name not in to_run])
    remaining = functools.partial(left_ms, deadline)
    run_id = flow.journal.run_id
    tasks = {
        asyncio.ensure_future(
            flow.branch(
                BranchStart(run_id, path, "branch", name, f"{path}.{name}"),
                steps,
                flow.child_scope(scope),
                remaining,
            )
        ): name
        for name, steps in to_run.items()
    }
    statuses: dict[str, str] = {}
    outputs: dict[str, Any] = {}
    errors: list[str] = []
    pending = set(tasks)
    joined = False
    arrivals = _Arrivals(pending, deadline + CUT_GRACE_S)
    try:
        while pending:
            finished = await arrivals.next()
            if not finished:  # past the deadline and its grace: cut what still runs
                for task in pending:
                    statuses[tasks[task]] = "partial"
                    errors.append(f"branch {tasks[task]}: cut at the group's deadline")
                break
            for task in finished:
                pending.discard(task)
                name, ended = tasks[task], task.result()
                statuses[name] = rules.branch_status(ended.stop)
                if ended.stop is None:
                    outputs[name] = ended.last
                else:
                    errors.append(_outcome(ended, f"branch {name}", None).error or name)
            if rules.join_state(join, list(statuses.values()), len(pending)) is not None:
                joined = bool(pending)
                break
    finally:
        arrivals.close()
        losers = tuple(f"{path}.{tasks[task]}." for task in pending)
        in_flight = [r for p, r in flow.running.items() if p.startswith(losers)] if losers else []
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=CUT_GRACE_S)
    if joined:
        await _write_cancelled(flow, in_flight)
    end = rules.join_state(join, list(statuses.values()), 0)
    status = end.status if end is not None else rules.worst(list(statuses.values()))
    ordered = {name: outputs[name] for name in tasks.values() if name in outputs}
    if status == "completed":
        return StepOutcome("completed", output=ordered)
    return StepOutcome(status, output=ordered, error="; ".join(errors) or status)


class _Arrivals:
    """The branch tasks of a group as they end, until a wall-clock ``until`` (unix seconds).

    One done-callback per task and one timer for the group, where ``asyncio.wait`` in a loop
    would add and remove a callback on every pending task (and a timer) each time one ends."""

    def __init__(self, tasks: set[asyncio.Task[Ended]], until: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._tasks = tasks.copy()
        self._ready: list[asyncio.Task[Ended]] = []
        self._wake: asyncio.Future[None] | None = None
        self._timed_out = False
        for task in self._tasks:
            task.add_done_callback(self._arrived)
        self._timer = self._loop.call_later(max(until - time.time(), 0.0), self._expire)

    def _arrived(self, task: asyncio.Task[Ended]) -> None:
        self._ready.append(task)
        self._poke()

    def _expire(self) -> None:
        self._timed_out = True
        self._poke()

    def _poke(self) -> None:
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    async def next(self) -> list[asyncio.Task[Ended]]:
        """The tasks that ended since the last call (waiting for one), or [] at ``until``."""
        if not self._ready and not self._timed_out:
            self._wake = self._loop.create_future()
            try:
                await self._wake
            finally:
                self._wake = None
        if not self._ready:
            return []
        ready, self._ready = self._ready, []
        return ready

    def close(self) -> None:
        """Stop the timer and stop hearing of the tasks."""
        self._timer.cancel()
        for task in self._tasks:
            task.remove_done_callback(self._arrived)


def _branches_to_run(
    flow: FlowRun, path: str, branches: dict[str, list[StepSpec]], join: str | dict[str, int]
) -> dict[str, list[StepSpec]]:
    """The branches a ``parallel`` group starts: all of them, unless a crash came after its join
    was met (the branches recorded complete already meet it). Then only those are replayed, so a
    resume never runs a loser's step again (its ``cancelled`` record stays as it was)."""
    done = [
        name
        for name, steps in branches.items()
        if all(
            (rec := flow.journal.done.get(f"{path}.{name}.{s.id}")) is not None
            and rec.status in FINAL_STEP_STATUSES
            for s in steps
        )
    ]
    if join == "all" or not done or len(done) == len(branches):
        return branches
    end = rules.join_state(join, ["completed"] * len(done), len(branches) - len(done))
    if end is not None and end.status == "completed":
        return {name: branches[name] for name in done}
    return branches


_CUT_BY_JOIN = "cancelled: the group's join was met by other branches"


def _cancelled(
    record: StepRecord | None, step_id: str, started_at: float, allotted_ms: float
) -> StepRecord:
    """The ``cancelled`` record of a step the join cut short: from the start of its ``running``
    record if it has one (a tool that takes ``ctx``; its attempts kept, so that a later run of
    the step counts on), else from ``started_at``."""
    now = time.time()
    if record is not None and record.status == "running" and record.started_at:
        started_at = min(started_at, record.started_at)
        base = record
    else:
        base = StepRecord(step_id=step_id, status="cancelled")
    return base.model_copy(
        update={
            "status": "cancelled",
            "error": _CUT_BY_JOIN,
            "allotted_ms": round(allotted_ms, 3),
            "started_at": started_at,
            "finished_at": now,
            "elapsed_ms": round(max(0.0, now - started_at) * 1000, 3),
        }
    )


async def _write_cancelled(flow: FlowRun, in_flight: list[InFlight]) -> None:
    """Record as ``cancelled`` the steps the join cut short (unless one ended meanwhile)."""
    for called in in_flight:
        recorded = flow.journal.done.get(called.step.id)
        if recorded is not None and recorded.status in FINAL_STEP_STATUSES:
            continue
        record = _cancelled(recorded, called.step.id, called.started_at, called.allotted_ms)
        await flow.write(record, None)


async def _close_losers(flow: FlowRun, prefixes: list[str]) -> None:
    """A resume after a crash that came between a join and the records of the steps it cut:
    the losers' steps still marked ``running`` (an attempt begun) are recorded ``cancelled``,
    as the crashed execution would have; they are not run again."""
    starts = tuple(prefixes)
    stale = [
        rec
        for key, rec in flow.journal.done.items()
        if rec.status == "running" and key.startswith(starts)
    ]
    for rec in stale:
        await flow.write(_cancelled(rec, rec.step_id, rec.started_at, rec.allotted_ms), None)


async def _map(
    flow: FlowRun, step: StepSpec, scope: dict[str, Any], deadline: float
) -> StepOutcome:
    path = step.id
    items = render_value(step.map, scope)
    if not isinstance(items, list):
        return StepOutcome("failed", error=f"map: expected a list, got {kind(items)}")
    if len(items) > MAX_ITEMS:
        return StepOutcome("failed", error=f"map: {len(items)} items, at most {MAX_ITEMS}")
    body = step.steps or []
    size = step.max_concurrency
    waves = rules.wave_count(len(items), size)
    outputs: list[Any] = [None] * len(items)
    statuses: list[str] = []
    errors: list[str] = []
    for wave in range(waves):
        share_ms = rules.wave_allotment(left_ms(deadline), waves - wave)
        remaining = functools.partial(left_ms, min(time.time() + share_ms / 1000, deadline))
        first = wave * size
        batch = range(first, min(first + size, len(items)))
        async with asyncio.TaskGroup() as group:
            runs = [
                group.create_task(
                    flow.branch(
                        BranchStart(
                            flow.journal.run_id, path, "item", str(index), item_path(path, index)
                        ),
                        body,
                        flow.child_scope(scope, item=items[index], index=index),
                        remaining,
                    )
                )
                for index in batch
            ]
        for index, task in zip(batch, runs, strict=True):
            ended = task.result()
            statuses.append(rules.branch_status(ended.stop))
            if ended.stop is None:
                outputs[index] = ended.last
            elif len(errors) < 3:
                errors.append(_outcome(ended, f"item {index}", None).error or str(index))
    status = rules.worst(statuses)
    if status == "completed":
        return StepOutcome("completed", output=outputs)
    failed = sum(1 for s in statuses if s != "completed")
    why = f"{failed} of {len(items)} items did not complete: " + "; ".join(errors)
    return StepOutcome(status, output=outputs, error=why)
