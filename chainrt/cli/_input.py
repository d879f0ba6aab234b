"""``--input``: JSON from the command line or a file, bounded and checked before a run sees it.

What is refused, each with one line naming the problem: a file that is not a regular file (a FIFO
would block, ``/dev/zero`` never ends), more than :data:`MAX_INPUT_BYTES`, text that is not JSON,
an object with the same key twice (JSON parsers disagree on which one wins), nesting deeper than
:data:`MAX_INPUT_DEPTH`, and strings with lone surrogates (``"\\ud800"``: not Unicode text, so it
cannot be stored or sent on).
"""

from __future__ import annotations

import json
from typing import Any

from .._files import FileRefused, read_bounded
from ..errors import InputError

__all__ = ["MAX_INPUT_BYTES", "MAX_INPUT_DEPTH", "read_input"]

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


def read_input(raw: str) -> Any:
    """The value of ``--input`` (JSON text, or ``@path`` of a JSON file); InputError if refused."""
    if raw.startswith("@"):
        path = raw[1:]
        try:
            data = read_bounded(path, MAX_INPUT_BYTES)
        except FileRefused as exc:
            raise InputError(f"input file {path}: {exc}") from None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(
                f"input file {path}: not UTF-8 text (byte {exc.start}: {exc.reason})"
            ) from None
        where = f"input file {path}"
    else:
        if len(raw) > MAX_INPUT_BYTES:
            raise InputError(f"--input is larger than {MAX_INPUT_BYTES} bytes; pass @file.json")
        text, where = raw, "--input"
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as exc:
        raise InputError(
            f"{where} has the key {_shown(str(exc.args[0]))} twice in one object"
        ) from None
    except RecursionError:
        raise InputError(f"{where} is nested deeper than {MAX_INPUT_DEPTH} levels") from None
    except ValueError as exc:
        raise InputError(f"{where} is not valid JSON: {exc}") from None
    _check(value, where)
    return value


def _check(value: Any, where: str) -> None:
    """Depth and lone surrogates, without recursion (the value may be deep)."""
    stack: list[tuple[Any, int, str]] = [(value, 0, "input")]
    while stack:
        item, depth, at = stack.pop()
        if isinstance(item, str):
            _text(item, where, at)
        elif isinstance(item, dict | list):
            if depth >= MAX_INPUT_DEPTH:
                raise InputError(f"{where} is nested deeper than {MAX_INPUT_DEPTH} levels")
            if isinstance(item, dict):
                for key, sub in item.items():
                    _text(key, where, at)
                    if isinstance(sub, str | dict | list):
                        stack.append((sub, depth + 1, f"{at}.{key}" if len(at) < 200 else at))
            else:
                for i, sub in enumerate(item):
                    if isinstance(sub, str | dict | list):
                        stack.append((sub, depth + 1, f"{at}[{i}]" if len(at) < 200 else at))


def _text(text: str, where: str, at: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        raise InputError(
            f"{where} has a lone surrogate (\\u{code:04x}) in a string at {_shown(at, 80)}: "
            "JSON strings must be Unicode text (write a surrogate pair or the character itself)"
        ) from None
