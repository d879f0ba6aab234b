"""``bench/_median_ci.py``: the 95 % intervals of a median ratio that the cluster bench prints
(pure arithmetic; the order-statistic ranks checked against the binomial tables)."""

from __future__ import annotations

import random
import statistics
from types import ModuleType

import pytest
from bench_loader import REPO, load_module


def _module() -> ModuleType:
    return load_module("bench_median_ci", REPO / "bench" / "_median_ci.py")


@pytest.mark.parametrize(
    ("n", "low_rank", "coverage"),
    [
        (6, 1, 0.96875),  # the smallest n with a 95 % interval: the whole range
        (20, 6, 0.95861),  # the textbook ranks: 6th and 15th of 20
        (100, 40, 0.96480),  # 40th and 61st of 100
    ],
)
def test_order_interval_picks_the_narrowest_ranks_that_keep_95_percent(
    n: int, low_rank: int, coverage: float
) -> None:
    values = [float(v) for v in range(1, n + 1)]
    random.Random(n).shuffle(values)  # the order given does not matter
    low, high, covers = _module().order_interval(values)
    assert (low, high) == (low_rank, n + 1 - low_rank)
    assert covers == pytest.approx(coverage, abs=1e-5)


def test_too_few_rounds_give_the_whole_range_and_say_how_little_it_covers() -> None:
    low, high, covers = _module().order_interval([3.0, 1.0, 2.0])
    assert (low, high) == (1.0, 3.0)
    assert covers == pytest.approx(0.75)


def test_bootstrap_interval_holds_the_median_and_is_repeatable() -> None:
    rng = random.Random(7)
    values = [rng.lognormvariate(0, 0.5) for _ in range(60)]
    low, high = _module().bootstrap_interval(values)
    assert low < statistics.median(values) < high
    assert _module().bootstrap_interval(values) == (low, high)  # seeded
    with pytest.raises(ValueError, match="no values"):
        _module().order_interval([])
