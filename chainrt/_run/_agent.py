"""The ``agent`` step kind: model turns with tools, the proposed calls run, until an answer.

The loop (docs/chain-format.md, Agent steps): a turn offers the tools (its answer decoded into
:func:`~chainrt.agent._turns.turn_schema`); the calls it proposes are checked against their
schemas and run at once; their results (or errors: an unknown tool, bad arguments, a tool that
raised — fed back, the step goes on) return to the model in the next turn; until the model
answers, ``max_iterations`` turns have called tools, or the time left reaches the final reserve
(:mod:`chainrt.agent._budget`), when one last turn without tools asks for the answer.

Durability: each turn and each call is written under its path (``agent.turn[2]``,
``agent.call[2.1]``) as soon as it ends. A resume replays them from the records: a recorded turn
is not asked again, a recorded call never runs again; a call in flight at a crash runs at most
once more (``ctx.idempotency_key`` is ``run_id:agent.call[2.1]``). Retries and fallbacks apply
per turn, as for an ``llm`` step; a tool's own ``concurrency`` keys are held while it runs.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from .._errors import ChainRTError
from .._progress import NO_PROGRESS, STEP_PROGRESS
from .._records import StepRecord, TokenUsage
from ..agent import _budget as rules
from ..agent._tools import AgentTool, BadCall, check_call, load_tool
from ..agent._turns import (
    ANSWER_SCHEMA,
    FINAL_REQUEST,
    Proposed,
    read_turn,
    results_text,
    tools_text,
    turn_schema,
    unwrap_answer,
)
from ..budget._tokens import RUN_TOKENS
from ..concurrency import Limiter
from ..dispatch import Dispatcher, LlmCall
from ..spec import ChainSpec, StepSpec
from ..spec._agent import AgentSpec, call_path, turn_path
from ._agent_approval import Parked, decide, refusal
from ._agent_final import CUT_ERROR, KeptText, cut_outcome, unanswered
from ._agent_messages import first_messages
from ._agent_tool_run import run_agent_tool
from ._agent_writes import PendingWrites, beside
from ._intercept import AgentPart, RunInterceptor, chain_agent_parts
from ._journal import RunJournal, _Unrecordable
from ._llm import _answered, prepare_models
from ._recording import unrecorded
from ._step import StepOutcome
from ._tool import TOOL_JOURNAL

__all__ = ["AgentExecutor"]

_T = TypeVar("_T")

WRITE_WINDOW = 20
"""How many of the latest record writes :meth:`AgentExecutor.writes_ms` is judged from."""

_RECORDED = frozenset({"completed", "failed"})
"""A call record in one of these states ran to its end: it is never run again."""


class AgentExecutor:
    """Runs ``agent`` steps: their model turns through the dispatcher, their tools here."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        limiter: Limiter,
        allowed_modules: tuple[str, ...] = (),
        interceptors: Sequence[RunInterceptor] = (),
    ) -> None:
        self.dispatcher = dispatcher
        self.limiter = limiter
        self.allowed_modules = allowed_modules
        self.interceptors = tuple(interceptors)
        """Wrapped around each model turn and each tool call that runs (tracing's spans)."""
        self._tools: dict[tuple[str, Path], list[AgentTool]] = {}
        self.writes: collections.deque[float] = collections.deque(maxlen=WRITE_WINDOW)
        """The latest record writes of turns and calls, in ms (:meth:`writes_ms`)."""

    async def prepare(self, spec: ChainSpec) -> None:
        """Get the agents' models ready before the budget clock runs (as the llm executor)."""
        await prepare_models(
            self.dispatcher, spec, lambda step: None if step.agent is None else step.agent.model
        )

    def tools(self, step: StepSpec, chain_dir: Path) -> list[AgentTool]:
        """The step's tools, resolved once per (step, chain directory)."""
        assert step.agent is not None
        key = (repr(step.agent.tools), chain_dir)
        tools = self._tools.get(key)
        if tools is None:
            tools = [load_tool(t, chain_dir, self.allowed_modules) for t in step.agent.tools]
            self._tools[key] = tools
        return tools

    async def run(
        self,
        step: StepSpec,
        scope: dict[str, Any],
        *,
        run_id: str,
        deadline: float,
        source_dir: Path | None,
    ) -> StepOutcome:
        """Run the agent ``step`` (named by its path) until ``deadline`` (unix seconds)."""
        agent = step.agent
        assert agent is not None
        try:
            tools = self.tools(step, source_dir or Path.cwd())
        except ChainRTError as exc:
            return StepOutcome("failed", error=f"agent tools: {exc.message}")
        allotted_ms = (deadline - time.time()) * 1000
        loop = _Loop(self, step, agent, tools, scope, run_id, deadline, allotted_ms)
        return await loop.run()

    def reserve_ms(self, agent: AgentSpec, allotted_ms: float) -> float:
        """The agent's final reserve now (``auto`` follows the model's latest answer times)."""
        fixed = agent.final_reserve_ms()
        p90 = (
            None
            if fixed is not None
            else self.dispatcher.latency.p90(agent.model, time.monotonic())
        )
        return rules.final_reserve_ms(fixed, p90, allotted_ms)

    def writes_ms(self) -> float:
        """The time kept before the final reserve for writing the last records of the work."""
        return rules.write_allowance_ms(self.writes)


class _Loop:
    """One execution of one agent step."""

    def __init__(
        self,
        executor: AgentExecutor,
        step: StepSpec,
        agent: AgentSpec,
        tools: list[AgentTool],
        scope: dict[str, Any],
        run_id: str,
        deadline: float,
        allotted_ms: float,
    ) -> None:
        self.x = executor
        self.step, self.agent, self.scope = step, agent, scope
        self.tools = {t.name: t for t in tools}
        self.schema = turn_schema(
            tools, agent.max_calls_per_turn, strict=agent.constrain == "calls"
        )
        self.run_id, self.deadline, self.allotted_ms = run_id, deadline, allotted_ms
        self.reserve_ms = executor.reserve_ms(agent, allotted_ms)
        self.journal: RunJournal | None = TOOL_JOURNAL.get()
        self.messages = first_messages(agent, scope, tools_text(tools, agent.max_calls_per_turn))
        self.calls: list[dict[str, Any]] = []
        self.attempts = 0
        self.model: str | None = None
        self.fallback: str | None = None
        self.turn = 0
        self.pending = PendingWrites(self._write)
        """Records being written beside the next request (the last turn's: _agent_writes)."""
        self.told: list[dict[str, Any]] | None = None
        """The last turn's calls as the model was told them (the last user message)."""

    @property
    def work_deadline(self) -> float:
        """When turns with tools and their calls must end: their records are written by the
        time the final reserve starts."""
        return self.deadline - (self.reserve_ms + self.x.writes_ms()) / 1000

    def _done(self, path: str) -> StepRecord | None:
        return None if self.journal is None else self.journal.done.get(path)

    async def run(self) -> StepOutcome:
        try:
            return await self._loop()
        finally:
            if self.pending:  # a step ended early (an error): its calls' records still land
                await self.pending.settle()

    async def _settle(self) -> bool:
        """Wait for the records being written; True when the store refused a call's (the
        model is then told its error: the last message says so)."""
        refused = await self.pending.settle()
        if refused and self.told is not None:
            self.messages[-1] = ("user", results_text(self.told))
        return refused

    def _next_move(self, tool_turns: int) -> rules.Move:
        # Each turn its answer time: the reserve follows the model's latest answers.
        self.reserve_ms = self.x.reserve_ms(self.agent, self.allotted_ms)
        return rules.next_move(
            tool_turns=tool_turns,
            max_iterations=self.agent.max_iterations,
            left_ms=(self.deadline - time.time()) * 1000,
            reserve_ms=self.reserve_ms,
            writes_ms=self.x.writes_ms(),
        )

    async def _loop(self) -> StepOutcome:
        path, agent = self.step.id, self.agent
        turn, tool_turns = 0, 0
        while True:
            self.turn = turn
            tpath = turn_path(path, turn)
            recorded = self._done(tpath)
            if (
                recorded is not None
                and recorded.status == "completed"
                and isinstance(recorded.output, dict)
            ):
                await self._settle()
                output = recorded.output  # replayed: the model is not asked again
                self.attempts += recorded.attempts
                self.model = recorded.model or self.model
                self.fallback = recorded.fallback or self.fallback
            else:
                move = self._next_move(tool_turns)
                if not move.final and self.pending:  # a turn with tools: after the records
                    await self._settle()
                    move = self._next_move(tool_turns)
                part = AgentPart(self.run_id, path, "turn", tpath, final=move.final)
                ended = await self._traced(part, functools.partial(self._turn, tpath, move))
                if isinstance(ended, StepOutcome):
                    return ended
                output = ended
            text = str(output.get("text", ""))
            if output.get("final"):
                return self._answered(unwrap_answer(text), str(output.get("stopped")), turn)
            read = read_turn(text, agent.max_calls_per_turn)
            if read.answer is not None:
                return self._answered(read.answer, "answer", turn)
            tool_turns += 1
            ran = await asyncio.gather(*(self._call(turn, i, c) for i, c in enumerate(read.calls)))
            parked = [r for r in ran if isinstance(r, Parked)]
            if parked:  # the run parks; the calls that ended are recorded and replayed
                await self._settle()
                first = parked[0]
                return StepOutcome(
                    "waiting",
                    output={"approval": first.signal, "call": first.path, "tool": first.tool},
                    attempts=self.attempts,
                    model=self.model,
                    error=f"waiting for approval {first.signal!r} of call {first.path} "
                    f"({first.tool})",
                )
            results = [r for r in ran if not isinstance(r, Parked)]
            self.calls.extend(results)
            self.told = results  # their entries are corrected in place if a record is refused
            self.messages.append(("assistant", text))
            self.messages.append(("user", results_text(results)))
            turn += 1

    async def _traced(self, part: AgentPart, body: Callable[[AgentPart], Awaitable[_T]]) -> _T:
        """``body(part)`` inside the interceptors' ``execute_agent_part`` (a span each)."""
        if not self.x.interceptors:
            return await body(part)
        out: list[_T] = []

        async def inner(start: AgentPart) -> AgentPart:
            out.append(await body(start))
            return start

        await chain_agent_parts(self.x.interceptors, inner)(part)
        if not out:
            raise ChainRTError(f"an interceptor did not run {part.path} (call_next not awaited)")
        return out[0]

    def _answered(self, answer: str, stopped: str, turn: int) -> StepOutcome:
        return StepOutcome(
            "completed",
            output={
                "answer": answer,
                "calls": self.calls,
                "iterations": turn + 1,
                "stopped": stopped,
            },
            attempts=self.attempts,
            model=self.model,
            fallback=self.fallback,
        )

    # ------------------------------------------------------------------------ a model turn

    async def _turn(
        self, tpath: str, move: rules.Move, part: AgentPart
    ) -> dict[str, Any] | StepOutcome:
        """Ask the model; write the turn's record (how it ended also into ``part``). Its
        output, or the step's end. The last turn is asked while the records before it are
        still being written (its own is written after theirs) and keeps the answer it had
        begun when the deadline cuts it (:mod:`._agent_final`)."""
        while True:
            final = move.final
            messages = self.messages if not final else [*self.messages, ("user", FINAL_REQUEST)]
            call = self._call_for(tpath, messages, final)
            kept = KeptText()
            if final:
                kept.attach(call)
            turn_deadline = self.deadline if final else self.work_deadline
            started, t0 = time.time(), time.perf_counter()
            asking = _answered(self.x.dispatcher, call, turn_deadline)
            got = await beside(asking, self._settle) if self.pending else await asking
            if got is None:  # it told a result whose record the store refused: ask again
                continue
            outcome, answer = got
            self.attempts += outcome.attempts
            account = RUN_TOKENS.get()
            if account is not None:
                account.spend(TokenUsage.of([a.usage for a in outcome.attempt_log]))
            ok = answer is not None and outcome.status == "completed"
            cut = None if ok or not final else kept.cut(outcome.status == "timed_out", answer)
            status = outcome.status if outcome.status != "partial" else "timed_out"
            output: dict[str, Any] | None = None
            if ok and answer is not None:
                self.model, self.fallback = answer.model, outcome.fallback or self.fallback
                output = {"text": answer.text, "final": final}
                if final:
                    output["stopped"] = move.why
                status = "completed"
            elif cut is not None:  # the answer begun before the deadline (docs: Agent steps)
                self.model = cut.model or outcome.model or self.model
                if self.model != self.agent.model:
                    self.fallback = self.model
                output = {"text": cut.text, "final": True, "stopped": "budget", "cut": True}
                status = "partial"
            record = StepRecord(
                step_id=tpath,
                status=status,
                output=output,
                attempts=outcome.attempts,
                model=outcome.model if cut is None else self.model,
                fallback=outcome.fallback,
                allotted_ms=round((turn_deadline - started) * 1000, 3),
                elapsed_ms=round((time.perf_counter() - t0) * 1000, 3),
                started_at=started,
                finished_at=time.time(),
                error=outcome.error if cut is None else CUT_ERROR,
                attempt_log=outcome.attempt_log,
            )
            part.final, part.status, part.error = final, record.status, record.error
            part.attempts, part.model = record.attempts, record.model
            to_final = not final and self.deadline - time.time() > 0.0 and status == "timed_out"
            if to_final:  # the reserve began: answer now, this record written beside it
                self.pending.start(record)
                move = rules.Move(final=True, why="budget")
                continue
            written = await self._write(record)
            part.status, part.error = written.status, written.error
            if written is not record:  # a turn the store cannot take ends the step
                return StepOutcome(
                    "failed", attempts=self.attempts, model=outcome.model, error=written.error
                )
            if cut is not None:
                return cut_outcome(
                    self.step.id,
                    cut.answer,
                    self.calls,
                    self.turn + 1,
                    attempts=self.attempts,
                    model=self.model,
                    fallback=self.fallback,
                )
            if output is not None:
                return output
            # No answer at all: the turn's record keeps its attempts (and their usage).
            return unanswered(
                tpath, status, move.why, self.calls, self.turn + 1, self.attempts, outcome
            )

    def _call_for(self, tpath: str, messages: list[tuple[str, str]], final: bool) -> LlmCall:
        step, agent = self.step, self.agent
        call = LlmCall(
            model=agent.model,
            messages=list(messages),
            max_tokens=agent.max_tokens,
            temperature=agent.temperature,
            json_output=True,
            json_schema=ANSWER_SCHEMA if final else self.schema,
            fallbacks=list(step.fallbacks),
            attempts=step.retry.attempts,
            backoff_ms=step.retry.backoff,
            max_backoff_ms=step.retry.max_backoff,
            attempt_timeout_ms=step.attempt_timeout,
            run_id=self.run_id,
            step_id=tpath,
        )
        progress = STEP_PROGRESS.get()
        if progress is not NO_PROGRESS:
            call.on_attempt = functools.partial(progress.attempt, step.id)
            if progress.wants_tokens:
                call.on_token = functools.partial(progress.token, step.id)
        account = RUN_TOKENS.get()
        if account is not None:
            call.tokens_left = account.left
        return call

    # ------------------------------------------------------------------------ a tool call

    async def _call(self, turn: int, index: int, proposed: Proposed) -> dict[str, Any] | Parked:
        """Run (or replay) one proposed call; its entry in the step's ``calls`` (or Parked:
        it waits for its approval)."""
        cpath = call_path(self.step.id, turn, index)
        recorded = self._done(cpath)
        if recorded is not None and recorded.status in _RECORDED:
            return dict(recorded.output or {})  # replayed: never run again
        part = AgentPart(self.run_id, self.step.id, "call", cpath, tool=str(proposed.name))
        return await self._traced(
            part, functools.partial(self._new_call, cpath, proposed, recorded)
        )

    async def _new_call(
        self, cpath: str, proposed: Proposed, recorded: StepRecord | None, part: AgentPart
    ) -> dict[str, Any] | Parked:
        """Run one call (after its approval, if its tool needs one): its entry; how it ended
        also into ``part``."""
        entry: dict[str, Any] = {"name": proposed.name, "arguments": proposed.arguments}
        started, t0 = time.time(), time.perf_counter()
        status, error, attempts = "completed", None, 0
        try:
            kwargs = check_call(self.tools, proposed.name, proposed.arguments)
        except BadCall as exc:
            status, error = "failed", exc.message
        else:
            tool = self.tools[str(proposed.name)]
            decision = None
            if tool.approval is not None:
                decided = await decide(
                    self.journal,
                    self.run_id,
                    (tool.approval, tool.name, cpath),
                    entry,
                    recorded,
                    self._write,
                )
                if isinstance(decided, Parked):
                    part.status = "waiting"
                    return decided
                decision = decided
            if decision is not None and not decision.approve:
                status, error = "failed", refusal(tool.approval, decision)
            else:
                outcome = await run_agent_tool(
                    self.x.limiter, tool, kwargs, self.scope, self.run_id, cpath, self.work_deadline
                )
                attempts = outcome.attempts
                if outcome.status == "completed":
                    entry["result"] = outcome.output
                else:
                    status, error = "failed", outcome.error or outcome.status
        if error is not None:
            entry["error"] = error
        record = StepRecord(
            step_id=cpath,
            status=status,
            output=dict(entry),
            attempts=attempts,
            allotted_ms=round(max(self.work_deadline - started, 0.0) * 1000, 3),
            elapsed_ms=round((time.perf_counter() - t0) * 1000, 3),
            started_at=started,
            finished_at=time.time(),
            error=error,
        )
        part.status, part.error, part.attempts = status, error, attempts
        # Written beside what comes next (_agent_writes): the next turn with tools waits for
        # it, the last turn is asked at once. A record the store cannot take: the model is
        # told so (the entry is corrected in place).
        self.pending.start(record, entry)
        return entry

    async def _write(self, record: StepRecord) -> StepRecord:
        """Write ``record``; what was written (a storable ``failed`` record, without the
        output, when the store cannot take it: the call is not run again on resume)."""
        if self.journal is None:
            return record
        try:
            t0 = time.perf_counter()
            await self.journal.record_step(record)
            self.x.writes.append((time.perf_counter() - t0) * 1000)
        except _Unrecordable as exc:
            record = unrecorded(record, exc.message)
            await self.journal.record_step(record)
        return record
