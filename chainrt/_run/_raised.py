"""Where a tool raised: the line of its own file that a step's recorded error points at.

A tool's exception alone (``ZeroDivisionError: division by zero``) does not say which line of
which tool failed. :func:`describe_raise` adds the innermost frame of the tool's own file
(``chains/tools/calc.py:12 in divide``) to the one-line error, and gives the frames from the tool
down to the raise as trace lines for ``chainrt inspect --full``.

Only file names, line numbers and function names are recorded: no source text and no local
variables, which may hold secrets (a token in a variable, a password in a literal).
"""

from __future__ import annotations

import inspect
import os
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["MAX_TRACE_LINES", "describe_raise", "tool_file"]

MAX_TRACE_LINES = 12
"""Frames kept in the trace (the innermost ones; a deep recursion is cut in the middle)."""


def tool_file(fn: Callable[..., Any]) -> str | None:
    """The source file that defines ``fn`` (through wrappers and partials); None if unknown."""
    target: Any = fn
    for _ in range(32):
        if hasattr(target, "func") and callable(target.func):  # functools.partial
            target = target.func
        elif hasattr(target, "__wrapped__"):
            target = target.__wrapped__
        elif inspect.ismethod(target):
            target = target.__func__
        else:
            break
    code = getattr(target, "__code__", None)
    if code is None:  # a callable object: its class's __call__
        code = getattr(vars(type(target)).get("__call__"), "__code__", None)
    return code.co_filename if code is not None else None


def _shown(filename: str, cwd: str) -> str:
    """A frame's file relative to the working directory when it lies under it."""
    try:
        relative = os.path.relpath(filename, cwd)
    except ValueError:  # another drive (Windows)
        return filename
    return filename if relative.startswith("..") else relative


def describe_raise(exc: BaseException, fn: Callable[..., Any]) -> tuple[str, str]:
    """``(one line, with trace)`` for the exception a tool raised.

    The line is ``Type: message (at FILE:LINE in FUNC)``, the frame being the innermost one in
    the tool's own file (none found: the bare ``Type: message``). The longer text adds the
    frames from the tool's first frame to the raise, one per line.
    """
    head = f"{type(exc).__name__}: {exc}"
    home = tool_file(fn)
    frames = traceback.extract_tb(exc.__traceback__)
    if home is None or not frames:
        return head, head
    home_path = str(Path(home).resolve()) if os.path.exists(home) else home
    mine = [i for i, f in enumerate(frames) if _same_file(f.filename, home, home_path)]
    if not mine:
        return head, head
    cwd = os.getcwd()
    where = frames[mine[-1]]
    line = f"{head} (at {_shown(where.filename, cwd)}:{where.lineno} in {where.name})"
    trace = frames[mine[0] :]
    lines = [f"  {_shown(f.filename, cwd)}:{f.lineno} in {f.name}" for f in trace]
    if len(lines) > MAX_TRACE_LINES:
        half = MAX_TRACE_LINES // 2
        lines = [*lines[:half], f"  ... {len(lines) - 2 * half} frames ...", *lines[-half:]]
    return line, "\n".join([line, "trace (innermost last):", *lines])


def _same_file(filename: str, home: str, home_path: str) -> bool:
    if filename == home:
        return True
    try:
        return str(Path(filename).resolve()) == home_path
    except (OSError, RuntimeError):
        return False
