"""How an agent runs one checked tool call: its tool's ``concurrency`` keys held while it runs
(their templates see ``args``), a LangChain tool through ``ainvoke``; always one attempt, bound by
the time the loop's work must end."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .._errors import ChainRTError, ConcurrencyRejected
from ..agent._tools import AgentTool
from ..concurrency import Limiter
from ._step import StepOutcome, acquire_keys
from ._tool import run_tool

__all__ = ["run_agent_tool"]


async def run_agent_tool(
    limiter: Limiter,
    tool: AgentTool,
    kwargs: dict[str, Any],
    scope: dict[str, Any],
    run_id: str,
    cpath: str,
    deadline: float,
) -> StepOutcome:
    """Run ``tool`` with its checked ``kwargs`` as call ``cpath`` of run ``run_id``, by
    ``deadline`` (unix seconds); a key not had in time: ``failed`` (not run)."""
    fn: Callable[..., Any] = tool.fn
    if tool.langchain:
        fn, kwargs = _langchain_call(tool), {"arguments": kwargs}
    if not tool.keys:
        return await run_tool(fn, kwargs, run_id, cpath, deadline, 1, 0.0, 0.0, None)
    key_scope = {**scope, "args": kwargs if not tool.langchain else kwargs["arguments"]}
    try:
        holding = await acquire_keys(
            limiter,
            tool.keys,
            key_scope,
            within_ms=(deadline - time.time()) * 1000,
            holder=f"{run_id}:{cpath}",
        )
    except ConcurrencyRejected as exc:
        return StepOutcome("failed", error=f"not run: {exc.message}")
    except ChainRTError as exc:
        return StepOutcome("failed", error=f"not run: concurrency: {exc.message}")
    try:
        return await run_tool(fn, kwargs, run_id, cpath, deadline, 1, 0.0, 0.0, None)
    finally:
        await holding.release_unconfirmed()


def _langchain_call(tool: AgentTool) -> Callable[..., Any]:
    """A LangChain tool's ``ainvoke`` as a function of one keyword argument."""

    async def call(arguments: dict[str, Any]) -> Any:
        value = await tool.fn(arguments)
        content = getattr(value, "content", value)  # a ToolMessage: its content
        return content

    return call
