"""The bodies of the ``chainrt serve`` HTTP API (DESIGN §12), as pydantic models.

They are the OpenAPI document's schemas too; every request model forbids unknown fields, so a
typo is a 422 naming the field rather than a silently ignored option.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .._durations import parse_duration_ms
from .._errors import ChainRTError

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
        ms = parse_duration_ms(value, what=what)
    except ChainRTError as exc:
        raise ValueError(exc.message) from None
    if ms <= 0:
        raise ValueError(f"{what} must be greater than zero")
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

    @field_validator("budget")
    @classmethod
    def _budget(cls, value: str | float | None) -> str | float | None:
        checked = _duration(value, "budget")
        return None if checked is None else value


class ResumeRequest(BaseModel):
    """``POST /v1/runs/{id}/resume``: continue a run from its last checkpoint."""

    model_config = ConfigDict(extra="forbid")

    budget: str | float | None = Field(
        default=None, description="Give the run this much more time (default: what it had left)."
    )

    @field_validator("budget")
    @classmethod
    def _budget(cls, value: str | float | None) -> str | float | None:
        checked = _duration(value, "budget")
        return None if checked is None else value


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
