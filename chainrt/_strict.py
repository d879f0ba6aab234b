"""The one base of chainrt's user-written configuration models (chain YAML, pool YAML)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["Strict"]


class Strict(BaseModel):
    """A frozen pydantic model whose unknown keys are errors (a typo never passes silently)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
