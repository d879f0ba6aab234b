"""Durations as people write them in YAML and on the command line: ``1500ms``, ``8s``, ``2m``."""

from __future__ import annotations

import re
from datetime import timedelta

from ._errors import BudgetError

__all__ = [
    "DEFAULT_MAX_BUDGET_MS",
    "MIN_BUDGET_MS",
    "format_ms",
    "parse_budget_ms",
    "parse_duration_ms",
]

MIN_BUDGET_MS = 1.0
"""The smallest budget a chain or a run is given (a shorter one could not run a step)."""

DEFAULT_MAX_BUDGET_MS = 3_600_000.0
"""The largest budget ``chainrt serve`` accepts for a run unless told otherwise (one hour)."""

_UNITS_MS = {"ms": 1.0, "s": 1000.0, "m": 60_000.0, "h": 3_600_000.0}
# ASCII digits only: "٣s" (an Arabic-Indic three) is not a duration a person meant to type here.
_PATTERN = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?|\.[0-9]+)\s*(ms|s|m|h)\s*", re.ASCII)


def parse_duration_ms(value: object, *, what: str = "duration") -> float:
    """Return ``value`` in milliseconds.

    Accepts a string with a unit (``"250ms"``, ``"1.5s"``, ``"2m"``, ``"1h"``), a plain number,
    read as seconds (YAML ``budget: 8`` means eight seconds), or a :class:`~datetime.timedelta`
    (what code that already holds milliseconds passes, so nothing reads them as seconds).
    Raises :class:`BudgetError` for anything else, including negative values and booleans.
    """
    if isinstance(value, timedelta):
        if value < timedelta(0):
            raise BudgetError(f"{what} must be a duration >= 0, got {value}")
        return value / timedelta(milliseconds=1)
    if isinstance(value, bool):
        raise BudgetError(f"{what} must be a duration like '500ms' or '8s', got {value!r}")
    if isinstance(value, int | float):
        if value != value or value < 0 or value == float("inf"):
            raise BudgetError(f"{what} must be a finite duration >= 0, got {value!r}")
        return _finite(float(value) * 1000.0, value, what)
    if not isinstance(value, str):
        raise BudgetError(f"{what} must be a duration like '500ms' or '8s', got {value!r}")
    match = _PATTERN.fullmatch(value)
    if match is None:
        raise BudgetError(
            f"{what} must be a number with a unit ms|s|m|h such as '1500ms' or '8s', got {value!r}"
        )
    return _finite(float(match.group(1)) * _UNITS_MS[match.group(2)], value, what)


def _finite(ms: float, value: object, what: str) -> float:
    # 1e308 seconds is a finite number but no finite count of milliseconds.
    if ms == float("inf"):
        raise BudgetError(f"{what} is too large to be a duration, got {_shown(value)}")
    return ms


def parse_budget_ms(value: object, *, what: str = "budget", max_ms: float | None = None) -> float:
    """A run's budget in milliseconds: :func:`parse_duration_ms`, then bounded to
    :data:`MIN_BUDGET_MS` .. ``max_ms`` (no bound above when None), so that a budget too small
    to run a step (``"0.0000001ms"``) or too large to store (``1e308``) is refused up front."""
    ms = parse_duration_ms(value, what=what)
    if ms < MIN_BUDGET_MS:
        raise BudgetError(f"{what} must be at least {MIN_BUDGET_MS:g}ms, got {_shown(value)}")
    if max_ms is not None and ms > max_ms:
        raise BudgetError(f"{what} must be at most {format_ms(max_ms)}, got {_shown(value)}")
    return ms


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


def format_ms(ms: float) -> str:
    """Render milliseconds for people: ``850ms``, ``2.31s``, ``3m05s``."""
    if ms < 1000:
        return f"{ms:.0f}ms"
    if ms < 60_000:
        return f"{ms / 1000:.2f}s"
    minutes, rest = divmod(ms / 1000, 60)
    return f"{int(minutes)}m{rest:02.0f}s"
