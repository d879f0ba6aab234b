"""The worker service's configuration (what ``chainrt-worker serve`` flags set)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

__all__ = ["WorkerConfig"]


class WorkerConfig(BaseModel):
    """How one worker serves its engine over HTTP."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    served_model_names: list[str] = Field(default_factory=list)
    """Model names the worker answers to (``/v1/models``); empty: the engine's ``model_name``."""
    watermark: float = Field(default=0.85, gt=0.0, le=1.0)
    """Share of the engine's KV memory admitted requests may fill."""
    slots: int = Field(default=1, ge=1, le=4096)
    """Requests inside the engine at once; the rest wait in the priority queue."""
    max_waiting: int = Field(default=256, ge=0)
    """Requests that may wait for a slot; beyond, 429 at once."""
    max_body_bytes: int = Field(default=1 << 20, ge=1024)
    """Largest request body read; a larger one gets 413 without being read."""
    max_tokens_limit: int = Field(default=1 << 20, ge=1)
    """Largest ``max_tokens`` accepted at all (400 beyond); admission judges what fits."""
    default_max_tokens: int = Field(default=1024, ge=1)
    """``max_tokens`` of a chat request that names none (capped by what fits in the context)."""
    enable_fault_injection: bool = False
    """Serve ``POST /admin/faults`` (tests and drills only; 404 otherwise)."""
    admin_token: SecretStr | None = None
    """Bearer token of ``POST /admin/reload``; None: the admin routes do not exist (404)."""
    health_interval_s: float = Field(default=15.0, gt=0)
    """Seconds between two readiness generations."""
    probe_timeout_s: float = Field(default=30.0, gt=0)
    """A readiness generation slower than this counts as failed."""
    recovery_wait_s: float = Field(default=2.0, ge=0)
    """How long a request waits for an ongoing recovery before it gets 503."""

    @model_validator(mode="after")
    def _check(self) -> WorkerConfig:
        if any(not name for name in self.served_model_names):
            raise ValueError("served model names must not be empty strings")
        if self.admin_token is not None and len(self.admin_token.get_secret_value()) < 16:
            raise ValueError("the admin token must be at least 16 characters")
        return self
