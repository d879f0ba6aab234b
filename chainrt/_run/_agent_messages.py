"""The start of an agent's conversation: its system message (with the tools offered) and its
prompt, rendered against the run's scope."""

from __future__ import annotations

from typing import Any

from ..spec import render_value
from ..spec._agent import AgentSpec

__all__ = ["first_messages"]


def first_messages(agent: AgentSpec, scope: dict[str, Any], offer: str) -> list[tuple[str, str]]:
    """The conversation's start: the system message (with ``offer``, the tools offered) and
    the prompt (or the step's ``messages``)."""
    if agent.messages is not None:
        pairs = [(m.role, str(render_value(m.content, scope))) for m in agent.messages]
    else:
        pairs = []
        if agent.system is not None:
            pairs.append(("system", str(render_value(agent.system, scope))))
        pairs.append(("user", str(render_value(agent.prompt, scope))))
    if pairs and pairs[0][0] == "system":
        return [("system", f"{pairs[0][1]}\n\n{offer}"), *pairs[1:]]
    return [("system", offer), *pairs]
