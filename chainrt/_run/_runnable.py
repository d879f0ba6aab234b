"""The ``runnable`` step kind: a LangChain Runnable, run by the LangChain integration.

The executor itself lives in :mod:`chainrt.langchain._steps` (it needs ``langchain-core``, a heavy
import); this one imports it on first use, before the budget clock of the first run that needs it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..spec import ChainSpec, StepSpec
from ._step import StepOutcome

__all__ = ["RunnableExecutor"]

_MISSING = "runnable steps need the LangChain integration: pip install 'chainrt[langchain]'"


def _langchain_executor() -> Callable[..., Any] | None:
    try:
        from ..langchain._steps import run_runnable_step
    except ImportError:
        return None
    return run_runnable_step


class RunnableExecutor:
    """Runs ``runnable`` steps; ``executor`` replaces the LangChain one (tests, embedding)."""

    def __init__(
        self, allowed_modules: tuple[str, ...] = (), executor: Callable[..., Any] | None = None
    ) -> None:
        self.allowed_modules = allowed_modules
        self.executor = executor

    def prepare(self, spec: ChainSpec) -> None:
        """Import the LangChain executor when ``spec`` has runnable steps (a one-time cost)."""
        if self.executor is None and any(step.runnable is not None for step in spec.steps):
            self.executor = _langchain_executor()

    async def run(
        self,
        step: StepSpec,
        scope: dict[str, Any],
        *,
        run_id: str,
        deadline: float,
        source_dir: Path | None,
    ) -> StepOutcome:
        """Invoke the step's Runnable inside ``deadline``."""
        executor = self.executor or _langchain_executor()
        if executor is None:
            return StepOutcome("failed", error=_MISSING)
        outcome: StepOutcome = await executor(
            step,
            scope,
            run_id=run_id,
            deadline=deadline,
            source_dir=source_dir,
            allowed_modules=self.allowed_modules,
        )
        return outcome
