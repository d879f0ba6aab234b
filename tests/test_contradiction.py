"""The contradiction check between an llm step's prompt and its answer: table tests of the pure
function (chainrt/_run/_contradiction.py says what it looks for and what it cannot see)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from chat_stub import ChatStub, serve

import chainrt
from chainrt._run._contradiction import MAX_FINDINGS, find_contradictions, penalised
from chainrt.store import open_store

ORDER = "Order ORD-7731 for 1,250 EUR was placed on 2024-03-05. The order has shipped."


@pytest.mark.parametrize(
    ("prompt", "answer", "expected"),
    [
        # Everything the answer states is in the prompt (formats may differ).
        (ORDER, "ORD-7731 cost 1250 EUR, placed 2024-3-5; it has shipped.", []),
        (ORDER, "ord-7731: 1,250.00 EUR.", []),
        # Numbers, dates and identifiers the prompt never gave.
        (ORDER, "Order ORD-7731 cost 1,300 EUR.", ["unsupported number 1,300"]),
        (ORDER, "It was placed on 2024-03-06.", ["unsupported date 2024-03-06"]),
        (ORDER, "See order ORD-7713.", ["unsupported identifier ORD-7713"]),
        (ORDER, "Refund 12.5 EUR on 01/04/2024 to ORD-1",
         ["unsupported date 01/04/2024", "unsupported number 12.5"]),  # ORD-1: one digit
        # Single digits, and numbers with a unit that the prompt has, are left alone.
        ("Ship within 48h.", "1. Ship it. 2. Within 48 hours.", []),
        ("Ship within 48 hours.", "Within 48h, at 3pm.", []),
        ("Call at 3pm.", "Call at 15pm.", ["unsupported number 15"]),
        # The answer denies a fact of the prompt.
        (ORDER, "No, the order has not shipped.", ['negates the prompt: "the order has shipped"']),
        ("The invoice is paid.", "The invoice isn't paid", ['negates the prompt: "the invoice is paid"']),
        ("The invoice is paid.", "The invoice was never paid", []),  # "was" is not what it said
        # A negation the prompt made itself is no contradiction, nor is a short one.
        ("The order has not shipped.", "The order has not shipped.", []),
        ("It is paid.", "Not paid.", []),
        ("", "", []),
    ],
)  # fmt: skip
def test_findings_table(prompt: str, answer: str, expected: list[str]) -> None:
    assert find_contradictions(prompt, answer) == expected


def test_findings_are_unique_and_capped() -> None:
    answer = " ".join(str(n) for n in range(10, 40)) + " 10 10"
    found = find_contradictions("no numbers here", answer)
    assert len(found) == MAX_FINDINGS
    assert found[0] == "unsupported number 10"
    assert len(set(found)) == len(found)


@pytest.mark.parametrize(
    ("score", "findings", "expected"),
    [(0.8, [], 0.8), (0.8, ["x"], 0.4), (0.8, ["x", "y"], 0.4), (None, ["x"], None)],
)
def test_penalty_halves_a_score_once(
    score: float | None, findings: list[str], expected: float | None
) -> None:
    assert penalised(score, findings) == expected


# ---------------------------------------------------------------- in a run (real HTTP, SQLite)


@pytest.fixture
def wrong() -> Iterator[ChatStub]:
    yield from serve("Order ORD-7713 shipped on 2024-03-09.", 0.8)


@pytest.fixture
def right() -> Iterator[ChatStub]:
    yield from serve("Order ORD-7731 shipped.", 0.9)


def _run_files(tmp_path: Path, wrong: ChatStub, right: ChatStub, verify: str) -> tuple[str, str]:
    pool = tmp_path / "pool.yaml"
    pool.write_text(
        f"models:\n  primary: {{endpoints: [{{url: '{wrong.url}'}}]}}\n"
        f"  other: {{endpoints: [{{url: '{right.url}'}}]}}\nhealth: {{enabled: false}}\n"
    )
    chain = tmp_path / "chain.yaml"
    chain.write_text(
        "name: orders\nbudget: 30s\ninputs: {id: str}\nsteps:\n  - id: ask\n"
        "    llm: {model: primary, prompt: 'Has order {{ input.id }} shipped?', max_tokens: 20}\n"
        f"{verify}output: '{{{{ steps.ask.output }}}}'\n"
    )
    return str(chain), str(pool)


async def test_contradictions_are_recorded_and_lower_the_score(
    tmp_path: Path, wrong: ChatStub, right: ChatStub
) -> None:
    chain, pool = _run_files(tmp_path, wrong, right, "")
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    result = await chainrt.load(chain).arun({"id": "ORD-7731"}, run_id="c1", store=store, pool=pool)
    assert result.status == "completed", result.error
    expected = ["unsupported date 2024-03-09", "unsupported identifier ORD-7713"]
    assert result.steps[0].contradictions == expected
    assert result.steps[0].confidence_score == 0.4  # the model's 0.8, halved
    opened = open_store(store)
    try:
        record = (await opened.get_steps("c1"))["ask"]
    finally:
        await opened.close()
    assert record.contradictions == expected
    assert record.attempt_log[0].confidence == 0.8  # the attempt keeps the model's own score
    shown = subprocess.run(
        [sys.executable, "-m", "chainrt", "inspect", "c1", "--store", store],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert "contradictions: unsupported date 2024-03-09; unsupported identifier ORD-7713" in shown


async def test_the_lowered_score_sends_the_answer_to_verify(
    tmp_path: Path, wrong: ChatStub, right: ChatStub
) -> None:
    # 0.8 alone passes below: 0.6; halved by the contradictions, it is verified and replaced.
    verify = "    verify: {below: 0.6, with: [other], on_mismatch: fallback}\n"
    chain, pool = _run_files(tmp_path, wrong, right, verify)
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    result = await chainrt.load(chain).arun({"id": "ORD-7731"}, run_id="c2", store=store, pool=pool)
    assert result.status == "completed", result.error
    step = result.steps[0]
    assert (step.verification_status, step.model) == ("mismatch", "other")
    assert result.output == "Order ORD-7731 shipped."
    assert step.contradictions is None  # the verifier's answer states nothing unsupported
    assert step.confidence_score == 0.9
    assert right.requests == 1
