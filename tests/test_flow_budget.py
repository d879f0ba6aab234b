"""The budget inside groups and around `when`, as pure decisions (chainrt/budget/_flow.py)."""

from __future__ import annotations

from typing import Any

import pytest

from chainrt.budget import _flow as rules
from chainrt.budget import _steps as budget


@pytest.mark.parametrize(
    ("items", "size", "waves"),
    [(0, 8, 0), (1, 8, 1), (8, 8, 1), (9, 8, 2), (100, 10, 10), (1000, 64, 16)],
)
def test_wave_count(items: int, size: int, waves: int) -> None:
    assert rules.wave_count(items, size) == waves


@pytest.mark.parametrize(
    ("remaining", "waves_left", "each"),
    [(1000.0, 10, 100.0), (900.0, 9, 100.0), (500.0, 1, 500.0), (-5.0, 3, 0.0), (0.0, 2, 0.0)],
)
def test_each_wave_gets_the_time_left_over_the_waves_left(
    remaining: float, waves_left: int, each: float
) -> None:
    assert rules.wave_allotment(remaining, waves_left) == pytest.approx(each)


def test_time_a_wave_leaves_goes_to_the_waves_after_it() -> None:
    # 1 s, 4 waves: the first wave takes 50 ms of its 250; the next three share 950 ms.
    first = rules.wave_allotment(1000.0, 4)
    assert first == 250.0
    assert rules.wave_allotment(1000.0 - 50.0, 3) == pytest.approx(316.667, abs=0.001)


def test_bad_wave_arguments_are_refused() -> None:
    with pytest.raises(ValueError):
        rules.wave_count(3, 0)
    with pytest.raises(ValueError):
        rules.wave_allotment(10.0, 0)


CASES = ["refund", "status", "3", "true"]


@pytest.mark.parametrize(
    ("value", "has_default", "branch"),
    [
        ("refund", True, "refund"),
        ("REFUND", True, "default"),
        ("REFUND", False, None),
        (3, False, "3"),
        (True, False, "true"),
        (None, True, "default"),
        ({"intent": "refund"}, False, None),
        (["refund"], True, "default"),
    ],
)
def test_switch_picks_a_case_by_its_json_text(value: Any, has_default: bool, branch: str) -> None:
    assert rules.switch_branch(value, CASES, has_default) == branch


@pytest.mark.parametrize(
    ("statuses", "status"),
    [
        ([], "completed"),
        (["completed", "skipped"], "completed"),
        (["completed", "partial"], "partial"),
        (["partial", "rejected"], "rejected"),
        (["rejected", "failed", "partial"], "failed"),
    ],
)
def test_worst_status(statuses: list[str], status: str) -> None:
    assert rules.worst(statuses) == status


J = rules.GroupEnd


@pytest.mark.parametrize(
    ("join", "ended", "running", "end"),
    [
        ("all", [], 3, None),
        ("all", ["completed", "completed"], 1, None),
        ("all", ["completed", "completed", "completed"], 0, J("completed")),
        ("all", ["completed", "partial"], 0, J("partial")),  # a branch cut at the deadline
        ("any", [], 3, None),
        ("any", ["completed"], 2, J("completed")),  # the first completes: cancel the rest
        ("any", ["failed"], 2, None),
        ("any", ["failed", "partial"], 0, J("failed")),
        ({"quorum": 2}, ["completed"], 2, None),
        ({"quorum": 2}, ["completed", "completed"], 1, J("completed")),
        ({"quorum": 2}, ["completed", "partial"], 1, None),
        ({"quorum": 2}, ["partial", "partial"], 1, J("partial")),  # 2 can no longer complete
        ({"quorum": 3}, ["completed", "rejected"], 1, J("rejected")),
    ],
)
def test_join_decides_when_a_parallel_group_ends(
    join: Any, ended: list[str], running: int, end: rules.GroupEnd | None
) -> None:
    assert rules.join_state(join, ended, running) == end


def test_a_step_skipped_by_when_gives_its_weight_to_the_steps_after_it() -> None:
    # Steps a (1), b (1, skipped by `when`), c (2): 1200 ms left when b is reached.
    plan = budget.Plan([budget.StepBudget(1.0), budget.StepBudget(1.0), budget.StepBudget(2.0)])
    ran = plan.decide(1, 1200.0)
    assert ran == budget.Allot(400.0)  # had b run, it would have had a third
    # b skipped costs no time: c, deciding with the same 1200 ms, gets all of it (not 800).
    assert plan.decide(2, 1200.0) == budget.Allot(1200.0)


def test_a_switch_branch_is_a_sub_chain_on_the_groups_allotment() -> None:
    # The group was allotted 900 ms; its branch (weights 1 and 2) splits exactly that.
    branch = budget.Plan([budget.StepBudget(1.0), budget.StepBudget(2.0)])
    assert branch.decide(0, 900.0) == budget.Allot(300.0)
    assert branch.decide(1, 600.0) == budget.Allot(600.0)
