"""The bodies of the ``chainrt serve`` HTTP API (docs/serve.md), as pydantic models.

They are the OpenAPI document's schemas too; every request model forbids unknown fields, so a
typo is a 422 naming the field rather than a silently ignored option.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .._durations import DEFAULT_MAX_BUDGET_MS, MIN_BUDGET_MS, parse_budget_ms
from .._errors import ChainRTError
from .._input_checks import MAX_INPUT_DEPTH, find_problem
from ._guard import DEFAULT_MAX_BODY

__all__ = [
    "ChainInfo",
    "ErrorBody",
    "ResumeRequest",
    "RunAccepted",
    "RunSummary",
    "ServeConfig",
    "SubmitRequest",
]

RUN_ID_PATTERN = r"^[A-Za-z0-9_.:-]{1,128}$"


def _duration(value: str | float | int | None, what: str) -> str | float | int | None:
    if value is None:
        return None
    try:
        parse_budget_ms(value, what=what)  # the upper bound is the server's: see _app
    except ChainRTError as exc:
        raise ValueError(exc.message) from None
    return value


class SubmitRequest(BaseModel):
    """``POST /v1/runs``: start a run of a chain (it is queued; a runner starts it)."""

    model_config = ConfigDict(extra="forbid")

    chain: str = Field(description="The chain's name (see GET /v1/chains).", min_length=1)
    input: dict[str, Any] = Field(description="The run's input, as the chain declares it.")
    run_id: str | None = Field(
        default=None,
        pattern=RUN_ID_PATTERN,
        description="Make the submit idempotent: the same run_id and body again returns that run.",
    )
    budget: str | float | None = Field(
        default=None, description='Override the chain\'s budget: "8s", "1500ms" or seconds.'
    )
    priority: Literal["critical", "high", "normal", "low"] = Field(
        default="normal", description="Queue class: critical runs start before high, ..."
    )

    @field_validator("budget", mode="before")
    @classmethod
    def _budget(cls, value: Any) -> Any:
        return _duration(value, "budget")

    @field_validator("run_id")
    @classmethod
    def _run_id(cls, value: str | None) -> str | None:
        # A path segment of /ui/runs/{id} and /v1/runs/{id}: "." and ".." would leave it.
        if value in (".", ".."):
            raise ValueError(f"run_id cannot be {value!r}")
        return value

    @field_validator("input")
    @classmethod
    def _input(cls, value: dict[str, Any]) -> dict[str, Any]:
        # What the command line refuses in --input: it could be recorded but not read back.
        problem = find_problem(value, max_depth=MAX_INPUT_DEPTH)
        if problem is not None:
            raise ValueError(problem.message)
        return value


class ResumeRequest(BaseModel):
    """``POST /v1/runs/{id}/resume``: continue a run from its last checkpoint."""

    model_config = ConfigDict(extra="forbid")

    budget: str | float | None = Field(
        default=None, description="Give the run this much more time (default: what it had left)."
    )

    @field_validator("budget", mode="before")
    @classmethod
    def _budget(cls, value: Any) -> Any:
        return _duration(value, "budget")


class RunAccepted(BaseModel):
    """The answer to a submit, cancel or resume: the run and where it stands."""

    run_id: str
    status: str


class RunSummary(BaseModel):
    """One run in a list."""

    run_id: str
    chain: str
    status: str
    budget: dict[str, float]
    created_at: float
    updated_at: float
    reason: str | None = Field(
        default=None,
        description="Why the run is not served or did not end well: for a queued run that no "
        "live runner serves, that; else the run's error (a run refused or dead-lettered is "
        "failed with its reason).",
    )


class ChainInfo(BaseModel):
    """A chain this runner serves: its name, description and declared inputs."""

    name: str
    description: str | None = None
    inputs: dict[str, str]


class ErrorBody(BaseModel):
    """Every error answer: ``{"error": {"type", "message", "field"?}}``."""

    error: dict[str, Any]


class ServeConfig(BaseModel):
    """Options of one ``chainrt serve`` process."""

    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    chains: str = Field(default="chains", description="Directory of the chains served.")
    store: str | None = Field(default=None, description="Store URL (default CHAINRT_STORE).")
    pool: str | None = Field(default=None, description="Pool file (default CHAINRT_POOL).")
    max_runs: int = Field(default=16, ge=1, description="Runs this runner executes at once.")
    drain_s: float = Field(default=10.0, ge=0, description="SIGTERM: time runs get to stop.")
    orphan_idle_s: float = Field(
        default=3.0,
        gt=0,
        description="An entry untouched this long is looked at by other runners (orphans).",
    )
    touch_every_s: float = Field(
        default=1.0, gt=0, description="How often a runner touches the entries it works on."
    )
    max_deliveries: int = Field(
        default=3,
        ge=1,
        description="Deliveries of an entry whose handling fails for good before it is "
        "dead-lettered (and its run marked failed).",
    )
    max_streams: int | None = Field(
        default=None,
        ge=1,
        description="Event streams open at once (more: 429); default half of `ulimit -n`.",
    )
    access_log: bool = Field(default=False, description="Log one line per HTTP request.")
    log_level: str = Field(default="info", description="Log level of the server's own lines.")
    tokens: str | None = Field(
        default=None,
        description="Token file (name:scope[,scope]:sha256 a line); else CHAINRT_API_TOKENS.",
    )
    insecure_no_auth: bool = Field(
        default=False, description="Listen on a non-loopback address without tokens."
    )
    allowed_hosts: list[str] = Field(
        default_factory=list, description="Host names accepted besides the loopback names."
    )
    max_body: int = Field(
        default=DEFAULT_MAX_BODY, ge=1024, description="Largest request body accepted (bytes)."
    )
    max_budget_ms: float = Field(
        default=DEFAULT_MAX_BUDGET_MS, ge=MIN_BUDGET_MS, description="Largest budget of a run."
    )
    header_timeout_s: float = Field(
        default=10.0, gt=0, description="Time a client gets to send a request's headers."
    )
    idle_timeout_s: float = Field(
        default=5.0, gt=0, description="A kept-alive connection idle this long is closed."
    )
    body_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="Time a client gets to send a request's body once its headers are in (408).",
    )
    max_connections: int | None = Field(
        default=None,
        ge=1,
        description="Connections open at once (more wait to be accepted); default `ulimit -n` "
        "less a reserve of 192 descriptors (a quarter of it at most).",
    )
