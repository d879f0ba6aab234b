"""One duration parser for the API, the CLI and Python: budgets bounded to 1 ms .. a maximum,
milliseconds passed as a timedelta never read as seconds."""

from __future__ import annotations

from datetime import timedelta

import pytest

from chainrt._durations import parse_budget_ms, parse_duration_ms
from chainrt.errors import BudgetError


@pytest.mark.parametrize(
    ("value", "ms"),
    [
        ("30s", 30_000.0),
        (30, 30_000.0),
        ("1ms", 1.0),
        ("1h", 3_600_000.0),
        (timedelta(milliseconds=30_000), 30_000.0),
        (timedelta(milliseconds=1.5), 1.5),
    ],
)
def test_budgets_accepted(value: object, ms: float) -> None:
    assert parse_budget_ms(value, max_ms=3_600_000.0) == ms


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (True, "must be a duration"),
        (False, "must be a duration"),
        ("0.0000001ms", "at least 1ms"),
        (1e-300, "at least 1ms"),
        (0, "at least 1ms"),
        (1e308, "too large"),
        ("9" * 400 + "s", "too large"),
        ("2h", "at most 60m00s"),
        (float("nan"), "finite"),
        (-1, "finite duration >= 0"),
        (timedelta(seconds=-1), ">= 0"),
        ([], "must be a duration"),
    ],
)
def test_budgets_refused(value: object, message: str) -> None:
    with pytest.raises(BudgetError, match=message):
        parse_budget_ms(value, max_ms=3_600_000.0)


def test_no_upper_bound_without_a_maximum() -> None:
    assert parse_budget_ms("5h") == 18_000_000.0
    assert parse_duration_ms(timedelta(seconds=2)) == 2000.0
