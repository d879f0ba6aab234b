"""The ``runnable`` step kind: a LangChain Runnable, run by the LangChain integration.

The executor itself lives in the LangChain integration (:func:`chainrt.langchain.run_runnable_step`:
it needs ``langchain-core``, a heavy import), which stands above the core: this one asks the
integration seam (:mod:`chainrt._integrations`) for the ``runnable_step`` role on first use,
before the budget clock of the first run that needs it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._integrations import provider
from ..spec import ChainSpec, StepSpec
from ..spec._flow_check import all_steps
from ._step import StepOutcome

__all__ = ["RunnableExecutor"]

_MISSING = "runnable steps need the LangChain integration: pip install -e '.[langchain]' in the chainrt repository"


def _langchain_executor() -> Callable[..., Any] | None:
    return provider("runnable_step")


class RunnableExecutor:
    """Runs ``runnable`` steps; ``executor`` replaces the LangChain one (tests, embedding)."""

    def __init__(
        self, allowed_modules: tuple[str, ...] = (), executor: Callable[..., Any] | None = None
    ) -> None:
        self.allowed_modules = allowed_modules
        self.executor = executor

    def prepare(self, spec: ChainSpec) -> None:
        """Import the LangChain executor when ``spec`` has runnable steps (a one-time cost)."""
        if self.executor is None and any(step.runnable is not None for step in all_steps(spec)):
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
