"""``degrade:`` on llm steps: what answers once the step's models, retries and fallbacks failed.

Actions run in the order written, the first that gives an answer wins:

- ``cache``: the last answer the step's own model gave to the same normalised prompt (kept in the
  checkpoint store, see :mod:`chainrt.store._answers`), if younger than the action's TTL. Every
  step with a ``cache`` action stores its model's answers there;
- ``{model: NAME}``: that (smaller) model, with the step's retries and no fallbacks, inside the
  step's remaining time;
- ``{static: TEXT}``: a template rendered with the step's scope plus ``run.id``.

The step then completes; its record says which action answered in ``degraded``
(``{"by": "cache", "age_s": ...}``, ``{"by": "model", "model": ...}`` or ``{"by": "static"}``),
``model``/``fallback`` name it (``cache``, the model, ``static``) and the attempt log gains an entry.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from typing import Any

from .._errors import ChainRTError
from .._records import AttemptRecord
from ..dispatch import Dispatcher, DispatchFailed, LlmAnswer, LlmCall
from ..spec import StepSpec, render_value
from ..spec._degrade import CacheAction, ModelAction, StaticAction
from ..store._answers import AnswerCache, cache_key
from ._step import StepOutcome
from ._verify import normalise_text

__all__ = ["degrade_outcome", "prompt_key"]


def prompt_key(call: LlmCall) -> str:
    """The cache key of a call: its model and its messages, each normalised."""
    prompt = json.dumps([[role, normalise_text(text)] for role, text in call.messages])
    return cache_key(call.model, f"{int(call.json_output)}:{prompt}")


async def degrade_outcome(
    dispatcher: Dispatcher,
    cache: AnswerCache,
    step: StepSpec,
    call: LlmCall,
    outcome: StepOutcome,
    answer: LlmAnswer | None,
    scope: dict[str, Any],
    run_id: str,
    deadline: float,
) -> StepOutcome:
    """The outcome after the step's degrade actions (unchanged when it has none or answered)."""
    caching = [a for a in step.degrade if isinstance(a, CacheAction)]
    if outcome.status == "completed":
        if caching and answer is not None and outcome.model == call.model:
            ttl_s = max(a.cache for a in caching) / 1000
            # A store error leaves the answer standing; a later degraded step finds no entry.
            with contextlib.suppress(ChainRTError):
                await cache.put(prompt_key(call), answer.text, ttl_s)
        return outcome
    if outcome.status not in ("failed", "timed_out") or not step.degrade:
        return outcome
    log = list(outcome.attempt_log)
    for action in step.degrade:
        started = time.perf_counter()
        if isinstance(action, CacheAction):
            found = await _cached(cache, call, action.cache / 1000, log, started)
            if found is not None:
                text, age_s = found
                return _answered(outcome, log, call, text, "cache", {"by": "cache", "age_s": age_s})
        elif isinstance(action, ModelAction):
            got = await _smaller(dispatcher, call, action.model, deadline, log)
            if got is not None:
                degraded = {"by": "model", "model": got.model}
                done = _answered(outcome, log, call, got.text, got.model, degraded)
                return dataclasses.replace(done, confidence_score=got.confidence)
        elif isinstance(action, StaticAction):
            text = str(render_value(action.static, {**scope, "run": {"id": run_id}}))
            log.append(_entry(log, "static", "ok", started, "degraded to the static answer"))
            return _answered(outcome, log, call, text, "static", {"by": "static"})
    return dataclasses.replace(outcome, attempt_log=log, attempts=len(log))


async def _cached(
    cache: AnswerCache, call: LlmCall, ttl_s: float, log: list[AttemptRecord], started: float
) -> tuple[str, float] | None:
    try:
        hit = await cache.get(prompt_key(call))
    except ChainRTError as exc:
        log.append(_entry(log, "cache", "error", started, f"answer cache unreadable: {exc}"))
        return None
    age_s = None if hit is None else round(max(0.0, time.time() - hit[1]), 3)
    if hit is None or age_s is None or age_s > ttl_s:
        log.append(_entry(log, "cache", "miss", started, "no cached answer to this prompt"))
        return None
    log.append(_entry(log, "cache", "ok", started, f"cached answer, {age_s:.1f}s old"))
    return hit[0], age_s


async def _smaller(
    dispatcher: Dispatcher, call: LlmCall, model: str, deadline: float, log: list[AttemptRecord]
) -> LlmAnswer | None:
    again = dataclasses.replace(call, model=model, fallbacks=[], static_answer=None)
    try:
        got = await dispatcher.complete(again, deadline)
    except DispatchFailed as exc:
        log.extend(
            r.model_copy(update={"attempt": len(log) + i + 1}) for i, r in enumerate(exc.attempts)
        )
        return None
    log.extend(
        r.model_copy(update={"attempt": len(log) + i + 1}) for i, r in enumerate(got.attempts)
    )
    return None if got.partial else got


def _entry(
    log: list[AttemptRecord], model: str, status: str, started: float, detail: str
) -> AttemptRecord:
    return AttemptRecord(
        attempt=len(log) + 1,
        model=model,
        status=status,
        elapsed_ms=round((time.perf_counter() - started) * 1000, 3),
        detail=detail,
    )


def _answered(
    outcome: StepOutcome,
    log: list[AttemptRecord],
    call: LlmCall,
    text: str,
    by: str,
    degraded: dict[str, Any],
) -> StepOutcome:
    output: Any = text
    if call.json_output:
        try:
            output = json.loads(text)
        except ValueError:
            output = text
    return dataclasses.replace(
        outcome,
        status="completed",
        output=output,
        model=by,
        fallback=by,
        error=None,
        attempt_log=log,
        attempts=len(log),
        degraded=degraded,
    )
