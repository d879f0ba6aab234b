"""The chain format (docs/chain-format.md) as pydantic models: the single source of truth for its schema.

Durations are kept as milliseconds (floats) in memory and serialised back as ``"<n>ms"`` so that a
normalised spec (``ChainSpec.model_dump(mode="json")``) loads again unchanged: resume needs no
YAML file.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    SerializerFunctionWrapHandler,
    WithJsonSchema,
    field_validator,
    model_serializer,
    model_validator,
)

from .._durations import MIN_BUDGET_MS, parse_duration_ms
from .._errors import BudgetError
from .._jsonschema import check_schema
from .._strict import Strict as _Strict
from ._degrade import DegradeAction
from ._flow import BRANCH_NAME, DEFAULT_BRANCH, FLOW_KEYS, Join, walk_steps
from ._hedge import HedgeSpec
from ._verify import VerifySpec
from ._wait import WaitSpec

__all__ = [
    "INPUT_TYPES",
    "ChainSpec",
    "ConcurrencyKeySpec",
    "DurationMs",
    "LlmSpec",
    "MessageSpec",
    "RetrySpec",
    "StepSpec",
]


def _to_ms(value: object) -> float:
    try:
        return parse_duration_ms(value)
    except BudgetError as exc:
        # pydantic turns ValueError into a located validation error.
        raise ValueError(exc.message) from None


def _weight(value: object) -> object:
    """Refuse what pydantic would coerce into a misleading number (``true``, ``"NaN"``)."""
    if isinstance(value, bool):
        raise ValueError(f"weight must be a number, got {str(value).lower()}")
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"weight must be a number, got {value[:40]!r}") from None
        value = number
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"weight must be a finite number greater than 0, got {value}")
    return value


def _ms_to_str(value: float) -> str:
    # Plain positional digits of the shortest exact repr: "1234567.8ms", never "1.23457e+06ms"
    # (which would lose precision and not parse again on resume).
    digits = f"{Decimal(repr(float(value))):f}"
    if "." in digits:
        digits = digits.rstrip("0").rstrip(".")
    return f"{digits}ms"


DurationMs = Annotated[
    float,
    BeforeValidator(_to_ms),
    PlainSerializer(_ms_to_str, return_type=str, when_used="json"),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?\s*(ms|s|m|h)$"},
                {"type": "number", "minimum": 0, "description": "seconds"},
            ],
            "description": "A duration: '1500ms', '8s', '2m', '1h', or a number of seconds.",
        }
    ),
]
"""A duration in milliseconds, written in YAML as ``"250ms"``, ``"8s"``, ``"2m"`` or seconds."""

INPUT_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "list": (list,),
    "dict": (dict,),
    "any": (object,),
}
"""The input type names a chain may declare, and the Python types each accepts."""

_NAME = re.compile(r"^[a-z0-9_-]+$")
_STEP_ID = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RATE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*/\s*(ms|s|m|h)\s*", re.ASCII)


class ConcurrencyKeySpec(_Strict):
    """A semantic concurrency key: at most ``limit`` holders of the rendered ``key`` at once."""

    key: str = Field(
        min_length=1, description="Template of the key, e.g. 'user:{{ input.user_id }}'."
    )
    limit: int = Field(default=1, ge=1, le=1_000_000, description="Concurrent holders allowed.")
    rate: str | None = Field(
        default=None,
        description="Optional rate limit on acquisitions, e.g. '5/s' or '100/m' "
        "(GCRA, bursts allowed).",
    )
    burst: int | None = Field(
        default=None, ge=1, description="Acquisitions allowed in a burst under `rate` (default: 1)."
    )

    @field_validator("rate")
    @classmethod
    def _check_rate(cls, value: str | None) -> str | None:
        if value is not None and rate_per_second(value) <= 0:
            raise ValueError(f"rate must be positive, got {value!r}")
        return value


def rate_per_second(rate: str) -> float:
    """Parse ``"5/s"``, ``"100/m"``, ``"0.5/s"`` into acquisitions per second."""
    match = _RATE.fullmatch(rate)
    if match is None:
        raise ValueError(f"rate must look like '5/s' or '100/m', got {rate!r}")
    per = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[match.group(2)]
    return float(match.group(1)) / per


class RetrySpec(_Strict):
    """How often a step is tried, and how long to wait between tries (all inside its allotment)."""

    attempts: int = Field(default=1, ge=1, le=100, description="Total tries, the first included.")
    backoff: DurationMs = Field(
        default=100.0, description="Wait before the 2nd try; doubles after."
    )
    max_backoff: DurationMs = Field(default=5000.0, description="Upper bound of one wait.")


class MessageSpec(_Strict):
    """One chat message of an LLM step; ``content`` is a template."""

    role: Literal["system", "user", "assistant"]
    content: str


class LlmSpec(_Strict):
    """An LLM call dispatched to the worker pool (or the in-process ``local`` model)."""

    model: str = Field(min_length=1, description="A model of the pool, or 'local'.")
    prompt: str | None = Field(default=None, description="User message template.")
    system: str | None = Field(default=None, description="System message template.")
    messages: list[MessageSpec] | None = Field(
        default=None, description="Full message list (instead of prompt/system)."
    )
    max_tokens: int = Field(default=256, ge=1, le=1_000_000)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    json_output: bool = Field(
        default=False, alias="json", description="The output must parse as JSON."
    )
    json_schema: dict[str, Any] | None = Field(
        default=None,
        description="A JSON Schema the output must match (constrained decoding; implies json).",
    )
    stop: list[str] | None = None
    hedge: HedgeSpec | None = Field(
        default=None,
        description="Start a second attempt on another endpoint of the model when the first "
        "is slower than this (e.g. {after: p95}); off when absent.",
    )

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("json_schema")
    @classmethod
    def _valid_schema(cls, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        if schema is not None:
            check_schema(schema)
        return schema

    @model_validator(mode="after")
    def _one_prompt(self) -> LlmSpec:
        if self.messages is None and self.prompt is None:
            raise ValueError("an llm step needs `prompt` or `messages`")
        if self.messages is not None and (self.prompt is not None or self.system is not None):
            raise ValueError("give either `messages` or `prompt`/`system`, not both")
        return self


class StepSpec(_Strict):
    """One step of a chain: exactly one of ``llm``, ``tool`` or ``runnable``."""

    id: str = Field(description="Unique step id: letters, digits, underscores.")
    description: str = ""
    weight: Annotated[float, BeforeValidator(_weight)] = Field(
        default=1.0, gt=0, le=1e6, description="Share of the budget."
    )
    min: DurationMs | None = Field(
        default=None, description="Least time the step needs; below it the step is not started."
    )
    max: DurationMs | None = Field(default=None, description="Most time the step may get.")
    optional: bool = Field(default=False, description="May be skipped when the budget runs short.")
    llm: LlmSpec | None = None
    agent: AgentSpec | None = Field(
        default=None, description="A model calling tools in a loop until it answers."
    )
    tool: str | None = Field(default=None, description="'file.py:function' or 'module:function'.")
    runnable: str | None = Field(default=None, description="'file.py:attr' or 'module:attr'.")
    args: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments of a tool (templates allowed)."
    )
    input: Any = Field(default=None, description="Input of a runnable step (templates allowed).")
    fallbacks: list[str] = Field(
        default_factory=list, description="Models tried in order when the primary cannot answer."
    )
    static_answer: str | None = Field(
        default=None, description="Last-resort answer template when every model failed."
    )
    retry: RetrySpec = Field(default_factory=RetrySpec)
    attempt_timeout: DurationMs | None = Field(
        default=None, description="Cap on one attempt (the step allotment covers all attempts)."
    )
    on_timeout: Literal["fail", "partial"] = Field(
        default="fail", description="'partial': an LLM step cut off keeps the tokens so far."
    )
    on_memory_pressure: Literal["fail", "shrink"] = Field(
        default="fail", description="'shrink': retry with the worker's advised max_tokens."
    )
    concurrency: list[ConcurrencyKeySpec] = Field(default_factory=list)
    verify: VerifySpec | None = Field(
        default=None, description="Check a low-confidence answer against a second model."
    )
    degrade: list[DegradeAction] = Field(
        default_factory=list,
        max_length=8,
        description="Tried in order when the step's models all failed: cache, model, static.",
    )
    when: str | None = Field(
        default=None,
        description="Run the step only when this template is truthy (JSON truthiness); "
        "else it is skipped and its weight goes to the steps after it.",
    )
    switch: str | None = Field(
        default=None, description="A group: the template whose value picks one of `cases`."
    )
    cases: dict[str, list[StepSpec]] | None = Field(
        default=None, description="switch: value -> the steps of that branch."
    )
    default: list[StepSpec] | None = Field(
        default=None, description="switch: the branch taken when no case matches."
    )
    parallel: dict[str, list[StepSpec]] | None = Field(
        default=None, description="A group: branch name -> its steps; the branches run at once."
    )
    join: Join = Field(
        default="all",
        description="parallel: wait for all branches, the first (any), or {quorum: N}.",
    )
    map: str | None = Field(
        default=None,
        description="A group: a template giving a list; `steps` run once per item "
        "({{ item }}, {{ index }}).",
    )
    steps: list[StepSpec] | None = Field(
        default=None, description="map: the steps run for each item."
    )
    max_concurrency: int = Field(
        default=8, ge=1, le=10_000, description="map: items run at once (one wave)."
    )
    wait: WaitSpec | None = Field(
        default=None,
        description="A wait: the run parks until this signal comes (its payload is the step's "
        "output).",
    )

    @model_serializer(mode="wrap")
    def _leave_out_unset_flow(self, handler: SerializerFunctionWrapHandler) -> Any:
        # A straight chain's stored spec (a part of every run record) stays as it was.
        data = handler(self)
        if isinstance(data, dict) and self.agent is None:
            data.pop("agent", None)
        if isinstance(data, dict) and self.switch is None and self.parallel is None:
            if self.map is None:
                for key in FLOW_KEYS:
                    if key != "when" and key in data:
                        del data[key]
            if self.when is None:
                data.pop("when", None)
        if isinstance(data, dict) and self.wait is None:
            data.pop("wait", None)
        return data

    @field_validator("id")
    @classmethod
    def _check_id(cls, value: str) -> str:
        if not _STEP_ID.match(value):
            raise ValueError(f"step id must match [A-Za-z_][A-Za-z0-9_]*, got {value!r}")
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> StepSpec:
        kinds = [k for k in _KINDS if getattr(self, k) is not None]
        if len(kinds) != 1:
            found = ", ".join(kinds) or "none"
            raise ValueError(
                "a step needs exactly one of llm, agent, tool, runnable, switch, parallel, map, wait "
                f"(found: {found})"
            )
        self._check_flow()
        if self.wait is not None and (self.concurrency or self.retry != RetrySpec()):
            raise ValueError("concurrency and retry do not apply to wait steps")
        if self.wait is not None and self.attempt_timeout is not None:
            raise ValueError("a wait step's time limit is `wait.timeout`, not attempt_timeout")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min:g}ms) is larger than max ({self.max:g}ms)")
        if self.llm is None and self.agent is None and self.fallbacks:
            raise ValueError("fallbacks apply to llm and agent steps only")
        if self.llm is None and self.static_answer is not None:
            raise ValueError("static_answer applies to llm steps only")
        if self.llm is None and (self.verify is not None or self.degrade):
            raise ValueError("verify and degrade apply to llm steps only")
        if self.tool is None and self.args:
            raise ValueError("args apply to tool steps only")
        if self.runnable is None and self.input is not None:
            raise ValueError("input applies to runnable steps only")
        return self

    def _check_flow(self) -> None:
        """The fields of one group kind appear with it only, and its branches are well named."""
        if self.switch is None and (self.cases is not None or self.default is not None):
            raise ValueError("cases and default apply to switch steps only")
        if self.switch is not None:
            if not self.cases:
                raise ValueError("a switch needs at least one case under `cases`")
            for name, branch in self.cases.items():
                _check_branch("case", name, branch)
                if name == DEFAULT_BRANCH:
                    raise ValueError("a case may not be called 'default' (use `default:`)")
            if self.default is not None and not self.default:
                raise ValueError("`default` needs at least one step")
        if self.parallel is None and self.join != "all":
            raise ValueError("join applies to parallel steps only")
        if self.parallel is not None:
            if not self.parallel:
                raise ValueError("parallel needs at least one branch")
            for name, branch in self.parallel.items():
                _check_branch("branch", name, branch)
            if not isinstance(self.join, str) and self.join.quorum > len(self.parallel):
                raise ValueError(
                    f"join quorum {self.join.quorum} is more than the {len(self.parallel)} branches"
                )
        if self.map is None and (self.steps is not None or self.max_concurrency != 8):
            raise ValueError("steps and max_concurrency apply to map steps only")
        if self.map is not None and not self.steps:
            raise ValueError("a map needs at least one step under `steps`")
        if self.is_group:
            for name in ("args", "input", "fallbacks", "degrade"):
                if getattr(self, name):
                    raise ValueError(f"{name} applies to llm, tool and runnable steps only")
            if self.attempt_timeout is not None or self.retry != RetrySpec():
                raise ValueError(
                    "retry and attempt_timeout apply to the steps inside a group, not the group"
                )

    @property
    def is_group(self) -> bool:
        """True for a ``switch``, ``parallel`` or ``map`` step."""
        return self.switch is not None or self.parallel is not None or self.map is not None

    @property
    def kind(
        self,
    ) -> Literal["llm", "agent", "tool", "runnable", "switch", "parallel", "map", "wait"]:
        """Which kind of step this is."""
        if self.llm is not None:
            return "llm"
        if self.agent is not None:
            return "agent"
        if self.tool is not None:
            return "tool"
        if self.runnable is not None:
            return "runnable"
        if self.switch is not None:
            return "switch"
        if self.wait is not None:
            return "wait"
        return "parallel" if self.parallel is not None else "map"


_KINDS = ("llm", "agent", "tool", "runnable", "switch", "parallel", "map", "wait")


def _check_branch(what: str, name: str, steps: list[StepSpec]) -> None:
    if not BRANCH_NAME.match(name):
        raise ValueError(f"{what} name must match [A-Za-z0-9_][A-Za-z0-9_-]*, got {name!r}")
    if not steps:
        raise ValueError(f"{what} {name!r} needs at least one step")


class ChainSpec(_Strict):
    """A whole chain: its budget, inputs, concurrency keys, steps and output."""

    name: str = Field(description="Chain name, [a-z0-9_-]+.")
    description: str = ""
    budget: DurationMs = Field(description="Total wall-clock budget of one run.")
    max_tokens_total: int | None = Field(
        default=None,
        ge=1,
        le=10**12,
        description="Most tokens (prompt + completion, every attempt) one run may use; an LLM "
        "call that may not fit is not made, and its step counts as timed out.",
    )
    inputs: dict[str, str] = Field(
        default_factory=dict, description="Input field -> type (str|int|float|bool|list|dict|any)."
    )
    concurrency: list[ConcurrencyKeySpec] = Field(default_factory=list)
    steps: list[StepSpec] = Field(min_length=1)
    output: Any = Field(
        default=None, description="Template of the run's output (default: last step's output)."
    )

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"name must match [a-z0-9_-]+, got {value!r}")
        return value

    @field_validator("budget")
    @classmethod
    def _check_budget(cls, value: float) -> float:
        if value < MIN_BUDGET_MS:
            shown = "zero" if value == 0 else f"{value:g}ms"
            raise ValueError(f"budget must be at least {MIN_BUDGET_MS:g}ms, got {shown}")
        return value

    @field_validator("inputs")
    @classmethod
    def _check_inputs(cls, value: dict[str, str]) -> dict[str, str]:
        for name, type_name in value.items():
            if not _STEP_ID.match(name):
                raise ValueError(f"input name must be an identifier, got {name!r}")
            if type_name not in INPUT_TYPES:
                allowed = "|".join(INPUT_TYPES)
                raise ValueError(f"input {name!r} has unknown type {type_name!r} (use {allowed})")
        return value

    @model_validator(mode="after")
    def _unique_ids(self) -> ChainSpec:
        seen: set[str] = set()
        for step, _ in walk_steps(self.steps):
            if step.id in seen:
                raise ValueError(f"duplicate step id {step.id!r}")
            seen.add(step.id)
        return self

    def step(self, step_id: str) -> StepSpec:
        """Return the step with this id (KeyError if none)."""
        for step in self.steps:
            if step.id == step_id:
                return step
        raise KeyError(step_id)


# The agent step's models use this module's types (durations, messages, keys): imported last.
from ._agent import AgentSpec  # noqa: E402

StepSpec.model_rebuild()
ChainSpec.model_rebuild()
