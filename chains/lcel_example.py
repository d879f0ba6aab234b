"""chainrt and LangChain Expression Language (LCEL), composed both ways.

1. An LCEL pipeline as a chain step: ``lcel_support.yaml`` runs :func:`reply_chain`
   (``prompt | ChatChainrt | StrOutputParser``) as its ``reply`` step, under the step's deadline.
2. A chain inside an LCEL pipeline: :func:`support_pipeline` is
   ``chain.as_runnable() | RunnableLambda(format_reply)``.

Run it::

    python chains/lcel_example.py "Where is my order 1042?"            # the formatted reply
    python chains/lcel_example.py --stream "Can I get a refund for 1001?"  # live step events

``--store``, ``--pool`` and ``--budget`` mean what they mean for ``chainrt run``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda

import chainrt
from chainrt.langchain import ChainEvent, ChatChainrt

CHAIN_FILE = Path(__file__).resolve().with_name("lcel_support.yaml")

_PROMPT = ChatPromptTemplate.from_messages(
    [
        (
            "system",
            "You are a friendly order-support agent. Answer in one or two short sentences, "
            "using only facts from the order record.",
        ),
        ("human", "Customer question: {question}\nOrder record: {order}"),
    ]
)


def reply_chain() -> Runnable[dict[str, Any], str]:
    """The reply step: a factory, so the model is built per run (``CHAINRT_POOL`` read then).

    ``primary`` is asked first and ``local`` (the in-process small model) is the fallback; the
    chat model's deadline is the step's, so a slow ``primary`` leaves ``local`` time to answer.
    """
    llm = ChatChainrt(model="primary", fallbacks=["local"], max_tokens=60, temperature=0)
    return _PROMPT | llm | StrOutputParser()


def format_reply(output: dict[str, Any]) -> str:
    """The chain's output as a reply a person reads."""
    order = output.get("order") or {}
    header = f"Order {order.get('order_id')}: {order.get('status', 'not found')}"
    return f"{header}\n{str(output.get('answer', '')).strip()}"


def support_pipeline(
    *, store: str | None = None, pool: str | None = None
) -> Runnable[dict[str, Any], str]:
    """The whole chain as one step of an LCEL pipeline that formats its output."""
    chain = chainrt.load(CHAIN_FILE)
    return chain.as_runnable(store=store, pool=pool) | RunnableLambda(format_reply)


def _describe(event: ChainEvent) -> str:
    kind, step = event["type"], event.get("step_id")
    if kind == "step_started":
        return f"  {step}: started, {event['allotted_ms']:.0f}ms allotted"
    if kind == "attempt":
        model = f" ({event['model']})" if event.get("model") else ""
        return f"  {step}: attempt {event['attempt']}{model} {event['status']}"
    if kind == "token":
        return f"  {step}: {event['text']!r}"
    if kind == "step_finished":
        return f"  {step}: {event['status']} in {event['elapsed_ms']:.0f}ms"
    if kind == "run_finished":
        return f"run {event['run_id']}: {event['status']}"
    return f"run {event['run_id']}: started"


def main(argv: list[str] | None = None) -> int:
    """Answer one question from the command line; prints the reply (or live events)."""
    parser = argparse.ArgumentParser(description="Answer an order question with lcel_support.")
    parser.add_argument("question", nargs="?", default="Where is my order 1042?")
    parser.add_argument("--user", default="u1", help="the customer asking (default: u1)")
    parser.add_argument("--store", help="checkpoint store URL (default: CHAINRT_STORE)")
    parser.add_argument("--pool", help="worker-pool YAML (default: CHAINRT_POOL)")
    parser.add_argument("--budget", help="budget of the run, e.g. 8s (default: the chain's)")
    parser.add_argument("--stream", action="store_true", help="print step events as they come")
    args = parser.parse_args(argv)
    config: RunnableConfig = {"configurable": {"budget": args.budget} if args.budget else {}}
    inputs = {"user_id": args.user, "question": args.question}
    if args.stream:
        runnable = chainrt.load(CHAIN_FILE).as_runnable(store=args.store, pool=args.pool)
        for chunk in runnable.stream(inputs, config):
            print(_describe(chunk) if isinstance(chunk, ChainEvent) else json.dumps(chunk))
        return 0
    print(support_pipeline(store=args.store, pool=args.pool).invoke(inputs, config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
