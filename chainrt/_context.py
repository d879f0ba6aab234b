"""What a tool sees of the run when it declares a ``ctx`` parameter."""

from __future__ import annotations

import time
from dataclasses import dataclass

__all__ = ["StepContext"]


@dataclass(frozen=True, slots=True)
class StepContext:
    """The step context passed to tools as ``ctx`` (docs/chain-format.md).

    ``idempotency_key`` is ``f"{run_id}:{step_id}"``: the same on every attempt and on a resumed
    run, so a tool can make a side effect happen once even if the step runs again after a crash.
    """

    run_id: str
    step_id: str
    attempt: int
    """The how-many-th call of this step's tool in this run: 1 first, then each retry, and on
    across crashes and resumes (each attempt is written to the store before the call, so a re-run
    after a crash is never told it is attempt 1 again; a number may be skipped, never repeated)."""
    deadline: float
    """Unix time (seconds) by which the step must be done."""

    @property
    def idempotency_key(self) -> str:
        """Stable key for side effects of this step of this run."""
        return f"{self.run_id}:{self.step_id}"

    def seconds_left(self) -> float:
        """Seconds until the step's deadline (may be negative)."""
        return self.deadline - time.time()
