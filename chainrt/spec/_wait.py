"""The ``wait`` step kind: the run parks until a named signal comes (docs/chain-format.md, Waits).

```yaml
  - id: approve
    wait:
      signal: manager_ok                 # the name a sender uses (chainrt signal RUN manager_ok)
      schema: {approved: bool, note: str}   # the payload's fields (or json_schema: a JSON Schema)
      timeout: 10m                       # from when the run reaches the wait (default: none)
      on_timeout: fail                   # fail | continue (output null)
```

The payload's schema lives here, in the spec stored with every run, so a signal can be checked
the moment it is sent, whether or not the run has reached its wait yet.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal

from pydantic import (
    ConfigDict,
    Field,
    WithJsonSchema,
    field_serializer,
    field_validator,
    model_validator,
)

from .._durations import parse_duration_ms
from .._errors import BudgetError
from .._jsonschema import check_schema, schema_violation
from .._strict import Strict

if TYPE_CHECKING:
    from ._models import ChainSpec, StepSpec

__all__ = [
    "MAX_WAIT_MS",
    "SIGNAL_NAME",
    "WaitSpec",
    "payload_problem",
    "wait_placement_problems",
    "waits_for",
]

SIGNAL_NAME: Final = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
"""What a signal may be called (it is written into store keys and URLs)."""

_FIELD_TYPES: Final[dict[str, dict[str, Any]]] = {
    "str": {"type": "string"},
    "int": {"type": "integer"},
    "float": {"type": "number"},
    "bool": {"type": "boolean"},
    "list": {"type": "array"},
    "dict": {"type": "object"},
    "any": {},
}
MAX_WAIT_MS: Final = 366 * 86_400_000.0
"""The longest ``timeout`` a wait may have."""

_TIMEOUT_SCHEMA: Final[dict[str, Any]] = {
    "anyOf": [
        {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?\s*(ms|s|m|h)$"},
        {"type": "number", "exclusiveMinimum": 0, "description": "seconds"},
        {"type": "null"},
    ]
}
_FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class WaitSpec(Strict):
    """A wait: the run stops (status ``waiting``, holding nothing) until signal ``signal`` comes;
    the step's output is the signal's payload."""

    signal: str = Field(description="Name of the signal that ends the wait, [A-Za-z0-9_.-].")
    payload: dict[str, str] | None = Field(
        default=None,
        alias="schema",
        description="The payload's fields: name -> str|int|float|bool|list|dict|any (all "
        "required; a name ending in '?' is optional). Other fields are refused.",
    )
    json_schema: dict[str, Any] | None = Field(
        default=None, description="A JSON Schema the payload must match (instead of `schema`)."
    )
    timeout: Annotated[float | None, WithJsonSchema(_TIMEOUT_SCHEMA)] = Field(
        default=None,
        description="How long the run may wait, from when it reaches the wait: '10m', '2h', "
        "or seconds (default: no limit; at most 366 days).",
    )
    on_timeout: Literal["fail", "continue"] = Field(
        default="fail",
        description="When the timeout passes with no signal: 'fail' the run, or 'continue' "
        "with the step's output null.",
    )

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("signal")
    @classmethod
    def _check_signal(cls, value: str) -> str:
        if not SIGNAL_NAME.match(value):
            raise ValueError(
                f"signal name must match [A-Za-z0-9_][A-Za-z0-9_.-]* (at most 64), got {value!r}"
            )
        return value

    @field_validator("payload")
    @classmethod
    def _check_fields(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is None:
            return None
        for name, type_name in value.items():
            if not _FIELD.match(name.removesuffix("?")):
                raise ValueError(f"schema field name must be an identifier, got {name!r}")
            if type_name not in _FIELD_TYPES:
                allowed = "|".join(_FIELD_TYPES)
                raise ValueError(
                    f"schema field {name!r} has unknown type {type_name!r} ({allowed})"
                )
        return value

    @field_validator("json_schema")
    @classmethod
    def _check_json_schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            check_schema(value)
        return value

    @field_validator("timeout", mode="before")
    @classmethod
    def _check_timeout(cls, value: object) -> float | None:
        if value is None:
            return None
        try:
            ms = parse_duration_ms(value, what="timeout")
        except BudgetError as exc:
            raise ValueError(exc.message) from None
        if not 0 < ms <= MAX_WAIT_MS:
            raise ValueError(f"timeout must be more than zero and at most 366 days, got {value!r}")
        return ms

    @field_serializer("timeout", when_used="json")
    def _timeout_text(self, value: float | None) -> str | None:
        # Written back as milliseconds so that the stored spec reads back unchanged on resume.
        return None if value is None else f"{value!r}ms".replace(".0ms", "ms")

    @model_validator(mode="after")
    def _one_schema(self) -> WaitSpec:
        if self.payload is not None and self.json_schema is not None:
            raise ValueError("give either `schema` or `json_schema`, not both")
        return self

    def payload_schema(self) -> dict[str, Any] | None:
        """The JSON Schema a payload must match (None: any JSON value)."""
        if self.json_schema is not None:
            return self.json_schema
        if self.payload is None:
            return None
        properties = {name.removesuffix("?"): _FIELD_TYPES[t] for name, t in self.payload.items()}
        required = [name for name in self.payload if not name.endswith("?")]
        return {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
        }


def payload_problem(wait: WaitSpec, payload: Any) -> str | None:
    """Why ``payload`` does not fit ``wait``'s schema (one line), or None when it does."""
    schema = wait.payload_schema()
    if schema is None:
        return None
    return schema_violation(payload, schema)


def waits_for(spec: ChainSpec, signal: str) -> list[StepSpec]:
    """The wait steps of ``spec`` (at any depth) that end on ``signal``."""
    from ._flow import walk_steps

    return [
        step
        for step, _ in walk_steps(spec.steps)
        if step.wait is not None and step.wait.signal == signal
    ]


def wait_placement_problems(steps: list[StepSpec]) -> list[tuple[tuple[Any, ...], str]]:
    """Waits the runner cannot park at: inside a ``parallel`` branch or a ``map`` body (the
    other branches or items would have to stop with it), and agents' tools with an approval
    there. With where each sits."""
    return [(loc, message) for loc, message in _placements(steps, ("steps",), None)]


def _placements(
    steps: list[StepSpec], base: tuple[Any, ...], inside: str | None
) -> Iterator[tuple[tuple[Any, ...], str]]:
    for index, step in enumerate(steps):
        loc = (*base, index)
        if step.wait is not None and inside is not None:
            yield (
                (*loc, "wait"),
                f"a wait cannot be inside a {inside} (the run parks as a whole); "
                "put it before or after the group",
            )
        if step.agent is not None and inside is not None:
            for j, tool in enumerate(step.agent.tools):
                if (
                    tool.approval is not None
                ):  # its calls park the run (chainrt/agent/_approvals.py)
                    yield (
                        (*loc, "agent", "tools", j, "approval"),
                        f"a tool with an approval cannot be used by an agent inside a {inside} "
                        "(the run parks as a whole); put the agent before or after the group",
                    )
        for name, branch in (step.cases or {}).items():
            yield from _placements(branch, (*loc, "cases", name), inside)
        if step.default is not None:
            yield from _placements(step.default, (*loc, "default"), inside)
        for name, branch in (step.parallel or {}).items():
            yield from _placements(branch, (*loc, "parallel", name), "parallel branch")
        if step.steps is not None:
            yield from _placements(step.steps, (*loc, "steps"), "map")
