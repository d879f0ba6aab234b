"""``bench/_capacity.py``: the fallback bench's verdict on whether a workload fits what the
engines answer (pure arithmetic on measured seconds per answer)."""

from __future__ import annotations

from types import ModuleType

import pytest
from bench_loader import REPO, load_module


def _module() -> ModuleType:
    return load_module("bench_capacity", REPO / "bench" / "_capacity.py")


@pytest.mark.parametrize(
    ("concurrency", "steps", "budget_s", "fits"),
    [
        (2, 2, 6.0, True),  # 2 x 0.2 s queue vs 3 s a step
        (4, 3, 3.0, True),  # 4 x 0.2 s = 0.8 s vs 1 s a step
        (4, 3, 2.0, False),  # 0.8 s vs 0.67 s a step: the load alone can fail runs
        (16, 2, 6.0, False),  # 16 x 0.2 s = 3.2 s vs 3 s
    ],
)
def test_headroom_compares_the_worst_queue_with_a_steps_share(
    concurrency: int, steps: int, budget_s: float, fits: bool
) -> None:
    capacity = _module().Capacity(0.1, 0.1, 0.15, 0.2)  # the slower shared engine: 0.2 s
    line = _module().headroom(capacity, concurrency=concurrency, steps=steps, budget_s=budget_s)
    assert ("OVERLOADED" not in line) is fits
    assert f"{concurrency} x 200 ms" in line


def test_capacity_adds_both_engines_rates_when_shared() -> None:
    capacity = _module().Capacity(0.1, 0.1, 0.25, 0.5)
    assert capacity.shared_per_s == pytest.approx(6.0)
    assert "= 6.00 answers/s" in capacity.describe()
