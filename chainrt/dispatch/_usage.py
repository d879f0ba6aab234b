"""Token usage of an answer and what it cost (pure: no I/O).

Servers report usage in OpenAI's ``usage`` object (``prompt_tokens``, ``completion_tokens``,
``prompt_tokens_details.cached_tokens``); a streamed answer reports it in its last chunk when
asked with ``stream_options: {include_usage: true}``. The in-process model counts its own
tokens. Cost is the pool's ``price`` per model, per one million tokens, in the user's unit.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .._records import TokenUsage
from ._backend import BackendAnswer

__all__ = ["Price", "answer_usage", "cost_of", "priced", "read_usage"]

_MAX_TOKENS = 10**12
"""More than any answer can hold: a larger count is a server's garbage, read as absent."""


@dataclass(frozen=True, slots=True)
class Price:
    """Cost per one million tokens (cached prompt tokens at ``cached``, default ``prompt``)."""

    prompt: float
    completion: float
    cached: float | None = None


def _count(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = int(value)
    return number if 0 <= number <= _MAX_TOKENS and number == value else None


def read_usage(usage: object) -> tuple[int, int, int | None]:
    """(prompt, completion, cached) from an OpenAI ``usage`` object, read defensively: a field
    that is absent or not a whole non-negative number counts as 0 (cached: None)."""
    if not isinstance(usage, dict):
        return 0, 0, None
    details: Any = usage.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else None
    return (
        _count(usage.get("prompt_tokens")) or 0,
        _count(usage.get("completion_tokens")) or 0,
        cached,
    )


def cost_of(price: Price, prompt: int, completion: int, cached: int | None) -> float:
    """What ``prompt`` + ``completion`` tokens cost at ``price`` (``cached`` of the prompt
    tokens at the cached price)."""
    hits = min(cached or 0, prompt)
    cached_price = price.prompt if price.cached is None else price.cached
    total = (prompt - hits) * price.prompt + hits * cached_price + completion * price.completion
    return round(total / 1_000_000, 9)


def priced(got: BackendAnswer, price: Price | None) -> BackendAnswer:
    """``got`` with its ``cost`` at ``price`` (unchanged without a price or tokens)."""
    if price is None or (got.prompt_tokens == 0 and got.completion_tokens == 0):
        return got
    cost = cost_of(price, got.prompt_tokens, got.completion_tokens, got.cached_tokens)
    return dataclasses.replace(got, cost=cost)


def answer_usage(got: BackendAnswer) -> TokenUsage | None:
    """The attempt record's usage of an answer (None when the server reported no tokens)."""
    prompt, completion, cached = got.prompt_tokens, got.completion_tokens, got.cached_tokens
    if prompt == 0 and completion == 0 and not cached:
        return None
    return TokenUsage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        cached_tokens=cached,
        total_tokens=prompt + completion,
        cost=got.cost,
    )
