"""Contradictions between an llm step's prompt and its answer: a narrow confidence signal.

:func:`find_contradictions` is pure and looks for three things only, each a plain string finding:

- ``unsupported date 2024-03-05``: a date (``YYYY-MM-DD``, ``D/M/YYYY``) in the answer that the
  prompt does not contain;
- ``unsupported identifier ORD-7731``: a token of letters and digits (at least one letter, two
  digits, four characters; ``3pm``, ``10ms``, ``5th`` are numbers with a unit, not identifiers)
  absent from the prompt, case ignored;
- ``unsupported number 1250``: a number of two or more digits (or a decimal) absent from the
  prompt; ``1,250`` and ``1250``, ``3.50`` and ``3.5`` are the same number. Single digits are
  left alone (list markers, small counts);
- ``negates the prompt: "the order has shipped"``: an answer sentence that, with its negation
  (``not``, ``never``, ``no``, ``n't``) taken out, is word for word a stretch of at least three
  words of the prompt — the answer denies a fact it was given.

It cannot see paraphrase, arithmetic done right, or facts the model knows from elsewhere: an
answer that computes a total is flagged as unsupported. The step keeps its answer either way;
:data:`PENALTY` lowers its ``confidence_score`` (so ``verify:`` sends it to a second model) and
the findings are recorded in the step record's ``contradictions``.
"""

from __future__ import annotations

import dataclasses
import re
from decimal import Decimal, InvalidOperation

from ..dispatch import LlmAnswer, LlmCall
from ._step import StepOutcome

__all__ = [
    "MAX_FINDINGS",
    "PENALTY",
    "checked_outcome",
    "find_contradictions",
    "penalised",
    "prompt_text",
]

PENALTY = 0.5
"""The step's confidence score is multiplied by this when there is at least one finding."""
MAX_FINDINGS = 10
"""At most this many findings are kept (in answer order)."""

_DATE = re.compile(r"\b(?:\d{4}-\d{1,2}-\d{1,2}|\d{1,2}/\d{1,2}/\d{2,4})\b")
_TOKEN = re.compile(r"[A-Za-z0-9]+(?:[-_][A-Za-z0-9]+)*")
_NUMBER = re.compile(r"(?<![\w.])\d{1,3}(?:,\d{3})+(?:\.\d+)?|(?<![\w.])\d+(?:\.\d+)?")
_NUMBER_UNIT = re.compile(r"^(\d+(?:\.\d+)?)[a-z]{1,3}$", re.IGNORECASE)
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
_SENTENCE = re.compile(r"[.!?;\n]+")
_NEGATORS = frozenset({"not", "never", "no"})
_CONTRACTIONS = {
    "isn't": "is", "aren't": "are", "wasn't": "was", "weren't": "were", "hasn't": "has",
    "haven't": "have", "hadn't": "had", "can't": "can", "cannot": "can", "won't": "will",
    "doesn't": "does", "didn't": "did", "couldn't": "could", "shouldn't": "should",
    "wouldn't": "would",
}  # fmt: skip


def find_contradictions(prompt: str, answer: str) -> list[str]:
    """What ``answer`` states that ``prompt`` does not support or denies (see the module)."""
    findings: list[str] = []
    prompt_dates = {_date_key(d) for d in _DATE.findall(prompt)}
    rest = _DATE.sub(" ", prompt)
    prompt_ids = {t.casefold() for t in _TOKEN.findall(rest) if _is_identifier(t)}
    prompt_numbers = {_number_key(n) for n in _NUMBER.findall(rest)}
    for t in _TOKEN.findall(rest):
        unit = _NUMBER_UNIT.match(t)
        if unit:
            prompt_numbers.add(_number_key(unit.group(1)))

    for date in _DATE.findall(answer):
        if _date_key(date) not in prompt_dates:
            findings.append(f"unsupported date {date}")
    answer_rest = _DATE.sub(" ", answer)
    numbers: list[str] = []
    for token in _TOKEN.findall(answer_rest):
        if _is_identifier(token):
            if token.casefold() not in prompt_ids:
                findings.append(f"unsupported identifier {token}")
            continue
        unit = _NUMBER_UNIT.match(token)
        if unit:
            numbers.append(unit.group(1))
    ids_removed = _TOKEN.sub(lambda m: " " if _is_identifier(m.group()) else m.group(), answer_rest)
    numbers.extend(_NUMBER.findall(ids_removed))
    for number in numbers:
        if _significant(number) and _number_key(number) not in prompt_numbers:
            findings.append(f"unsupported number {number}")
    findings.extend(_negations(prompt, answer))
    return list(dict.fromkeys(findings))[:MAX_FINDINGS]


def penalised(score: float | None, findings: list[str]) -> float | None:
    """``score`` lowered by :data:`PENALTY` when there are findings (None stays None)."""
    if score is None or not findings:
        return score
    return round(score * PENALTY, 6)


def checked_outcome(call: LlmCall, outcome: StepOutcome, answer: LlmAnswer | None) -> StepOutcome:
    """The step's outcome with its answer checked against its rendered messages (unchanged when
    no model answered or nothing was found)."""
    if answer is None or outcome.status != "completed" or answer.model == "static":
        return outcome
    findings = find_contradictions(prompt_text(call), answer.text)
    if not findings:
        return outcome
    return dataclasses.replace(
        outcome,
        contradictions=findings,
        confidence_score=penalised(outcome.confidence_score, findings),
    )


def prompt_text(call: LlmCall) -> str:
    """The rendered messages of ``call`` as one text (what the answer is checked against)."""
    return "\n".join(text for _, text in call.messages)


def _is_identifier(token: str) -> bool:
    digits = sum(c.isdigit() for c in token)
    letters = sum(c.isalpha() for c in token)
    return letters >= 1 and digits >= 2 and len(token) >= 4 and not _NUMBER_UNIT.match(token)


def _significant(number: str) -> bool:
    return "." in number or sum(c.isdigit() for c in number) >= 2


def _number_key(number: str) -> str:
    try:
        return str(Decimal(number.replace(",", "")).normalize())
    except InvalidOperation:  # pragma: no cover - the regex only matches numbers
        return number


def _date_key(date: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.split(r"[-/]", date))


def _words(text: str) -> list[str]:
    return _WORD.findall(text.casefold().replace("\u2019", "'"))


def _negations(prompt: str, answer: str) -> list[str]:
    prompt_words = " " + " ".join(_words(prompt)) + " "
    found = []
    for sentence in _SENTENCE.split(answer):
        words = _words(sentence)
        if not any(w in _NEGATORS or w in _CONTRACTIONS for w in words):
            continue
        affirmed = [_CONTRACTIONS.get(w, w) for w in words if w not in _NEGATORS]
        if len(affirmed) < 3:
            continue
        stated = " ".join(affirmed)
        if f" {stated} " in prompt_words and f" {' '.join(words)} " not in prompt_words:
            found.append(f'negates the prompt: "{stated}"')
    return found
