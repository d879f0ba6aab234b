"""``degrade:`` on an llm step: what answers when its models could not (docs/dispatch.md, issue 17).

    degrade: [cache, {model: local}, {static: "Sorry, try again later (run {{ run.id }})."}]
    degrade: [{cache: 10m}]        # cache entries live 10 minutes (default 1h)

Actions are tried in order once the step's own model, retries and fallbacks have failed.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator, Field

from .._durations import parse_duration_ms
from .._strict import Strict

__all__ = ["DEFAULT_CACHE_TTL_MS", "CacheAction", "DegradeAction", "ModelAction", "StaticAction"]

DEFAULT_CACHE_TTL_MS = 3_600_000.0
"""How long a cached answer stays usable when ``cache`` gives no duration (1 hour)."""


def _ttl(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError("cache takes a duration such as 10m or 1h")
    ms = parse_duration_ms(value)
    if not 1000.0 <= ms <= 30 * 86_400_000.0:
        raise ValueError("a cache duration must be between 1s and 30d")
    return ms


class CacheAction(Strict):
    """``cache`` / ``{cache: 10m}``: an earlier answer of the step's model to the same
    (normalised) prompt, at most ``cache`` old."""

    cache: Annotated[float, BeforeValidator(_ttl)] = DEFAULT_CACHE_TTL_MS


class ModelAction(Strict):
    """``{model: local}``: ask this (smaller) model, once, with the step's retries."""

    model: str = Field(min_length=1)


class StaticAction(Strict):
    """``{static: "..."}``: a template answer (``{{ run.id }}`` is the run id)."""

    static: str


def _action(value: object) -> object:
    if value == "cache":
        return {"cache": "1h"}
    return value


DegradeAction = Annotated[CacheAction | ModelAction | StaticAction, BeforeValidator(_action)]
"""One degrade action: ``cache`` (or ``{cache: TTL}``), ``{model: NAME}`` or ``{static: TEXT}``."""
