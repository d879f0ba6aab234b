"""Durations as people write them in YAML and on the command line: ``1500ms``, ``8s``, ``2m``."""

from __future__ import annotations

import re

from ._errors import BudgetError

__all__ = ["MIN_BUDGET_MS", "format_ms", "parse_duration_ms"]

MIN_BUDGET_MS = 1.0
"""The smallest budget a chain or a run is given (a shorter one could not run a step)."""

_UNITS_MS = {"ms": 1.0, "s": 1000.0, "m": 60_000.0, "h": 3_600_000.0}
# ASCII digits only: "٣s" (an Arabic-Indic three) is not a duration a person meant to type here.
_PATTERN = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?|\.[0-9]+)\s*(ms|s|m|h)\s*", re.ASCII)


def parse_duration_ms(value: object, *, what: str = "duration") -> float:
    """Return ``value`` in milliseconds.

    Accepts a string with a unit (``"250ms"``, ``"1.5s"``, ``"2m"``, ``"1h"``) or a plain number,
    read as seconds (YAML ``budget: 8`` means eight seconds). Raises :class:`BudgetError` for
    anything else, including negative values and booleans.
    """
    if isinstance(value, bool):
        raise BudgetError(f"{what} must be a duration like '500ms' or '8s', got {value!r}")
    if isinstance(value, int | float):
        if value != value or value < 0 or value == float("inf"):
            raise BudgetError(f"{what} must be a finite duration >= 0, got {value!r}")
        return float(value) * 1000.0
    if not isinstance(value, str):
        raise BudgetError(f"{what} must be a duration like '500ms' or '8s', got {value!r}")
    match = _PATTERN.fullmatch(value)
    if match is None:
        raise BudgetError(
            f"{what} must be a number with a unit ms|s|m|h such as '1500ms' or '8s', got {value!r}"
        )
    return float(match.group(1)) * _UNITS_MS[match.group(2)]


def format_ms(ms: float) -> str:
    """Render milliseconds for people: ``850ms``, ``2.31s``, ``3m05s``."""
    if ms < 1000:
        return f"{ms:.0f}ms"
    if ms < 60_000:
        return f"{ms / 1000:.2f}s"
    minutes, rest = divmod(ms / 1000, 60)
    return f"{int(minutes)}m{rest:02.0f}s"
