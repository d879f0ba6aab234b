"""What a new run starts from: its input and run id checked, its budget, its first record.

Everything here happens before anything of the run is written: a bad input, run id or budget is
refused with a clear error (InputError, BudgetError) and nothing is stored.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from .._errors import BudgetError, InputError
from ..spec import ChainSpec
from ..spec._models import INPUT_TYPES

__all__ = ["check_budget", "check_inputs", "check_new_run_id", "new_run_id"]

_RUN_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


def new_run_id() -> str:
    """A fresh, unique run id."""
    return uuid.uuid4().hex


def check_new_run_id(run_id: str | None) -> str:
    """``run_id``, or a fresh one when None; InputError if it is not a valid run id."""
    run_id = new_run_id() if run_id is None else run_id  # "" is refused, not replaced
    if not _RUN_ID.fullmatch(run_id):
        shown = repr(run_id[:60]) + (f"... ({len(run_id)} characters)" if len(run_id) > 60 else "")
        raise InputError(f"run id must match [A-Za-z0-9_.:-]{{1,128}}, got {shown}")
    return run_id


def check_budget(spec: ChainSpec, budget_ms: float | None) -> float:
    """The run's total budget: ``budget_ms`` or the chain's own; BudgetError unless > 0."""
    total = spec.budget if budget_ms is None else budget_ms
    if total <= 0:
        raise BudgetError(f"budget must be greater than zero, got {total:g}ms")
    return total


def check_inputs(spec: ChainSpec, inputs: Any) -> dict[str, Any]:
    """Validate a run's input against the chain's declared inputs (before anything runs)."""
    if not isinstance(inputs, dict):
        raise InputError(
            f"input of chain {spec.name!r} must be a JSON object, got {type(inputs).__name__}"
        )
    missing = [name for name in spec.inputs if name not in inputs]
    if missing:
        raise InputError(f"input of chain {spec.name!r} lacks {', '.join(missing)}")
    if spec.inputs:
        unknown = [name for name in inputs if name not in spec.inputs]
        if unknown:
            allowed = ", ".join(spec.inputs)
            raise InputError(
                f"input of chain {spec.name!r} has unknown field(s) {', '.join(unknown)} (declared: {allowed})"
            )
    for name, type_name in spec.inputs.items():
        value = inputs[name]
        types = INPUT_TYPES[type_name]
        if isinstance(value, bool) and bool not in types and type_name != "any":
            ok = False
        else:
            ok = isinstance(value, types)
        if not ok:
            raise InputError(
                f"input field {name!r} of chain {spec.name!r} must be {type_name}, got {type(value).__name__}"
            )
    return dict(inputs)
