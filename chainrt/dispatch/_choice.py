"""Which endpoint of a model gets the next request: a pure, table-testable choice (docs/dispatch.md).

Only usable endpoints take part: ready (or not yet probed), circuit closed (or due for its trial),
not asked to wait by a ``Retry-After``. Among them the choice is random, weighted by
``capacity / (1 + in_flight)``: capacity is the endpoint's relative size from the pool file
(e.g. KV-cache tokens), and every request already in flight there shrinks its share, so a slow
or busy endpoint — whose requests pile up — gets less new traffic before it falls further
behind. The caller passes the random number, which makes the function deterministic.

Endpoints that already failed during this step are ``avoided``: they are chosen only when no other
usable endpoint is left (a retry then goes back to the same endpoint after its wait).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Candidate", "choose", "weight"]


@dataclass(frozen=True, slots=True)
class Candidate:
    """One endpoint as the choice sees it."""

    key: str
    """The endpoint's URL."""
    capacity: float
    in_flight: int = 0
    usable: bool = True
    """Ready (or unknown), circuit admits, not in a Retry-After wait."""
    avoided: bool = False
    """Failed earlier in this step: chosen only when nothing else is usable."""


def weight(candidate: Candidate) -> float:
    """The endpoint's share of new traffic (0 when it is not usable)."""
    if not candidate.usable or candidate.capacity <= 0:
        return 0.0
    return candidate.capacity / (1 + max(candidate.in_flight, 0))


def choose(candidates: Sequence[Candidate], r: float) -> int | None:
    """Index of the chosen candidate for a random number ``r`` in [0, 1); None if none is usable.

    Non-avoided candidates are preferred; the rest are a last resort.
    """
    if not 0 <= r < 1:
        raise ValueError(f"r must be in [0, 1), got {r!r}")
    for avoided in (False, True):
        weights = [weight(c) if c.avoided == avoided else 0.0 for c in candidates]
        total = sum(weights)
        if total <= 0:
            continue
        point = r * total
        running = 0.0
        last = None
        for index, w in enumerate(weights):
            if w <= 0:
                continue
            running += w
            last = index
            if point < running:
                return index
        return last  # r * total rounded up to the total
    return None
