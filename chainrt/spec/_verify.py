"""``verify:`` on an llm step: a low-confidence answer is checked against a second model."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from .._strict import Strict

__all__ = ["VerifySpec"]


class VerifySpec(Strict):
    """``verify: {below: 0.6, with: [primary], on_mismatch: fallback|flag|fail}``.

    An answer whose ``confidence_score`` is below ``below`` is asked again of the first model of
    ``with`` that answers, and the two answers are compared (JSON equality for JSON steps, else
    normalised text equality).
    """

    below: float = Field(gt=0.0, le=1.0, description="Verify answers scoring below this.")
    with_models: list[Annotated[str, Field(min_length=1)]] = Field(
        alias="with",
        min_length=1,
        max_length=8,
        description="Models asked for the second answer, in order.",
    )
    on_mismatch: Literal["fallback", "flag", "fail"] = Field(
        default="flag",
        description="fallback: take the second answer; flag: keep the first; fail: fail the step.",
    )

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
