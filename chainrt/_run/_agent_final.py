"""An agent's last turn cut by the step's deadline keeps the answer it had begun (issue 38).

The last turn (no tools) is always streamed: each piece of text its attempts generate is kept
here as it arrives. When the step's deadline cuts the turn with some of the answer received —
the model had begun answering — the agent answers with that text, marked cut
(``{"cut": true, "stopped": "budget"}``, step status ``partial``), rather than ending with
nothing. Only a real model's tokens count: text from an attempt that failed otherwise (a bad
output, a dropped connection) is never used, and a turn cut before any of the answer arrived
ends as before (no answer). A backend that stops itself at the deadline (a chainrt worker, the
local engines) returns the text so far as a ``partial`` answer (``keep_partial``); a server
that does not (an OpenAI-compatible one, the scripted model) is cut by the dispatcher, and its
streamed text is what :class:`KeptText` holds.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._records import AttemptRecord
from ..dispatch import LlmAnswer, LlmCall
from ._step import StepOutcome

__all__ = ["CUT_ERROR", "Cut", "KeptText", "answer_so_far", "cut_outcome", "unanswered"]

CUT_ERROR = "cut off at the step's deadline: the answer is the text the model generated so far"
"""The error of a step (and of its last turn) that answered with a cut answer."""

_CUT_STATUSES = frozenset({"timeout", "deadline"})
"""Attempt statuses of a generation cut by time (the attempt's or the step's end)."""

_OPENED = re.compile(r'\s*\{\s*"content"\s*:\s*"')
"""How a last turn's answer, decoded into ``{"content": ...}``, begins."""


@dataclass(frozen=True, slots=True)
class Cut:
    """The last turn's text at the cut: what the model generated (``text``, as streamed) and
    the answer read from it (``answer``, never empty); ``model``: the model that generated it."""

    text: str
    answer: str
    model: str | None


class KeptText:
    """The text a last turn's attempts stream, attempt by attempt: set on the turn's call
    (:meth:`attach`), read once the turn ended without an answer (:meth:`cut`)."""

    def __init__(self) -> None:
        self._current: list[str] = []
        self._cut: tuple[str | None, str] | None = None
        self._forward_token: Callable[[str], None] | None = None
        self._forward_attempt: Callable[[AttemptRecord], None] | None = None

    def attach(self, call: LlmCall) -> None:
        """Stream ``call`` into this (its own token and attempt sinks still told) and let a
        backend that stops at the deadline return its text so far."""
        self._forward_token, self._forward_attempt = call.on_token, call.on_attempt
        call.on_token, call.on_attempt = self._token, self._attempt
        call.keep_partial = True

    def _token(self, text: str) -> None:
        self._current.append(text)
        if self._forward_token is not None:
            self._forward_token(text)

    def _attempt(self, record: AttemptRecord) -> None:
        # An attempt ended (its entry is told once): the next one's text starts over.
        text, self._current = "".join(self._current), []
        if text and record.status in _CUT_STATUSES:
            self._cut = (record.model, text)
        if self._forward_attempt is not None:
            self._forward_attempt(record)

    def cut(self, timed_out: bool, answer: LlmAnswer | None) -> Cut | None:
        """The answer begun before the deadline: the text of a ``partial`` answer, else (the
        turn ``timed_out``) of the last attempt cut by time; None when no answer was begun."""
        if answer is not None:
            model: str | None = answer.model
            text = answer.text if answer.partial else ""
        elif not timed_out:
            return None
        elif self._current:  # the last attempt, cut, not told as ended
            model, text = None, "".join(self._current)
        elif self._cut is not None:
            model, text = self._cut
        else:
            return None
        said = answer_so_far(text)
        return Cut(text, said, model) if said else None


def answer_so_far(text: str) -> str:
    """The answer in a last turn's text cut short: the ``content`` of a ``{"content": "...``
    begun (its escapes read; one cut midway dropped), or plain text as it stands (a backend
    that sends it); empty when none of the answer had come (``{"cont``, other JSON)."""
    opened = _OPENED.match(text)
    if opened is None:
        return "" if text.lstrip().startswith("{") else text.strip()
    body = text[opened.end() :]
    end = _closing_quote(body)
    if end is not None:
        body = body[:end]
    for trim in range(min(len(body), 6) + 1):  # a cut escape: \ or \uXXXX, 6 characters
        try:
            said = str(json.loads(f'"{body[: len(body) - trim]}"', strict=False))
        except ValueError:
            continue
        while said and 0xD800 <= ord(said[-1]) <= 0xDFFF:  # half a surrogate pair
            said = said[:-1]
        return said.strip()
    return ""


def _closing_quote(body: str) -> int | None:
    """Where the JSON string ``body`` (its opening quote taken off) ends; None: not yet."""
    escaped = False
    for index, char in enumerate(body):
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == '"':
            return index
    return None


def cut_outcome(
    step_id: str,
    answer: str,
    calls: list[dict[str, Any]],
    iterations: int,
    *,
    attempts: int,
    model: str | None,
    fallback: str | None,
) -> StepOutcome:
    """The end of agent step ``step_id`` whose last turn the deadline cut with ``answer``
    begun: ``partial`` (as an LLM answer cut with ``on_timeout: partial``), its output marked
    ``cut``."""
    return StepOutcome(
        "partial",
        output={
            "answer": answer,
            "calls": calls,
            "iterations": iterations,
            "stopped": "budget",
            "cut": True,
        },
        attempts=attempts,
        model=model,
        fallback=fallback,
        error=f"{step_id}: {CUT_ERROR}",
    )


def unanswered(
    tpath: str,
    status: str,
    stopped: str | None,
    calls: list[dict[str, Any]],
    iterations: int,
    attempts: int,
    turn: StepOutcome,
) -> StepOutcome:
    """The end of an agent step whose turn ``tpath`` ended ``status`` without an answer (none
    begun): ``answer`` null, the calls made and their results kept; ``turn``: how the turn's
    request ended; ``stopped``: why the loop had stopped calling tools (None: it had not)."""
    timed_out = status == "timed_out"
    return StepOutcome(
        status if status != "completed" else "failed",
        output={
            "answer": None,
            "calls": calls,
            "iterations": iterations,
            "stopped": stopped or ("budget" if timed_out else "error"),
        },
        attempts=attempts,
        model=turn.model,
        error=f"{tpath}: {turn.error or status}",
    )
