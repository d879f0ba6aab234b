"""JSON a user sends, checked before anything records it: the command line's ``--input`` and
the bodies of ``chainrt serve``'s API go through these same checks.

Refused, each with one line naming the problem: text that is not JSON, an object with the same
key twice (JSON parsers disagree on which one wins), nesting deeper than :data:`MAX_INPUT_DEPTH`,
and strings with lone surrogates (``"\\ud800"``: not Unicode text, so it cannot be stored or
sent on).
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from .errors import InputError

__all__ = [
    "MAX_INPUT_BYTES",
    "MAX_INPUT_DEPTH",
    "Problem",
    "check_value",
    "find_problem",
    "loads",
    "parse_json",
]

MAX_INPUT_BYTES = 4 * 1024 * 1024
"""Largest input accepted (the stores' default record limit: a larger one could not be saved)."""

MAX_INPUT_DEPTH = 64
"""Deepest nesting of objects and lists accepted (the chain loader's YAML limit)."""


class _DuplicateKey(Exception):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _DuplicateKey(key)
        obj[key] = value
    return obj


def _shown(text: str, width: int = 40) -> str:
    text = text.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")
    return repr(text if len(text) <= width else text[:width] + "...")


def parse_json(text: str, where: str, *, max_depth: int = MAX_INPUT_DEPTH) -> Any:
    """``text`` as JSON, refused (InputError naming ``where``) for the reasons above."""
    value = loads(text, where, max_depth=max_depth)
    check_value(value, where, max_depth=max_depth)
    return value


def loads(text: str, where: str, *, max_depth: int = MAX_INPUT_DEPTH) -> Any:
    """``text`` as JSON with no key twice in one object; InputError naming ``where``. Depth
    and lone surrogates are :func:`find_problem`'s to find."""
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as exc:
        raise InputError(
            f"{where} has the key {_shown(str(exc.args[0]))} twice in one object"
        ) from None
    except RecursionError:
        raise InputError(f"{where} is nested deeper than {max_depth} levels") from None
    except ValueError as exc:
        raise InputError(f"{where} is not valid JSON: {exc}") from None


class Problem(NamedTuple):
    """What :func:`find_problem` found: where in the value (``input.a[2]``) and what."""

    at: str
    message: str


def check_value(
    value: Any, where: str, *, max_depth: int = MAX_INPUT_DEPTH, root: str = "input"
) -> None:
    """InputError naming ``where`` if :func:`find_problem` finds anything in ``value``."""
    problem = find_problem(value, max_depth=max_depth, root=root)
    if problem is not None:
        raise InputError(f"{where} {problem.message}")


def find_problem(
    value: Any, *, max_depth: int = MAX_INPUT_DEPTH, root: str = "input"
) -> Problem | None:
    """The first lone surrogate or too-deep nesting in ``value``, walked without recursion
    (the value may be deep); ``root`` names the value itself in :attr:`Problem.at`."""
    stack: list[tuple[Any, int, str]] = [(value, 0, root)]
    while stack:
        item, depth, at = stack.pop()
        if isinstance(item, str):
            if (problem := _text(item, at)) is not None:
                return problem
        elif isinstance(item, dict | list):
            if depth >= max_depth:
                return Problem(at, f"is nested deeper than {max_depth} levels")
            if isinstance(item, dict):
                for key, sub in item.items():
                    if (problem := _text(key, at)) is not None:
                        return problem
                    if isinstance(sub, str | dict | list):
                        stack.append((sub, depth + 1, _join(at, str(key))))
            else:
                for i, sub in enumerate(item):
                    if isinstance(sub, str | dict | list):
                        stack.append((sub, depth + 1, f"{at}[{i}]" if len(at) < 200 else at))
    return None


def _join(at: str, key: str) -> str:
    if len(at) >= 200:
        return at
    return f"{at}.{key}" if at else key


def _text(text: str, at: str) -> Problem | None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        return Problem(
            at,
            f"has a lone surrogate (\\u{code:04x}) in a string at {_shown(at, 80)}: "
            "JSON strings must be Unicode text (write a surrogate pair or the character itself)",
        )
    return None
