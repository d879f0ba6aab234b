"""``--input``: JSON from the command line or a file, bounded and checked before a run sees it.

What is refused, each with one line naming the problem: a file that is not a regular file (a FIFO
would block, ``/dev/zero`` never ends), more than :data:`MAX_INPUT_BYTES`, and whatever
:mod:`chainrt._input_checks` refuses (not JSON, a key twice in one object, nesting deeper than
:data:`MAX_INPUT_DEPTH`, lone surrogates). ``chainrt serve``'s API applies the same checks.
"""

from __future__ import annotations

from typing import Any

from .._files import FileRefused, read_bounded
from .._input_checks import MAX_INPUT_BYTES, MAX_INPUT_DEPTH, parse_json
from ..errors import InputError

__all__ = ["MAX_INPUT_BYTES", "MAX_INPUT_DEPTH", "read_input"]


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
    return parse_json(text, where)
