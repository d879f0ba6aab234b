"""The ``runnable`` step kind: any LangChain Runnable runs as a chain step under its deadline.

    - id: answer
      runnable: lcel_example.py:answer_chain     # a Runnable, or a zero-argument factory of one
      input: {question: "{{ input.question }}"}  # rendered, then passed to ainvoke()

The runnable is awaited with ``ainvoke`` and cancelled at the step's deadline (status
``timed_out``, so the runner ends the run ``partial``); the step's ``retry`` applies as for tools.
Its output is checkpointed as JSON: LangChain objects (messages, documents, prompt values) through
``langchain_core.load.dumpd`` — LangChain's own JSON form, never pickle — pydantic models through
``model_dump(mode="json")``, plain JSON values as they are.
"""

from __future__ import annotations

import asyncio
import math
import time
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langchain_core.load import dumpd
from langchain_core.load.serializable import Serializable
from langchain_core.runnables import Runnable
from langchain_core.runnables.config import ensure_config, merge_configs
from pydantic import BaseModel

from .._errors import ToolError
from .._run import StepOutcome, run_tool
from ..spec import render_value, resolve_callable, resolve_object

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..spec import StepSpec

__all__ = ["STEP_DEADLINE", "resolve_runnable", "run_runnable_step", "to_json_output"]

STEP_DEADLINE: ContextVar[float | None] = ContextVar("chainrt_step_deadline", default=None)
"""The deadline (unix seconds) of the ``runnable`` step being run, seen by code inside it:
``ChatChainrt`` ends its calls by then, so the dispatcher plans retries and fallbacks within the
step's allotment instead of its own ``timeout``."""

_DEADLINE_SLACK_S = 0.005
"""An error this close to the deadline counts as the deadline (the runner's rule for LLM steps)."""

CHAINRT_CONFIG_KEYS = ("run_id", "budget")
"""``configurable`` keys that address a chainrt run; they must not leak into a step's runnable
(a nested chain would otherwise resume the outer run's id)."""


def resolve_runnable(
    ref: str, *, chain_dir: Path, allowed_modules: Sequence[str]
) -> Runnable[Any, Any]:
    """The Runnable ``ref`` names: a Runnable object, or a zero-argument factory returning one.

    The path rules are those of tools (:func:`chainrt.spec.resolve_callable`): a file inside the
    chain's directory or an allow-listed module; a factory must be defined where ``ref`` points.
    """
    obj = resolve_object(ref, chain_dir=chain_dir, allowed_modules=allowed_modules)
    if isinstance(obj, Runnable):
        return obj
    if not callable(obj):
        raise ToolError(
            f"runnable {ref!r} is {type(obj).__name__}: expected a LangChain Runnable or a "
            "zero-argument function returning one"
        )
    factory = resolve_callable(ref, chain_dir=chain_dir, allowed_modules=allowed_modules)
    try:
        made = factory()
    except Exception as exc:  # user code: reported as the step's error, not a crash
        raise ToolError(f"runnable factory {ref!r} raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(made, Runnable):
        raise ToolError(
            f"runnable factory {ref!r} returned {type(made).__name__}, not a LangChain Runnable"
        )
    return made


def to_json_output(value: Any, *, where: str) -> Any:
    """``value`` as JSON data: LangChain objects via ``dumpd``, pydantic models dumped.

    Raises :class:`ToolError` naming ``where`` and the offending type for anything else.
    """
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ToolError(f"{where} returned {value!r}, which JSON cannot hold")
        return value
    if isinstance(value, Serializable):
        return dumpd(value)
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ToolError(
                    f"{where} returned a dict with a {type(key).__name__} key {key!r}; "
                    "JSON object keys are strings"
                )
            out[key] = to_json_output(item, where=where)
        return out
    if isinstance(value, list | tuple):
        return [to_json_output(item, where=where) for item in value]
    raise ToolError(
        f"{where} returned a {type(value).__name__}, which is not JSON-serialisable; return JSON "
        "values, LangChain objects (messages, documents) or pydantic models"
    )


async def _invoke(
    runnable: Runnable[Any, Any], value: Any, config: Any, where: str, deadline: float
) -> Any:
    """One attempt (module level, so the tool machinery sees one function, not one per call)."""
    try:
        output = await runnable.ainvoke(value, config)
    except Exception as exc:
        left = deadline - time.time()
        if left > _DEADLINE_SLACK_S:
            raise
        # A runnable that watches the deadline itself (ChatChainrt does) fails just before it
        # rather than being cancelled: that is the step running out of time, as for LLM steps.
        # Waiting out the last few ms lets the deadline land, so the step is timed out.
        await asyncio.sleep(max(left, 0.0) + 0.001)
        raise TimeoutError(f"{where} ran out of time: {exc}") from exc
    return to_json_output(output, where=where)


def _step_config(step: StepSpec, run_id: str) -> Any:
    """The config a step's runnable gets: its parent's callbacks (when the run was started from a
    Runnable), tagged with the run and step, minus the keys that address the outer run."""
    parent = ensure_config()
    configurable = {
        k: v for k, v in (parent.get("configurable") or {}).items() if k not in CHAINRT_CONFIG_KEYS
    }
    parent["configurable"] = configurable
    return merge_configs(
        parent,
        {
            "tags": [f"chainrt_step:{step.id}"],
            "metadata": {"chainrt_run_id": run_id, "chainrt_step_id": step.id},
        },
    )


async def run_runnable_step(
    step: StepSpec,
    scope: dict[str, Any],
    *,
    run_id: str,
    deadline: float,
    source_dir: Path | None,
    allowed_modules: Sequence[str],
) -> StepOutcome:
    """Run a ``runnable`` step: resolve, render its ``input``, ``ainvoke`` within ``deadline``."""
    assert step.runnable is not None
    runnable = resolve_runnable(
        step.runnable, chain_dir=source_dir or Path.cwd(), allowed_modules=allowed_modules
    )
    value = render_value(step.input, scope)
    token = STEP_DEADLINE.set(deadline)
    try:
        return await run_tool(
            _invoke,
            {
                "runnable": runnable,
                "value": value,
                "config": _step_config(step, run_id),
                "where": f"runnable of step {step.id!r}",
                "deadline": deadline,
            },
            run_id=run_id,
            step_id=step.id,
            deadline=deadline,
            attempts=step.retry.attempts,
            backoff_ms=step.retry.backoff,
            max_backoff_ms=step.retry.max_backoff,
            attempt_timeout_ms=step.attempt_timeout,
        )
    finally:
        STEP_DEADLINE.reset(token)
