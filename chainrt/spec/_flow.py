"""Control flow in a chain: ``when``, ``switch``, ``parallel`` and ``map`` (the shapes, and walks).

A step that holds ``switch``, ``parallel`` or ``map`` is a *group*: it runs lists of steps of its
own (branches, or a sub-chain per item). Every step, at any depth, has a *path* that names it in
records and events: ``gather.kb.search`` (parallel branch ``kb``), ``route.refund.policy``
(switch case ``refund``), ``per_item[3].classify`` (map item 3). Top-level steps' paths are
their ids.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Final, Literal

from pydantic import Field

from .._strict import Strict

if TYPE_CHECKING:
    from ._models import StepSpec

__all__ = [
    "BRANCH_NAME",
    "CHOICE_SUFFIX",
    "DEFAULT_BRANCH",
    "FLOW_KEYS",
    "MAX_NESTING",
    "Join",
    "QuorumSpec",
    "branches",
    "has_flow",
    "item_path",
    "walk_steps",
]

MAX_NESTING: Final = 8
"""Groups may nest this many levels deep (a group at top level is level 1)."""

DEFAULT_BRANCH: Final = "default"
"""The path segment of a switch's ``default`` branch (so no case may be called that)."""

CHOICE_SUFFIX: Final = "#branch"
"""A switch's choice is recorded, before its branch runs, as a step record ``<path>#branch``."""

BRANCH_NAME: Final = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]*$")
"""What a case or parallel branch may be called (it is a segment of its steps' paths)."""

FLOW_KEYS: Final = (
    "when",
    "switch",
    "cases",
    "default",
    "parallel",
    "join",
    "map",
    "steps",
    "max_concurrency",
)
"""StepSpec fields of control flow (left out of a stored spec while unset)."""


class QuorumSpec(Strict):
    """``join: {quorum: N}``: the group completes once N branches have completed."""

    quorum: int = Field(ge=1, le=10_000, description="Branches that must complete.")


Join = Literal["all", "any"] | QuorumSpec
"""How a ``parallel`` group ends: every branch, the first one, or the first N."""


def branches(step: StepSpec) -> Iterator[tuple[str, list[StepSpec]]]:
    """The named step lists of a group: cases and default, parallel branches, a map's body."""
    if step.cases is not None:
        yield from step.cases.items()
    if step.switch is not None and step.default is not None:
        yield DEFAULT_BRANCH, step.default
    if step.parallel is not None:
        yield from step.parallel.items()
    if step.steps is not None:
        yield "[]", step.steps


def item_path(group_path: str, index: int) -> str:
    """The path prefix of map item ``index``: ``per_item[3]``."""
    return f"{group_path}[{index}]"


def walk_steps(steps: list[StepSpec], depth: int = 0) -> Iterator[tuple[StepSpec, int]]:
    """Every step at any depth, parents before their children, with its nesting depth (0: top)."""
    for step in steps:
        yield step, depth
        if step.switch is not None or step.parallel is not None or step.map is not None:
            for _, inner in branches(step):
                yield from walk_steps(inner, depth + 1)


def has_flow(steps: list[StepSpec]) -> bool:
    """True when any step has ``when`` or is a group (a straight chain skips the flow machinery)."""
    return any(
        s.when is not None or s.switch is not None or s.parallel is not None or s.map is not None
        for s in steps
    )
