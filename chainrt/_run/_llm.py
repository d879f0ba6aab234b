"""The ``llm`` step kind: render the messages, hand the call to the dispatcher, read its answer.

Retries, fallbacks, the static answer and every deadline below the step's live in dispatch
 (docs/dispatch.md); this executor only turns a step into an :class:`~chainrt.dispatch.LlmCall` and the
dispatcher's answer (or failure) into a step outcome.
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._errors import ChainRTError
from .._progress import NO_PROGRESS, STEP_PROGRESS
from .._records import TokenUsage
from ..budget._tokens import RUN_TOKENS, out_of_tokens
from ..dispatch import Dispatcher, DispatchFailed, LlmAnswer, LlmCall
from ..spec import ChainSpec, StepSpec, render_value
from ..spec._flow_check import all_steps
from ..store._answers import AnswerCache, answer_cache
from ._contradiction import checked_outcome
from ._degrade import degrade_outcome
from ._step import StepOutcome
from ._verify import verify_outcome

__all__ = ["LlmExecutor", "llm_call", "run_llm"]

_DEADLINE_SLACK_S = 0.005
"""A dispatch failure this close to the deadline counts as the step timing out."""


def llm_call(step: StepSpec, scope: dict[str, Any], run_id: str) -> LlmCall:
    """The dispatcher's call for an ``llm`` step, its templates rendered against ``scope``."""
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
        json_output=llm.json_output or llm.json_schema is not None,
        json_schema=llm.json_schema,
        stop=llm.stop,
        hedge_quantile=None if llm.hedge is None else llm.hedge.quantile,
        hedge_after_ms=None if llm.hedge is None else llm.hedge.delay_ms,
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
        low_confidence_below=None if step.verify is None else step.verify.below,
        run_id=run_id,
        step_id=step.id,
    )


async def run_llm(dispatcher: Dispatcher, call: LlmCall, deadline: float) -> StepOutcome:
    """Dispatch an LLM call; JSON steps get their output parsed."""
    return (await _answered(dispatcher, call, deadline))[0]


async def _answered(
    dispatcher: Dispatcher, call: LlmCall, deadline: float
) -> tuple[StepOutcome, LlmAnswer | None]:
    """The step's outcome and, when a model answered, its answer."""
    try:
        answer = await dispatcher.complete(call, deadline)
    except DispatchFailed as exc:
        # A step the run's token budget cannot fit is one whose time ran out (max_tokens_total).
        timed_out = deadline - time.time() <= _DEADLINE_SLACK_S or any(
            out_of_tokens(a.detail) for a in exc.attempts
        )
        return StepOutcome(
            "timed_out" if timed_out else "failed",
            attempts=len(exc.attempts),
            model=call.model,
            error=exc.message,
            attempt_log=exc.attempts,
        ), None
    output: Any = answer.text
    if call.json_output and not answer.partial:
        try:
            output = json.loads(answer.text)  # models' answers were checked by the dispatcher
        except ValueError:
            output = answer.text  # a static answer that is plain text stays text
    return StepOutcome(
        "partial" if answer.partial else "completed",
        output=output,
        attempts=len(answer.attempts),
        model=answer.model,
        fallback=answer.model if answer.model != call.model else None,
        attempt_log=answer.attempts,
        confidence_score=answer.confidence,
    ), answer


async def prepare_models(
    dispatcher: Dispatcher, spec: ChainSpec, model_of: Callable[[StepSpec], str | None]
) -> None:
    """Get the models of ``spec``'s steps ready (load the in-process model) before the budget
    clock runs, for the llm and agent executors: each step's ``model_of`` (None: not such a
    step) and its fallbacks. A model that fails to get ready is not an error here: its steps
    record the failure."""
    names = sorted(
        {
            name
            for step in all_steps(spec)
            if (model := model_of(step)) is not None
            for name in (model, *step.fallbacks)
        }
    )
    if names:
        with contextlib.suppress(ChainRTError):
            await dispatcher.prepare(names)


class LlmExecutor:
    """Runs ``llm`` steps through one dispatcher."""

    def __init__(self, dispatcher: Dispatcher, store: Any = None) -> None:
        self.dispatcher = dispatcher
        self.cache = AnswerCache() if store is None else answer_cache(store)
        """Where ``degrade: [cache]`` keeps answers: the checkpoint store given."""

    async def prepare(self, spec: ChainSpec) -> None:
        """Get the chain's models ready (load the in-process model) before the budget clock runs.

        A model that fails to get ready is not an error here: its steps record the failure.
        """
        await prepare_models(
            self.dispatcher, spec, lambda step: None if step.llm is None else step.llm.model
        )

    async def run(
        self,
        step: StepSpec,
        scope: dict[str, Any],
        *,
        run_id: str,
        deadline: float,
        source_dir: Path | None,
    ) -> StepOutcome:
        """Dispatch the step's call inside ``deadline``; attempts (and tokens, when wanted) go
        to the run's progress."""
        call = llm_call(step, scope, run_id)
        progress = STEP_PROGRESS.get()
        if progress is not NO_PROGRESS:
            step_id = step.id
            call.on_attempt = functools.partial(progress.attempt, step_id)
            if progress.wants_tokens:
                call.on_token = functools.partial(progress.token, step_id)
        account = RUN_TOKENS.get()
        if account is not None:
            call.tokens_left = account.left
        outcome, answer = await _answered(self.dispatcher, call, deadline)
        outcome = checked_outcome(call, outcome, answer)
        outcome = await verify_outcome(self.dispatcher, step, call, outcome, answer, deadline)
        outcome = await degrade_outcome(
            self.dispatcher, self.cache, step, call, outcome, answer, scope, run_id, deadline
        )
        if account is not None:
            account.spend(TokenUsage.of([a.usage for a in outcome.attempt_log]))
        return outcome
