"""The budget inside groups (``switch``, ``parallel``, ``map``) and around ``when``: pure decisions.

A group gets its allotment from :mod:`chainrt.budget._steps` like any step, and spends it inside:

- a ``switch`` branch runs as a sub-chain whose budget is the group's allotment (its weights split
  it; the branches not taken cost nothing);
- every ``parallel`` branch gets the group's whole deadline as wall clock, split inside the branch
  by its weights;
- ``map`` items share the group's deadline in waves of ``max_concurrency``: each wave's items get
  the time left divided by the waves left (time a wave leaves unused goes to the waves after it);
- a step skipped by ``when`` costs nothing: its weight is not in the sums of the steps after it;
- ``join: any`` ends the group at the first branch that completes (the others are cancelled),
  ``{quorum: N}`` at the N-th; a branch cut at its deadline makes the group ``partial`` (a
  branch whose cut step is ``optional`` completes without it).

No clocks and no I/O here: the runner (``chainrt/_run/_groups.py``) feeds in the time left and
how branches ended, and gets back what to do.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "GroupEnd",
    "branch_status",
    "join_state",
    "switch_branch",
    "wave_allotment",
    "wave_count",
    "worst",
]

_RANK = {"completed": 0, "skipped": 0, "partial": 1, "rejected": 2, "failed": 3}


def wave_count(items: int, max_concurrency: int) -> int:
    """How many waves ``items`` map items take at ``max_concurrency`` at once."""
    if max_concurrency < 1:
        raise ValueError(f"max_concurrency must be at least 1, got {max_concurrency}")
    return math.ceil(items / max_concurrency) if items > 0 else 0


def wave_allotment(remaining_ms: float, waves_left: int) -> float:
    """The time each item of the next wave gets: the time left over the waves left (>= 0)."""
    if waves_left < 1:
        raise ValueError(f"waves_left must be at least 1, got {waves_left}")
    return max(remaining_ms, 0.0) / waves_left


def switch_branch(value: Any, cases: Sequence[str], has_default: bool) -> str | None:
    """The case a switch value picks: a string as it is, a number or boolean as JSON writes it
    (``3``, ``true``); ``default`` when no case matches and there is one, else None."""
    if isinstance(value, str):
        key: str | None = value
    elif isinstance(value, bool | int | float):
        key = json.dumps(value)
    else:
        key = None
    if key is not None and key in cases:
        return key
    return "default" if has_default else None


def worst(statuses: Sequence[str]) -> str:
    """The status of a group whose branches ended so: ``failed`` over ``rejected`` over
    ``partial`` over ``completed``."""
    if not statuses:
        return "completed"
    return max(statuses, key=lambda s: _RANK.get(s, 3))


def branch_status(stop: str | None) -> str:
    """A branch's status from where its steps stopped (None: every step ran to its end)."""
    return "completed" if stop is None else stop


@dataclass(frozen=True, slots=True)
class GroupEnd:
    """The group ends now with ``status``; the branches still running are cancelled."""

    status: str


def join_state(
    join: str | Mapping[str, int], ended: Sequence[str], running: int
) -> GroupEnd | None:
    """Whether a ``parallel`` group ends now (None: wait for more branches).

    ``join`` is ``"all"``, ``"any"`` or ``{"quorum": N}``; ``ended`` the statuses of the branches
    that ended so far; ``running`` how many have not. ``all`` waits for every branch and ends
    ``completed`` only when each did; ``any`` / ``quorum`` end ``completed`` at the first / N-th
    completed branch, and with the worst status of the others once that can no longer happen.
    """
    done = sum(1 for s in ended if s == "completed")
    if join == "all":
        return GroupEnd(worst(ended)) if running == 0 else None
    need = 1 if isinstance(join, str) else int(join["quorum"])
    if done >= need:
        return GroupEnd("completed")
    if done + running < need:
        return GroupEnd(worst([s for s in ended if s != "completed"]))
    return None
