"""The flow drill chain's expectations (``tests/data/drill/flow.yaml``): pure, no I/O.

The chain runs ``s00``, ``pick`` (whose output picks the switch's branch and the map's items),
the switch ``route`` (``wide``: a parallel group joined on all; ``race``: one joined on any;
otherwise a map), then ``s99``. Each leaf step's output is ``next_value(input, path)``, so the
expected output follows from the seed alone, up to which branch of the ``any`` group won.
"""

from __future__ import annotations

from typing import Any

from ._drill_verify import next_value

__all__ = ["FLOW_LEAVES", "FLOW_MAX_INFLIGHT", "FlowExpectation", "flow_expectation", "pick_value"]

_BRANCHES = ("wide", "race", "items")
_ITEMS = 4
FLOW_MAX_INFLIGHT = 2
"""Leaf steps of the flow chain that run at once at most (two branches, or two map items)."""


def pick_value(prev: Any, step_id: str) -> dict[str, Any]:
    """The ``pick`` step's output: ``next_value`` plus the branch and the map items it picks."""
    value = next_value(prev, step_id)
    digest = value["h"]
    branch = _BRANCHES[int(digest[:2], 16) % len(_BRANCHES)]
    return {**value, "branch": branch, "items": [digest[i * 4 : i * 4 + 4] for i in range(_ITEMS)]}


def _wide() -> list[str]:
    return ["route.wide.fan.a.a1", "route.wide.fan.a.a2", "route.wide.fan.b.b1",
            "route.wide.fan.b.b2", "route.wide.merge"]  # fmt: skip


def _items() -> list[str]:
    inner = [f"route.default.each[{i}].{s}" for i in range(_ITEMS) for s in ("m1", "m2")]
    return [*inner, "route.default.tail"]


_RACE_FAST = ["route.race.first.fast.f1"]
_RACE_SLOW = ["route.race.first.slow.l1", "route.race.first.slow.l2"]
FLOW_LEAVES = frozenset(
    ["s00", "pick", "s99", *_wide(), *_items(), *_RACE_FAST, *_RACE_SLOW, "route.race.after"]
)
"""Every leaf step path of the flow chain, whichever branch runs."""


class FlowExpectation:
    """What a completed flow drill run must show for its seed."""

    def __init__(self, branch: str, outputs: list[Any], required: frozenset[str]) -> None:
        self.branch = branch
        """The switch's recorded choice (``route#branch``) the seed implies."""
        self.outputs = outputs
        """The acceptable run outputs (two for the ``any`` group: either branch may win)."""
        self.required = required
        """Leaf step paths that must have a completed record."""


def flow_expectation(seed: str) -> FlowExpectation:
    """The flow chain's expected branch, outputs and completed leaf steps for ``seed``."""
    s00 = next_value(seed, "s00")
    pick = pick_value(s00, "pick")
    branch = pick["branch"]
    base = {"s00", "pick", "s99"}
    ends: list[tuple[Any, frozenset[str]]]
    if branch == "wide":
        a = next_value(next_value(pick, "route.wide.fan.a.a1"), "route.wide.fan.a.a2")
        b = next_value(next_value(pick, "route.wide.fan.b.b1"), "route.wide.fan.b.b2")
        ends = [(next_value({"a": a, "b": b}, "route.wide.merge"), frozenset(_wide()))]
    elif branch == "race":
        fast = next_value(pick, "route.race.first.fast.f1")
        slow = next_value(next_value(pick, "route.race.first.slow.l1"), "route.race.first.slow.l2")
        ends = [
            (next_value({name: out}, "route.race.after"), frozenset([*steps, "route.race.after"]))
            for name, out, steps in (("fast", fast, _RACE_FAST), ("slow", slow, _RACE_SLOW))
        ]
    else:
        branch = "default"
        outs = []
        for i, item in enumerate(pick["items"]):
            m1 = next_value(item, f"route.default.each[{i}].m1")
            outs.append(next_value(m1, f"route.default.each[{i}].m2"))
        ends = [(next_value(outs, "route.default.tail"), frozenset(_items()))]
    outputs = [{"end": next_value(route, "s99"), "branch": branch} for route, _ in ends]
    # The any group's loser may be recorded or not: only the steps every winner needs are required.
    required = frozenset(base) | frozenset.intersection(*(steps for _, steps in ends))
    return FlowExpectation(branch, outputs, required)
