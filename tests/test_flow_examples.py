"""The control-flow examples in chains/ validate, and run to the answers they describe."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chainrt._runner import Runner
from chainrt.concurrency import LocalLimiter
from chainrt.dispatch import Dispatcher
from chainrt.spec import load_spec
from chainrt.store import open_store

CHAINS = Path(__file__).resolve().parent.parent / "chains"
EXAMPLES = ["when", "switch", "parallel", "map", "adaptive"]


@pytest.mark.parametrize("name", EXAMPLES)
def test_each_example_validates(name: str) -> None:
    spec = load_spec(CHAINS / f"{name}_example.yaml").spec
    assert spec.name == f"{name}-example"


async def run(name: str, inputs: dict[str, Any], tmp_path: Path) -> Any:
    loaded = load_spec(CHAINS / f"{name}_example.yaml")
    store = open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    try:
        # No model pool at all: the adaptive example must take its template branch.
        runner = Runner(store, Dispatcher({}), LocalLimiter())
        result = await runner.run(loaded.spec, inputs, source_dir=loaded.source_dir)
    finally:
        await store.close()
    assert result.status == "completed", result.error
    return result


RUNS = [
    ("when", {"question": "Where is 1042?"}, "Order: shipped"),
    ("when", {"question": "Where is my parcel?"}, "Order: no order named"),
    (
        "switch",
        {"question": "I want a refund for 1001"},
        {
            "answer": "Refunds: Refunds are possible within 30 days of delivery; the money is back "
            "within 5 days.",
            "branch": "refund",
        },
    ),
    (
        "switch",
        {"question": "where is 1017"},
        {"answer": "Your order is processing.", "branch": "status"},
    ),
    (
        "switch",
        {"question": "hello"},
        {"answer": "A person will get back to you.", "branch": "default"},
    ),
    (
        "map",
        {"tickets": ["refund please", "parcel is late", "hi"]},
        [
            {"ticket": "refund please", "label": "refund"},
            {"ticket": "parcel is late", "label": "delivery"},
            {"ticket": "hi", "label": "question"},
        ],
    ),
]


@pytest.mark.parametrize(
    ("name", "inputs", "output"), RUNS, ids=[f"{r[0]}-{i}" for i, r in enumerate(RUNS)]
)
async def test_an_example_answers_as_described(
    name: str, inputs: dict[str, Any], output: Any, tmp_path: Path
) -> None:
    assert (await run(name, inputs, tmp_path)).output == output


async def test_the_parallel_example_gathers_both_lookups(tmp_path: Path) -> None:
    result = await run("parallel", {"question": "refund for 1001?"}, tmp_path)
    assert result.output["order"]["item"] == "espresso machine"
    assert result.output["passages"] == [
        "Refunds are possible within 30 days of delivery; the money is back within 5 days."
    ]
    gather = next(s for s in result.steps if s.id == "gather")
    assert [s.path for s in gather.steps or []] == ["gather.order.order", "gather.kb.search"]


async def test_the_adaptive_example_answers_from_retrieval_without_a_healthy_model(
    tmp_path: Path,
) -> None:
    result = await run("adaptive", {"question": "refund for 1001?"}, tmp_path)
    assert result.output["flow"] == "false"
    assert result.output["answer"].startswith("From our help pages: ")
