"""An agent step's budget rules (docs/chain-format.md, Agent steps): pure decisions, no clocks.

An agent loop knows its deadline. It keeps a *final reserve*: the time one last model turn
without tools needs to answer. While more than the reserve is left (and iterations remain), a
turn offers the tools, and that turn and the calls it proposes must end before the reserve
begins; once the time left is at the reserve (or ``max_iterations`` turns have called tools),
one last turn without tools asks for the answer, and may use everything left.

``auto`` sizes the reserve from the model's measured answer times: p90 x 1.5 (the dispatcher's
recent answers of that model), at least :data:`MIN_RESERVE_MS`. Measured, it is kept whole even
when it takes most or all of the allotment: such an agent calls fewer tools, or none, and answers
(a reserve cut to fit left the last turn too little: on a worker at half the loop's time, 2 runs
in 10 ended with nothing to say). Before it has any, :data:`DEFAULT_RESERVE_MS`, at most half of
the step's allotment (a guess that took the whole allotment would never let a tool be called).

The records of the last turn with tools and of its calls are written after they end, before the
last turn starts: the work ends earlier by :func:`write_allowance_ms` (p90 x 1.5 of the loop's
recent record writes), so that a slow store does not take the last turn's reserve.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import Final, Literal

__all__ = [
    "AUTO_FACTOR",
    "DEFAULT_RESERVE_MS",
    "MIN_RESERVE_MS",
    "Move",
    "final_reserve_ms",
    "next_move",
    "write_allowance_ms",
]

AUTO_FACTOR: Final = 1.5
"""``final_reserve: auto`` keeps this many times the model's p90 answer time."""

DEFAULT_RESERVE_MS: Final = 1500.0
"""The ``auto`` reserve while the dispatcher has no answer times for the model yet."""

MIN_RESERVE_MS: Final = 20.0
"""The least reserve kept (a final turn needs at least a round trip)."""

MAX_RESERVE_SHARE: Final = 0.5
"""The unmeasured ``auto`` reserve (:data:`DEFAULT_RESERVE_MS`) takes at most this share of the
step's allotment."""

Stopped = Literal["answer", "max_iterations", "budget"]


@dataclass(frozen=True, slots=True)
class Move:
    """What the loop does next: a turn with tools (``final`` False, ``why`` None), or the last
    turn without tools (``final`` True) and why the loop stops calling tools."""

    final: bool
    why: Stopped | None = None


def final_reserve_ms(fixed_ms: float | None, p90_s: float | None, allotted_ms: float) -> float:
    """The step's final reserve in ms: ``fixed_ms`` when the chain gives one, else ``auto``:
    ``p90_s`` (the model's p90 answer time, None when unknown) x :data:`AUTO_FACTOR`, whole."""
    if fixed_ms is not None:
        return max(fixed_ms, 0.0)
    if p90_s is None:
        return max(min(DEFAULT_RESERVE_MS, allotted_ms * MAX_RESERVE_SHARE), MIN_RESERVE_MS)
    return max(p90_s * 1000 * AUTO_FACTOR, MIN_RESERVE_MS)


def write_allowance_ms(recent_ms: Collection[float]) -> float:
    """The time kept, before the reserve, for writing the records of the last turn with tools
    and its calls: :data:`AUTO_FACTOR` x the p90 (nearest rank) of ``recent_ms``, the loop's
    latest record writes (0 before any)."""
    if not recent_ms:
        return 0.0
    ordered = sorted(recent_ms)
    p90 = ordered[max(math.ceil(0.9 * len(ordered)) - 1, 0)]
    return p90 * AUTO_FACTOR


def next_move(
    *,
    tool_turns: int,
    max_iterations: int,
    left_ms: float,
    reserve_ms: float,
    writes_ms: float = 0.0,
) -> Move:
    """The next turn of an agent that has made ``tool_turns`` turns with tools so far and has
    ``left_ms`` until its deadline; ``writes_ms`` is kept before the reserve for writing the
    records of a turn with tools and its calls (:func:`write_allowance_ms`)."""
    if tool_turns >= max_iterations:
        return Move(final=True, why="max_iterations")
    if left_ms <= reserve_ms + writes_ms:
        return Move(final=True, why="budget")
    return Move(final=False)
