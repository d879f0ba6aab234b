"""``hedge:`` on an llm step: a second attempt when the first is slow (docs/dispatch.md).

``hedge: {after: p95}`` starts a second attempt on another endpoint of the same model when the
first has not answered after its endpoint's recent 95th percentile; ``p50``, ``p90`` and ``p99``
are the other percentiles, and a duration (``250ms``, ``1.5s``) is a fixed delay instead.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, field_validator

from .._durations import parse_duration_ms
from .._errors import BudgetError
from .._strict import Strict

__all__ = ["PERCENTILES", "HedgeSpec"]

PERCENTILES: dict[str, float] = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99}
"""The percentiles ``after`` accepts, and the quantile each means."""

_MAX_MS = 3_600_000.0
_MS = re.compile(r"^([0-9]+(?:\.[0-9]+)?)ms$")


class HedgeSpec(Strict):
    """``hedge: {after: p95}``: when a second attempt may start (opt-in; absent: never)."""

    after: str = Field(
        default="p95",
        description="p50, p90, p95 or p99 of the endpoint's recent answer times, or a "
        "duration such as '250ms'.",
    )

    @field_validator("after", mode="before")
    @classmethod
    def _check_after(cls, value: Any) -> str:
        if isinstance(value, str) and value.strip().lower() in PERCENTILES:
            return value.strip().lower()
        try:
            ms = parse_duration_ms(value, what="after")
        except BudgetError:
            raise ValueError(
                f"after must be p50, p90, p95, p99 or a duration such as '250ms', got {value!r}"
            ) from None
        if not 0 < ms <= _MAX_MS:
            raise ValueError(f"after must be longer than zero and at most 1h, got {value!r}")
        return f"{ms:.3f}".rstrip("0").rstrip(".") + "ms"

    @property
    def quantile(self) -> float | None:
        """The percentile as a quantile (``p95`` → 0.95); None for a fixed delay."""
        return PERCENTILES.get(self.after)

    @property
    def delay_ms(self) -> float | None:
        """The fixed delay in milliseconds; None for a percentile."""
        match = _MS.match(self.after)
        return None if match is None else float(match.group(1))
