"""``chainrt inspect`` of a run with groups: each group's inner steps drawn as a tree under it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TextIO

from .._durations import format_ms
from .._records import StepRecord
from .._result_tree import inner_lists, is_group
from ..spec._flow import CHOICE_SUFFIX

__all__ = ["print_inner"]

_MAX_LINES = 200
"""Lines drawn under one group unless ``full`` (a map of thousands of items)."""


def print_inner(
    spec_step: Any, steps: Mapping[str, StepRecord], out: TextIO, *, full: bool = False
) -> None:
    """Draw the inner steps of the group ``spec_step`` (its stored form), if it is one."""
    if not isinstance(spec_step, Mapping) or not is_group(spec_step):
        return
    lines: list[str] = []
    _draw(spec_step, str(spec_step.get("id")), steps, "       ", lines)
    shown = lines if full or len(lines) <= _MAX_LINES else lines[:_MAX_LINES]
    for line in shown:
        print(line, file=out)
    if len(shown) < len(lines):
        print(f"       ... {len(lines) - len(shown)} more lines (--full shows them)", file=out)


def _draw(
    spec: Mapping[str, Any],
    path: str,
    steps: Mapping[str, StepRecord],
    indent: str,
    lines: list[str],
) -> None:
    if spec.get("switch"):
        choice = steps.get(path + CHOICE_SUFFIX)
        taken = choice.output if choice is not None else None
        lines.append(f"{indent}branch {taken if taken is not None else '(none taken)'}")
    rows = [
        (prefix + str(step.get("id")), step)
        for prefix, listed in inner_lists(spec, path, steps)
        for step in listed
        if isinstance(step, Mapping)
    ]
    for number, (inner, step) in enumerate(rows):
        last = number == len(rows) - 1
        rec = steps.get(inner)
        branch = "└─ " if last else "├─ "
        if rec is None:
            lines.append(f"{indent}{branch}{inner}  not run")
        else:
            lines.append(
                f"{indent}{branch}{inner}  {rec.status}  {format_ms(rec.elapsed_ms)} of "
                f"{format_ms(rec.allotted_ms)}" + (f"  error: {rec.error}" if rec.error else "")
            )
        if is_group(step):
            _draw(step, inner, steps, indent + ("   " if last else "│  "), lines)
