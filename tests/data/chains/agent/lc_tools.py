"""A LangChain tool for the agent tests (a BaseTool object, named like any tool)."""

from __future__ import annotations

from langchain_core.tools import tool


@tool
def word_count(text: str) -> int:
    """Count the words of a text."""
    return len(text.split())
