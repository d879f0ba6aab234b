"""Tools of the control-flow examples (when, switch, parallel, map): small, deterministic, local.

They read the example order database in ``data/orders.json`` and keep no state, so every example
chain runs without a model or a network.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

_DB = Path(__file__).resolve().parent.parent / "data" / "orders.json"
_ORDER_ID = re.compile(r"\b(\d{3,8})\b")
_KB = {
    "refund": "Refunds are possible within 30 days of delivery; the money is back within 5 days.",
    "shipping": "Orders ship within 2 working days; tracking links come by e-mail.",
    "cancel": "An order can be cancelled until it ships.",
}


def _orders() -> dict[str, dict[str, Any]]:
    data: dict[str, dict[str, Any]] = json.loads(_DB.read_text(encoding="utf-8"))
    return data


def classify(question: str) -> dict[str, Any]:
    """The intent of a question (``refund``, ``status`` or ``other``) and the order id in it."""
    text = question.lower()
    found = _ORDER_ID.findall(text)
    if any(word in text for word in ("refund", "return", "money back")):
        intent = "refund"
    elif any(word in text for word in ("where", "status", "arrive", "shipped")):
        intent = "status"
    else:
        intent = "other"
    return {"intent": intent, "order_id": found[0] if found else None}


async def lookup_order(order_id: str) -> dict[str, Any]:
    """The order's record (``{"found": false}`` when there is no such order)."""
    await asyncio.sleep(0.02)  # a database round trip
    order = _orders().get(str(order_id))
    return {"found": False, "order_id": order_id} if order is None else {"found": True, **order}


async def search_kb(question: str) -> list[str]:
    """Knowledge-base passages that share a word with the question."""
    await asyncio.sleep(0.03)  # a search round trip
    words = set(re.findall(r"[a-z]+", question.lower()))
    return [text for topic, text in _KB.items() if topic in words or topic + "s" in words]


def refund_policy() -> str:
    """The refund policy."""
    return _KB["refund"]


def answer(template: str, **facts: Any) -> str:
    """Fill an answer template with facts (a stand-in for a model call in these examples)."""
    return template.format(**facts)


def label(ticket: str) -> dict[str, str]:
    """Label one support ticket by keywords."""
    text = ticket.lower()
    kind = "refund" if "refund" in text else "delivery" if "late" in text else "question"
    return {"ticket": ticket, "label": kind}
