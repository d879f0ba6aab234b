"""Order look-up for the support agent, over the small order database in ``data/orders.json``."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

_DB = Path(__file__).resolve().parent.parent / "data" / "orders.json"
_ORDER_ID = re.compile(r"\b(\d{3,8})\b")

NOT_FOUND_WORDS = ("could not find", "couldn't find", "cannot find", "can't find", "no order")
"""Any one of these says that the order was not found."""
_REFUND_WORDS = ("refund", "return", "money back")
REFUND_POLICY = "Refunds are possible within 30 days of delivery; the money is back within 5 days."


def _load() -> dict[str, dict[str, Any]]:
    data: dict[str, dict[str, Any]] = json.loads(_DB.read_text(encoding="utf-8"))
    return data


def _order_id(question: str, intent: Any) -> str | None:
    """The order id: from the parsed intent if the model found one, else from the question."""
    in_question = _ORDER_ID.findall(question)
    if isinstance(intent, dict):
        candidate = intent.get("order_id")
        # Only a number the customer wrote: a small model may invent one for "my package".
        if isinstance(candidate, int | str) and str(candidate) in in_question:
            return str(candidate)
    return in_question[0] if in_question else None


def _tool_name(selection: Any) -> str | None:
    """The tool the model chose (``{"tool": "lookup_order"}``), as a plain JSON value."""
    if isinstance(selection, dict) and isinstance(selection.get("tool"), str):
        return str(selection["tool"])[:40]
    return None


def lookup_order(
    question: str, user_id: str, intent: Any = None, selection: Any = None
) -> dict[str, Any]:
    """Find the order the question is about, among the orders of customer ``user_id`` only;
    small models make mistakes, so the question's own digits back up the parsed intent.
    Returns a JSON-ready record.

    Another customer's order is not found, with the very words of an order that does not exist:
    the answer tells nothing of it, not even that it exists.
    """
    # The question's own words decide: a small model's intent label is a hint, not a fact.
    wants_refund = any(w in question.lower() for w in _REFUND_WORDS)
    order_id = _order_id(question, intent)
    record: dict[str, Any] = {"order_id": order_id, "tool": _tool_name(selection)}
    if order_id is None:
        record["found"] = False
        record["note"] = "no order number in the question"
    else:
        order = _load().get(order_id)
        mine = order is not None and order.get("customer") == user_id
        record["found"] = mine
        if order is not None and mine:
            record.update({k: v for k, v in order.items() if k != "customer"})
        else:
            record["note"] = f"no order {order_id} on your account"
    if wants_refund:
        record["refund_policy"] = REFUND_POLICY
    record["facts"] = _facts(record)
    return record


def refund_policy() -> str:
    """The refund policy, looked up beside the order when the customer asks about a refund."""
    return REFUND_POLICY


def with_policy(order: dict[str, Any], policy: Any) -> dict[str, Any]:
    """The order record with the looked-up refund ``policy`` in it and its facts written again.

    The question's own words still decide (see :func:`lookup_order`): a model's ``refund`` label
    on a plain status question adds no policy to the answer.
    """
    if "refund_policy" not in order or not isinstance(policy, str) or not policy.strip():
        return order
    record = {**order, "refund_policy": policy.strip()}
    record["facts"] = _facts(record)
    return record


_STATUS = {
    "delivered": "was delivered",
    "processing": "is being prepared",
    "shipped": "has shipped",
    "cancelled": "was cancelled",
    "out_for_delivery": "is out for delivery",
    "returned": "was returned",
}


def _facts(record: dict[str, Any]) -> str:
    """The record in one plain sentence or two: small models paraphrase prose better than JSON."""
    if not record.get("found"):
        text = f"We could not find an order: {record.get('note', 'unknown order')}."
    else:
        text = f"Order {record['order_id']} ({record.get('item')}) {_STATUS.get(record.get('status', ''), record.get('status'))}"
        if record.get("carrier"):
            text += f" with {record['carrier']}"
        if record.get("eta") and record.get("status") not in ("delivered", "cancelled", "returned"):
            text += f" and should arrive on {record['eta']}"
        text += "."
    if record.get("refund_policy"):
        text += " " + str(record["refund_policy"])
    return text


_STATUS_WORDS = {
    "delivered": ("delivered",),
    "processing": ("prepar", "processing"),
    "shipped": ("shipped", "on its way", "on the way"),
    "cancelled": ("cancel",),
    "out_for_delivery": ("out for delivery",),
    "returned": ("returned",),
}
"""Words an answer must use for each status (any one of them)."""
_WRONG_STATUS = {
    status: tuple(w for other, words in _STATUS_WORDS.items() if other != status for w in words)
    for status in _STATUS_WORDS
}


def answer_misses(answer: str, order: dict[str, Any]) -> list[str]:
    """The facts of ``order`` that ``answer`` fails to state, or states wrongly (empty: none)."""
    text = answer.lower()
    missing: list[str] = []
    if not order.get("found"):
        if not any(w in text for w in NOT_FOUND_WORDS):
            missing.append("that the order was not found")
    else:
        status = str(order.get("status"))
        if order.get("order_id") and str(order["order_id"]) not in text:
            missing.append("order id")
        if not any(w in text for w in _STATUS_WORDS.get(status, (status,))):
            missing.append("status")
        # The item's own name may hold another status's word ("noise-cancelling"): not a claim.
        item = str(order.get("item") or "").lower()
        claims = text.replace(item, " ") if item else text
        if any(w in claims for w in _WRONG_STATUS.get(status, ())):
            missing.append("no other status")
        if order.get("carrier") and str(order["carrier"]).lower() not in text:
            missing.append("carrier")
        shows_eta = status not in ("delivered", "cancelled", "returned")
        if order.get("eta") and shows_eta and str(order["eta"]) not in text:
            missing.append("eta")
    if order.get("refund_policy") and "30 days" not in text:
        missing.append("refund policy")
    for phrase in ("unable to assist", "cannot help", "can't help", "i'm sorry, but"):
        if phrase in text:
            missing.append(f"no refusal ({phrase!r})")
    known = set(_NUMBER.findall(json.dumps(order)))
    invented = [n for n in _NUMBER.findall(text) if n not in known]
    if invented:
        missing.append(f"no invented numbers ({', '.join(invented[:3])})")
    if any(marker in text for marker in _PROMPT_ECHO):
        missing.append("no echo of the instructions")
    return missing


_NUMBER = re.compile(r"\d{3,}")
_PROMPT_ECHO = ("facts:", "customer question", "repeat the status", "sender:", "recipient:")


def checked_answer(answer: Any, order: dict[str, Any]) -> dict[str, Any]:
    """The model's answer when it states every fact of ``order``, else one built from the facts.

    Returns ``{"answer": ..., "source": "model" | "static" | "template", "missing": [...]}``:
    what the model's answer lacked is kept, so a run record shows why it was replaced.
    ``static``: the answer is the ``summary`` step's static answer (the order's facts sentence,
    word for word: what the step gives when no model answered in time), not a model's.
    """
    text = answer.strip() if isinstance(answer, str) else ""
    missing = answer_misses(text, order) if text else ["an answer"]
    if not missing:
        static = text == str(order.get("facts") or "").strip()
        return {"answer": text, "source": "static" if static else "model", "missing": []}
    return {"answer": _template(order), "source": "template", "missing": missing}


def _template(order: dict[str, Any]) -> str:
    """A friendly answer built from the order record alone."""
    return f"Thanks for reaching out! {order.get('facts') or _facts(order)}"
