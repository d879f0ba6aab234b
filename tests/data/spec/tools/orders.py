"""Tools of the test chain ``support_agent.yaml`` (plain functions, loaded by file path)."""

from __future__ import annotations

from typing import Any

LOADS: list[str] = []
"""Appended to each time this file is executed, so tests can see it ran only once."""

LOADS.append("loaded")


def lookup_order(order_id: str, user: str) -> dict[str, Any]:
    """Pretend to look an order up."""
    return {"order_id": order_id, "user": user, "status": "shipped"}


def remember(session: str, answer: str) -> None:
    """Pretend to store the answer in a session memory."""


NOT_CALLABLE = 42
"""A module attribute that is not a function."""
