"""``verify:`` on llm steps: a low-confidence answer is asked again of a second model, compared.

The step's answer carries the model's ``confidence_score``. When it is below ``verify.below``,
the same rendered request goes to the models of ``verify.with`` in order (each with the step's
retries, no fallbacks) until one answers; the two answers are compared with :func:`same_answer`:

- ``match``: the step keeps its answer;
- ``mismatch``: ``on_mismatch`` decides: ``flag`` keeps the first answer, ``fallback`` takes the
  second (the step's ``model`` becomes the verifier, ``fallback`` names it), ``fail`` fails the
  step;
- ``unverified``: no comparison was made: the answer was confident enough (or its model gives no
  score), or no verifier answered in time (the attempt log says why).
"""

from __future__ import annotations

import dataclasses
import json
import re
import unicodedata
from typing import Any

from ..dispatch import Dispatcher, DispatchFailed, LlmAnswer, LlmCall
from ..spec import StepSpec
from ._contradiction import find_contradictions, penalised, prompt_text
from ._step import StepOutcome

__all__ = ["normalise_text", "same_answer", "verify_outcome"]

_SPACES = re.compile(r"\s+")


def normalise_text(text: str) -> str:
    """Text as answers are compared: NFKC, case-folded, whitespace runs as one space, trimmed,
    trailing ``.``/``!`` dropped."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    return _SPACES.sub(" ", folded).strip().rstrip(".!").rstrip()


def same_answer(first: str, second: str, *, json_output: bool) -> bool:
    """True when two answers say the same: equal JSON values for JSON steps (text that does not
    parse is compared as text), else equal :func:`normalise_text`."""
    if json_output:
        try:
            return bool(json.loads(first) == json.loads(second))
        except ValueError:
            pass
    return normalise_text(first) == normalise_text(second)


async def verify_outcome(
    dispatcher: Dispatcher,
    step: StepSpec,
    call: LlmCall,
    outcome: StepOutcome,
    answer: LlmAnswer | None,
    deadline: float,
) -> StepOutcome:
    """The step's outcome after its ``verify:`` check (``outcome`` unchanged without one)."""
    spec = step.verify
    if spec is None or answer is None or outcome.status != "completed":
        return outcome
    score = outcome.confidence_score
    if score is None or score >= spec.below:
        return dataclasses.replace(outcome, verification_status="unverified")
    log = list(outcome.attempt_log)
    second: LlmAnswer | None = None
    for model in spec.with_models:
        again = dataclasses.replace(
            call, model=model, fallbacks=[], static_answer=None, on_token=None
        )
        try:
            second = await dispatcher.complete(again, deadline)
        except DispatchFailed as exc:
            log.extend(_renumber(exc.attempts, len(log)))
            continue
        log.extend(_renumber(second.attempts, len(log)))
        if second.partial or second.model == "static":
            second = None
            continue
        break
    attempts = outcome.attempts + (len(log) - len(outcome.attempt_log))
    base = dataclasses.replace(outcome, attempt_log=log, attempts=attempts)
    if second is None:
        return dataclasses.replace(base, verification_status="unverified")
    if same_answer(answer.text, second.text, json_output=call.json_output):
        return dataclasses.replace(base, verification_status="match")
    if spec.on_mismatch == "flag":
        return dataclasses.replace(base, verification_status="mismatch")
    if spec.on_mismatch == "fail":
        return dataclasses.replace(
            base,
            status="failed",
            output=None,
            verification_status="mismatch",
            error=(
                f"verification mismatch: {answer.model} (confidence {score:.3f}) and "
                f"{second.model} gave different answers"
            ),
        )
    found = find_contradictions(prompt_text(call), second.text)
    return dataclasses.replace(
        base,
        output=_output(second.text, call.json_output),
        model=second.model,
        fallback=second.model,
        verification_status="mismatch",
        confidence_score=penalised(second.confidence, found),
        contradictions=found or None,
    )


def _output(text: str, json_output: bool) -> Any:
    if json_output:
        try:
            return json.loads(text)
        except ValueError:
            return text
    return text


def _renumber(records: list[Any], start: int) -> list[Any]:
    """The verifier's attempt records, numbered on from the step's own."""
    return [r.model_copy(update={"attempt": start + i + 1}) for i, r in enumerate(records)]
