"""The ``agent`` step's shape: a model that calls tools in a loop until it answers.

A step with ``agent:`` runs model turns with its tools offered; the calls a turn proposes run
(several at once), their results go back to the model, until it answers without a call, its
``max_iterations`` are spent, or the time left reaches ``final_reserve`` (then one last turn
without tools asks for the answer). Every turn and every call is recorded under the step's path
(:func:`turn_path`, :func:`call_path`). The loop itself is :mod:`chainrt._run._agent`; its
budget rules are :mod:`chainrt.agent._budget`.

This module is imported by :mod:`._models` (at its end: the agent's fields use its types).
"""

from __future__ import annotations

import re
from typing import Annotated, Final, Literal

from pydantic import (
    BeforeValidator,
    Field,
    PlainSerializer,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from .._durations import parse_duration_ms
from .._errors import BudgetError
from .._strict import Strict
from ._models import ConcurrencyKeySpec, MessageSpec, _ms_to_str
from ._wait import SIGNAL_NAME

__all__ = [
    "MAX_CALLS_PER_TURN",
    "TOOL_NAME",
    "AgentSpec",
    "AgentToolSpec",
    "call_path",
    "turn_path",
]

TOOL_NAME: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
"""What a tool offered to a model may be called (OpenAI's function name rule)."""

MAX_CALLS_PER_TURN: Final = 16
"""The most tool calls one model turn may propose (``max_calls_per_turn`` is at most this)."""


def turn_path(step_path: str, turn: int) -> str:
    """The record id of model turn ``turn`` (from 0) of the agent at ``step_path``."""
    return f"{step_path}.turn[{turn}]"


def call_path(step_path: str, turn: int, index: int) -> str:
    """The record id of call ``index`` (from 0) proposed by turn ``turn``: ``agent.call[2.1]``."""
    return f"{step_path}.call[{turn}.{index}]"


def _reserve(value: object) -> object:
    if value == "auto":
        return value
    try:
        return parse_duration_ms(value)
    except BudgetError as exc:
        raise ValueError(f"final_reserve must be 'auto' or a duration: {exc.message}") from None


FinalReserve = Annotated[
    Literal["auto"] | float,
    BeforeValidator(_reserve),
    PlainSerializer(
        lambda v: v if v == "auto" else _ms_to_str(v), return_type=str, when_used="json"
    ),
    WithJsonSchema(
        {
            "anyOf": [
                {"const": "auto"},
                {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?\s*(ms|s|m|h)$"},
                {"type": "number", "minimum": 0, "description": "seconds"},
            ],
            "description": "'auto' (the model's p90 answer time x 1.5) or a duration.",
        }
    ),
]
"""``final_reserve``: ``auto`` or milliseconds (written as a duration)."""


def _tool_entry(value: object) -> object:
    """``tools.py:fn`` is short for ``{tool: tools.py:fn}``."""
    return {"tool": value} if isinstance(value, str) else value


class AgentToolSpec(Strict):
    """A tool the agent's model may call: a function (JSON Schema from its type hints, pydantic
    parameters and docstring) or a LangChain ``BaseTool`` object."""

    tool: str = Field(
        min_length=1,
        description="'file.py:function' or 'module:function' (a function, or a LangChain "
        "BaseTool object).",
    )
    name: str | None = Field(
        default=None, description="The name the model sees (default: the function's name)."
    )
    description: str | None = Field(
        default=None, description="What the model is told the tool does (default: its docstring)."
    )
    concurrency: list[ConcurrencyKeySpec] = Field(
        default_factory=list,
        description="Keys held while one call of this tool runs; templates see `args` (the "
        "call's arguments), e.g. 'refund:{{ args.order_id }}'.",
    )
    approval: str | None = Field(
        default=None,
        description="A signal each call of this tool waits for before it runs (the run parks "
        "as `waiting`): payload {approve: bool, reason?: str}; refused calls are not run and "
        "the model is told why.",
    )

    @field_validator("approval")
    @classmethod
    def _check_approval(cls, value: str | None) -> str | None:
        if value is not None and not SIGNAL_NAME.match(value):
            raise ValueError(
                f"approval must be a signal name, [A-Za-z0-9_][A-Za-z0-9_.-]* (at most 64), "
                f"got {value!r}"
            )
        return value

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str | None) -> str | None:
        if value is not None and not TOOL_NAME.match(value):
            raise ValueError(f"tool name must match [A-Za-z_][A-Za-z0-9_-]{{0,63}}, got {value!r}")
        return value


class AgentSpec(Strict):
    """An agent step: a model turn with tools offered, the proposed calls run, the results fed
    back, until the model answers (docs/chain-format.md, Agent steps)."""

    model: str = Field(min_length=1, description="A model of the pool, or 'local'.")
    system: str | None = Field(default=None, description="System message template.")
    prompt: str | None = Field(default=None, description="User message template.")
    messages: list[MessageSpec] | None = Field(
        default=None, description="Full message list (instead of prompt/system)."
    )
    tools: list[Annotated[AgentToolSpec, BeforeValidator(_tool_entry)]] = Field(
        min_length=1, max_length=64, description="The tools offered to the model."
    )
    max_iterations: int = Field(
        default=6, ge=1, le=100, description="Most model turns that may call tools."
    )
    max_calls_per_turn: int = Field(
        default=4,
        ge=1,
        le=MAX_CALLS_PER_TURN,
        description="Most tool calls one turn may propose (they run at once).",
    )
    final_reserve: FinalReserve = Field(
        default="auto",
        description="Time kept for the last answer: when less is left, no more tools are "
        "called. 'auto': the model's measured answer time (p90 x 1.5).",
    )
    constrain: Literal["calls", "shape"] = Field(
        default="calls",
        description="What a turn's answer is decoded into: 'calls' (each call names a tool "
        "and matches its arguments' schema) or 'shape' (any {calls} or {content} JSON: names "
        "and arguments are checked by chainrt, and a bad call goes back to the model).",
    )
    max_tokens: int = Field(default=512, ge=1, le=1_000_000, description="Per model turn.")
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)

    @model_validator(mode="after")
    def _check(self) -> AgentSpec:
        if self.messages is None and self.prompt is None:
            raise ValueError("an agent step needs `prompt` or `messages`")
        if self.messages is not None and (self.prompt is not None or self.system is not None):
            raise ValueError("give either `messages` or `prompt`/`system`, not both")
        seen: set[str] = set()
        for entry in self.tools:
            name = entry.name or entry.tool.rsplit(":", 1)[-1]
            if name in seen:
                raise ValueError(f"two tools are named {name!r} (give one a `name:`)")
            seen.add(name)
        return self

    def final_reserve_ms(self) -> float | None:
        """The fixed final reserve in ms, or None for ``auto``."""
        return None if self.final_reserve == "auto" else float(self.final_reserve)
