"""Does the support agent answer right? 20 questions about the orders in ``chains/data/``.

    .venv/bin/python bench/demo_quality.py [--budget 8s] [--pool FILE] [--store URL]

Runs ``chains/support_agent.yaml`` once per question (status, eta, carrier, refund, unknown
order) and checks the final answer against facts written down here, from ``orders.json``: every
expected phrase must appear (case-insensitive) and no forbidden one (another order's status, a
refusal). Prints one line per question, then how many answers state the right facts, and how
many of those came from the model itself versus the agent's templated fallback (its
``answer_check`` step replaces an answer that misses or contradicts a fact), and how often the
JSON steps (``intent_parse``, ``tool_selection``) were answered by a model rather than their
static answer, and how often the model chose the right tool (``refund_policy`` for the refund
questions, ``lookup_order`` for the others; ``output.order.tool``). Without ``--pool``
every LLM step runs on the in-process local model (SmolLM2-135M), which is the goal's setting.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CHAIN = Path(__file__).resolve().parent.parent / "chains" / "support_agent.yaml"
REFUND = "30 days"
NOT_FOUND = ("could not find", "couldn't find", "cannot find", "can't find", "no order")
"""Any one of these phrasings says the order was not found."""

QUESTIONS: list[tuple[str, list[str | tuple[str, ...]]]] = [
    ("Where is my order 1042?", ["1042", "shipped", "UPS", "2026-12-02"]),
    ("When will order 1042 arrive?", ["1042", "2026-12-02"]),
    ("Which carrier has my order 1042?", ["1042", "UPS"]),
    ("What is the status of order 1001?", ["1001", "delivered"]),
    ("Has order 1001 been delivered yet?", ["1001", "delivered", "DHL"]),
    ("Where is my order 1017?", ["1017", "prepar", "2026-12-04"]),
    ("When does order 1017 ship?", ["1017", "2026-12-04"]),
    ("Is order 1077 still coming?", ["1077", "cancel"]),
    ("What happened to order 1077?", ["1077", "cancel"]),
    ("Where is order 1103?", ["1103", "out for delivery", "GLS", "2026-11-30"]),
    ("When will 1103 get here?", ["1103", "2026-11-30"]),
    ("What is the status of order 1150?", ["1150", "returned"]),
    ("Can I get a refund for order 1001?", ["1001", REFUND]),
    ("I want to return order 1150, how do refunds work?", ["1150", REFUND]),
    ("How do I get my money back for order 1042?", ["1042", REFUND]),
    ("Refund for order 1103 please", ["1103", REFUND]),
    ("Where is my order 9999?", [NOT_FOUND]),
    ("Status of order 5555?", [NOT_FOUND]),
    ("Where is my package?", [NOT_FOUND, ("order number", "no order")]),
    ("Can I get a refund for order 4242?", [NOT_FOUND, REFUND]),
]
"""(question, phrases the answer must contain; a tuple: any one of its phrasings)."""
FORBIDDEN = ("unable to assist", "cannot help", "can't help")


def right_tool(expected: list[str | tuple[str, ...]]) -> str:
    """The tool ``tool_selection`` should choose for a question with these expected phrases."""
    return "refund_policy" if REFUND in expected else "lookup_order"


def judge(answer: str, expected: list[str | tuple[str, ...]]) -> list[str]:
    """What is wrong with ``answer`` (empty: it states the right facts)."""
    text = answer.lower()
    wrong = [
        f"missing {p!r}"
        for p in expected
        if not any(alt.lower() in text for alt in ((p,) if isinstance(p, str) else p))
    ]
    wrong += [f"says {p!r}" for p in FORBIDDEN if p in text]
    return wrong


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default=None, help="override the chain's budget, e.g. 15s")
    parser.add_argument("--pool", default=None, help="pool file (default: local model only)")
    parser.add_argument("--store", default=None, help="store URL (default: a fresh SQLite file)")
    args = parser.parse_args()

    import chainrt

    store = args.store or f"sqlite:///{tempfile.mkdtemp(prefix='demo-quality-')}/runs.db"
    chain = chainrt.load(CHAIN)
    right = from_model = tool_right = 0
    json_by_model = {"intent_parse": 0, "tool_selection": 0}
    started = time.perf_counter()
    for n, (question, expected) in enumerate(QUESTIONS, 1):
        kwargs: dict[str, Any] = {"store": store}
        if args.budget:
            kwargs["budget"] = args.budget
        if args.pool:
            kwargs["pool"] = args.pool
        t0 = time.perf_counter()
        result = chain.run(
            {"user_id": "bench", "session_id": f"q{n}", "question": question}, **kwargs
        )
        for step in result.steps:
            if step.id in json_by_model and step.model not in (None, "static"):
                json_by_model[step.id] += 1
        output = result.output if isinstance(result.output, dict) else {}
        answer = str(output.get("answer") or "")
        source = str(output.get("answer_source") or "?")
        order = output.get("order")
        tool = order.get("tool") if isinstance(order, dict) else None
        tool_right += tool == right_tool(expected)
        wrong = judge(answer, expected) if result.status == "completed" else [result.status]
        right += not wrong
        from_model += not wrong and source == "model"
        verdict = "ok " if not wrong else "BAD"
        print(
            f"{verdict} {n:2d} [{source:8s} {time.perf_counter() - t0:5.1f}s] {question}\n"
            f"       -> {answer[:200]}"
            + (f"\n       {'; '.join(wrong)}" if wrong else "")
            + ("" if tool == right_tool(expected) else f"\n       tool chosen: {tool}")
        )
    total = len(QUESTIONS)
    print(
        f"\nright facts: {right}/{total} answers ({from_model} written by the model, "
        f"{right - from_model} by the templated fallback); {time.perf_counter() - started:.0f}s"
    )
    print(
        "schema-valid JSON from a model (not the static answer): "
        + ", ".join(f"{step} {n}/{total}" for step, n in json_by_model.items())
        + f"; the right tool chosen: {tool_right}/{total}"
    )
    return 0 if right * 10 >= total * 9 else 1


if __name__ == "__main__":
    sys.exit(main())
