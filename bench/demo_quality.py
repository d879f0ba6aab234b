"""Does the support agent answer right? 25 questions about the orders in ``chains/data/``.

    .venv/bin/python bench/demo_quality.py [--budget 12s] [--pool FILE] [--store URL] [--chain FILE]

Runs ``chains/support_agent.yaml`` (or ``--chain``, e.g. an older copy to compare) once per
question (status, eta, carrier, refund, questions that need both the order and the refund
policy, unknown order, another customer's order); a run that stops waiting for a refund's
approval is approved (``refund_ok``) and continues, as ``scripts/demo --approve`` does, and checks the final answer against facts written down here, from ``orders.json``: every
expected phrase must appear (case-insensitive) and no forbidden one (another order's status, a
refusal). Prints one line per question, then how many answers state the right facts, and how
many of those came from the model itself versus the agent's templated fallback (its
``answer_check`` step replaces an answer that misses or contradicts a fact), and how often the
JSON steps (``intent_parse``, ``tool_selection``) were answered by a model rather than their
static answer, and how often the model chose the right tool (``refund_policy`` for the refund
questions, ``lookup_order`` for the others; ``output.order.tool``), and that a customer asking about
another customer's order gets "not found" and none of its facts (exit 1 on any leak). Without ``--pool``
every LLM step runs on the in-process local model (SmolLM2-135M), which is the goal's setting.
"""

from __future__ import annotations

import argparse
import json
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

QUESTIONS: list[tuple[str, str, list[str | tuple[str, ...]]]] = [
    ("u1", "Where is my order 1042?", ["1042", "shipped", "UPS", "2026-12-02"]),
    ("u1", "When will order 1042 arrive?", ["1042", "2026-12-02"]),
    ("u1", "Which carrier has my order 1042?", ["1042", "UPS"]),
    ("u1", "What is the status of order 1001?", ["1001", "delivered"]),
    ("u1", "Has order 1001 been delivered yet?", ["1001", "delivered", "DHL"]),
    ("u2", "Where is my order 1017?", ["1017", "prepar", "2026-12-04"]),
    ("u2", "When does order 1017 ship?", ["1017", "2026-12-04"]),
    ("u3", "Is order 1077 still coming?", ["1077", "cancel"]),
    ("u3", "What happened to order 1077?", ["1077", "cancel"]),
    ("u2", "Where is order 1103?", ["1103", "out for delivery", "GLS", "2026-11-30"]),
    ("u2", "When will 1103 get here?", ["1103", "2026-11-30"]),
    ("u4", "What is the status of order 1150?", ["1150", "returned"]),
    ("u1", "Can I get a refund for order 1001?", ["1001", REFUND]),
    ("u4", "I want to return order 1150, how do refunds work?", ["1150", REFUND]),
    ("u1", "How do I get my money back for order 1042?", ["1042", REFUND]),
    ("u2", "Refund for order 1103 please", ["1103", REFUND]),
    # Two tool calls: the order's own facts and the refund policy, in one answer.
    ("u1", "Can I get a refund for order 1042, and where is it now?", ["1042", "shipped", REFUND]),
    ("u2", "When does order 1103 arrive, and can I return it?", ["1103", "2026-11-30", REFUND]),
    (
        "u4",
        "What is the status of order 1150 and your refund policy?",
        ["1150", "returned", REFUND],
    ),
    ("u1", "Where is my order 9999?", [NOT_FOUND]),
    ("u1", "Status of order 5555?", [NOT_FOUND]),
    ("u1", "Where is my package?", [NOT_FOUND, ("order number", "no order")]),
    ("u1", "Can I get a refund for order 4242?", [NOT_FOUND, REFUND]),
    # Per-user isolation: u1 asks about u2's orders; they must be refused as not found.
    ("u1", "Where is my order 1017?", [NOT_FOUND]),
    ("u1", "When will order 1103 arrive?", [NOT_FOUND]),
]
"""(the customer asking, question, phrases the answer must contain; a tuple: any one of its
phrasings). The customer owns the order asked about, except in the isolation questions."""
LEAKS: dict[tuple[str, str], tuple[str, ...]] = {
    ("u1", "Where is my order 1017?"): ("running shoes", "prepar", "2026-12-04", "89.90"),
    ("u1", "When will order 1103 arrive?"): ("out for delivery", "GLS", "2026-11-30"),
}
"""Facts of another customer's order that an isolation question's answer must not show."""
FORBIDDEN = ("unable to assist", "cannot help", "can't help")


def right_tool(expected: list[str | tuple[str, ...]]) -> str:
    """The tool ``tool_selection`` should choose for a question with these expected phrases."""
    return "refund_policy" if REFUND in expected else "lookup_order"


def judge(
    answer: str, expected: list[str | tuple[str, ...]], leaks: tuple[str, ...] = ()
) -> list[str]:
    """What is wrong with ``answer`` (empty: it states the right facts, and none of ``leaks``,
    another customer's facts)."""
    text = answer.lower()
    wrong = [
        f"missing {p!r}"
        for p in expected
        if not any(alt.lower() in text for alt in ((p,) if isinstance(p, str) else p))
    ]
    wrong += [f"says {p!r}" for p in FORBIDDEN if p in text]
    wrong += [f"LEAKS another customer's {p!r}" for p in leaks if p.lower() in text]
    return wrong


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default=None, help="override the chain's budget, e.g. 15s")
    parser.add_argument("--pool", default=None, help="pool file (default: local model only)")
    parser.add_argument("--store", default=None, help="store URL (default: a fresh SQLite file)")
    parser.add_argument("--chain", default=str(CHAIN), help="chain file (default: %(default)s)")
    args = parser.parse_args()

    import chainrt
    from chainrt._defaults import default_runtime, run_sync

    async def approve(run_id: str, store: str) -> Any:
        runtime = await default_runtime(store, args.pool)
        payload = {"approved": True, "note": "approved by bench/demo_quality.py"}
        return await runtime.signal(run_id, "refund_ok", payload)

    store = args.store or f"sqlite:///{tempfile.mkdtemp(prefix='demo-quality-')}/runs.db"
    chain = chainrt.load(args.chain)
    right = from_model = tool_right = leaked = approvals = 0
    agent_runs = agent_answered = agent_both = 0
    json_by_model = {"intent_parse": 0, "tool_selection": 0}
    started = time.perf_counter()
    for n, (user, question, expected) in enumerate(QUESTIONS, 1):
        kwargs: dict[str, Any] = {"store": store}
        if args.budget:
            kwargs["budget"] = args.budget
        if args.pool:
            kwargs["pool"] = args.pool
        t0 = time.perf_counter()
        result = chain.run({"user_id": user, "session_id": f"q{n}", "question": question}, **kwargs)
        if result.status == "waiting":  # a refund over the threshold: a person approves it
            approvals += 1
            result = run_sync(approve(result.run_id, store))
        for step in result.steps:
            if step.id in json_by_model and step.model not in (None, "static"):
                json_by_model[step.id] += 1
        output = result.output if isinstance(result.output, dict) else {}
        answer = str(output.get("answer") or "")
        source = str(output.get("answer_source") or "?")
        order = output.get("order")
        tool = order.get("tool") if isinstance(order, dict) else None
        calls = order.get("agent_calls") if isinstance(order, dict) else None
        if isinstance(calls, list):  # the refund branch ran its agent
            agent_runs += 1
            agent_answered += isinstance(order, dict) and order.get("agent_answered") is True
            agent_both += {"find_order", "refund_policy"} <= set(calls)
        tool_right += tool == right_tool(expected)
        leaks = LEAKS.get((user, question), ())
        wrong = judge(answer, expected, leaks) if result.status == "completed" else [result.status]
        # The whole output (the order record too), not just the answer, must hold no leak.
        leaked += any(p.lower() in json.dumps(output).lower() for p in leaks)
        right += not wrong
        from_model += not wrong and source == "model"
        verdict = "ok " if not wrong else "BAD"
        print(
            f"{verdict} {n:2d} [{source:8s} {time.perf_counter() - t0:5.1f}s] {user}: {question}\n"
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
    print(f"another customer's order refused: {len(LEAKS) - leaked}/{len(LEAKS)} questions")
    print(
        f"refunds approved (runs that waited for refund_ok): {approvals}; the refund agent ran "
        f"{agent_runs} times, answered in time {agent_answered}, called both tools {agent_both}"
    )
    return 0 if right * 10 >= total * 9 and not leaked else 1


if __name__ == "__main__":
    sys.exit(main())
