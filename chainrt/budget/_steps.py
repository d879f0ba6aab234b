"""Budget allotment (docs/chain-format.md, Budget): pure decisions, no clocks, no I/O.

When step ``k`` starts with ``R`` ms left, it is allotted ``R * w_k / sum(w_j)`` over the steps
still to run, bounded by its ``min``/``max``. Whatever a step leaves unused is still part of ``R``
when the next step asks, so it rolls forward in proportion to the remaining weights by
construction. The runner feeds in the time left and gets back one of three decisions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "DEFAULT_MIN_STEP_MS",
    "Allot",
    "Decision",
    "Plan",
    "Skip",
    "StepBudget",
    "Stop",
    "decide",
]

DEFAULT_MIN_STEP_MS = 5.0
"""A step with no ``min`` is not started with less than this many ms left."""


@dataclass(frozen=True, slots=True)
class StepBudget:
    """What the budget needs to know about a step."""

    weight: float
    min_ms: float | None = None
    max_ms: float | None = None
    optional: bool = False

    @property
    def need_ms(self) -> float:
        """The least time worth starting this step with."""
        if self.min_ms is not None:
            return self.min_ms
        if self.max_ms is not None:
            return min(DEFAULT_MIN_STEP_MS, self.max_ms)
        return DEFAULT_MIN_STEP_MS


@dataclass(frozen=True, slots=True)
class Allot:
    """Run the step with ``ms`` milliseconds (covers key waits, retries and fallbacks)."""

    ms: float


@dataclass(frozen=True, slots=True)
class Skip:
    """Skip this optional step; ``reason`` says why."""

    reason: str


@dataclass(frozen=True, slots=True)
class Stop:
    """Stop the run here with status ``partial``; ``reason`` says why."""

    reason: str


Decision = Allot | Skip | Stop


def decide(remaining_ms: float, steps_left: Sequence[StepBudget]) -> Decision:
    """Decide for ``steps_left[0]`` given ``remaining_ms`` of the run's budget.

    ``steps_left`` is the step about to start followed by every step after it that may still run.
    Optional steps give way: one is skipped when running it would leave the required steps after
    it less than their ``min``. (A runner deciding step after step uses :class:`Plan`, which sums
    the steps after each one once rather than at every step.)
    """
    if not steps_left:
        raise ValueError("decide() needs at least the step about to start")
    step = steps_left[0]
    total_weight = sum(s.weight for s in steps_left)
    reserve = sum(s.need_ms for s in steps_left[1:] if not s.optional) if step.optional else 0.0
    return _decide(step, remaining_ms, total_weight, reserve, step.need_ms)


class Plan:
    """The steps of one execution, in order, with the sums :func:`decide` needs precomputed.

    ``Plan(steps).decide(k, R)`` is ``decide(R, steps[k:])``, in constant time: the weights and
    the required steps' ``min`` after each step are summed once, from the end. A chain of
    thousands of steps pays for them once, not at every step.
    """

    __slots__ = ("_need", "_reserve_after", "_weight_from", "steps")

    def __init__(self, steps: Sequence[StepBudget]) -> None:
        self.steps = tuple(steps)
        count = len(self.steps)
        weight_from = [0.0] * (count + 1)
        reserve_after = [0.0] * (count + 1)
        for index in range(count - 1, -1, -1):
            step = self.steps[index]
            weight_from[index] = weight_from[index + 1] + step.weight
            if index > 0:
                need = 0.0 if step.optional else step.need_ms
                reserve_after[index - 1] = reserve_after[index] + need
        self._weight_from = weight_from
        self._reserve_after = reserve_after
        self._need = [step.need_ms for step in self.steps]

    def decide(self, index: int, remaining_ms: float) -> Decision:
        """Decide for step ``index`` given ``remaining_ms`` (every later step may still run)."""
        step = self.steps[index]
        reserve = self._reserve_after[index] if step.optional else 0.0
        return _decide(step, remaining_ms, self._weight_from[index], reserve, self._need[index])


def _decide(
    step: StepBudget, remaining_ms: float, total_weight: float, reserve: float, need: float
) -> Decision:
    """The rule itself: ``total_weight`` of the steps still to run (this one included),
    ``reserve`` the ``min`` of the required steps after an optional one, ``need`` the step's
    :attr:`~StepBudget.need_ms`."""
    remaining = max(remaining_ms, 0.0)
    if remaining < need:
        why = f"{remaining:.0f}ms left, step needs {need:.0f}ms"
        return Skip(why) if step.optional else Stop(why)

    share = remaining * step.weight / total_weight
    share = max(share, need)
    if step.max_ms is not None:
        share = min(share, step.max_ms)
    allot = min(share, remaining)

    if step.optional and remaining - allot < reserve:
        allot = remaining - reserve
        if allot < need:
            return Skip(
                f"{remaining:.0f}ms left, {reserve:.0f}ms reserved for the required steps after"
            )
    return Allot(allot)
