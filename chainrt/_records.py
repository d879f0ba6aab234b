"""The JSON records a checkpoint store keeps. Versioned; never pickled."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr

from ._redact import redact_text

__all__ = [
    "RECORD_SCHEMA",
    "AttemptRecord",
    "OwnerLease",
    "RunProgress",
    "RunRecord",
    "RunStatus",
    "StepRecord",
    "StepStatus",
    "TokenUsage",
]

RECORD_SCHEMA = 1
"""Version of the record layout; a store refuses records of a newer version it cannot read."""

RunStatus = Literal[
    "queued", "running", "completed", "partial", "rejected", "failed", "cancelled", "waiting"
]
"""``queued`` until a runner takes it from the queue (``chainrt serve``); ``running`` while a
runner owns it (or crashed while owning it); ``waiting`` while it is parked at a ``wait`` step
(no owner, no keys held, until its signal comes); the rest are final."""

StepStatus = Literal[
    "completed",
    "skipped",
    "partial",
    "failed",
    "timed_out",
    "rejected",
    "running",
    "cancelled",
    "waiting",
]
"""``completed`` and ``skipped`` (optional step, budget short) are never run again on resume.
``running``: an attempt of a tool that takes ``ctx`` was written before its call and has not
ended (still in flight, or in flight when its process stopped): ``ctx.attempt`` counts on from
it. ``cancelled``: an inner step of a parallel branch that was still running when the group's
``join`` was met (``any``, a quorum); a resume of the group runs it again. ``waiting``: a ``wait``
step whose signal had not come when the run reached it (the run parked there); a resume runs it
again."""

FINAL_STEP_STATUSES: frozenset[str] = frozenset({"completed", "skipped"})


def _redacted(value: str | None) -> str | None:
    return None if value is None else redact_text(value)


Redacted = Annotated[str | None, AfterValidator(_redacted)]
"""Text that may quote a URL (an endpoint, an error): credentials are masked before it is kept,
and again when an older record is read, so neither a store nor ``inspect`` shows them."""


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OwnerLease(_Record):
    """Who runs a run right now: host and pid, until ``expires_at`` (unix seconds)."""

    host: str
    pid: int
    token: int = Field(ge=0, description="Fencing token; grows by one at every takeover.")
    expires_at: float


class TokenUsage(_Record):
    """Tokens one attempt (or a step, or a run: the sum) used, as the server reported them."""

    prompt_tokens: int = Field(default=0, ge=0)
    completion_tokens: int = Field(default=0, ge=0)
    cached_tokens: int | None = Field(
        default=None, ge=0, description="Prompt tokens served from a cache (where reported)."
    )
    total_tokens: int = Field(default=0, ge=0)
    cost: float | None = Field(
        default=None, ge=0, description="In the unit of the pool's `price` (None: no price)."
    )

    @classmethod
    def of(cls, items: list[TokenUsage | None]) -> TokenUsage | None:
        """The sum of ``items`` (None when none of them is known)."""
        known = [u for u in items if u is not None]
        if not known:
            return None
        cached = [u.cached_tokens for u in known if u.cached_tokens is not None]
        costs = [u.cost for u in known if u.cost is not None]
        return cls.model_construct(
            prompt_tokens=sum(u.prompt_tokens for u in known),
            completion_tokens=sum(u.completion_tokens for u in known),
            cached_tokens=sum(cached) if cached else None,
            total_tokens=sum(u.total_tokens for u in known),
            cost=round(sum(costs), 9) if costs else None,
        )


class AttemptRecord(_Record):
    """One try of a step: which model/endpoint, how it ended, and why the step moved on."""

    attempt: int
    model: str | None = None
    endpoint: Redacted = None
    status: str
    elapsed_ms: float
    detail: Redacted = None
    confidence: float | None = None
    """The answer's confidence score in [0, 1], when the model reported one."""
    hops_ms: dict[str, float] | None = None
    """Where an answered attempt's time went, in ms: ``queue``, ``admission``, ``prefill``,
    ``decode`` (reported by the worker) and ``network`` (the rest of the attempt)."""
    usage: TokenUsage | None = None
    """Tokens the attempt used, as its server reported them (None: not reported, e.g. a failed
    or cancelled attempt, whose server sent no usage)."""
    hedge: int | None = None
    """In a hedged pair (``llm.hedge``), the number of the pair's other attempt: the one that
    answered is ``ok``, the other ``cancelled`` (its connection closed) or its own failure."""


class StepRecord(_Record):
    """What one step did. Written once, atomically with the run's progress."""

    schema_version: int = Field(default=RECORD_SCHEMA, alias="schema")
    step_id: str
    status: StepStatus
    output: Any = None
    attempts: int = 0
    model: str | None = None
    fallback: str | None = None
    allotted_ms: float = 0.0
    elapsed_ms: float = 0.0
    started_at: float = 0.0
    finished_at: float = 0.0
    error: Redacted = None
    attempt_log: list[AttemptRecord] = Field(default_factory=list)
    waits_ms: dict[str, float] = Field(
        default_factory=dict, description="Concurrency key -> ms waited for it."
    )
    confidence_score: float | None = Field(
        default=None, description="The answer's confidence in [0, 1] (llm steps)."
    )
    verification_status: Literal["match", "mismatch", "unverified"] | None = Field(
        default=None, description="Outcome of the step's `verify:` check (llm steps with one)."
    )
    degraded: dict[str, Any] | None = Field(
        default=None,
        description="The `degrade:` action that answered: {by: cache, age_s}, {by: model}, ...",
    )
    contradictions: list[str] | None = Field(
        default=None,
        description="What the answer states that its prompt does not support or denies (llm "
        "steps; chainrt/_run/_contradiction.py).",
    )

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class RunProgress(_Record):
    """The run fields a runner updates with each step write (and at the end)."""

    status: RunStatus
    budget_used_ms: float
    output: Any = None
    error: Redacted = None
    stopped_at: str | None = None
    release_owner: bool = Field(
        default=False, description="Drop the owner lease (set with a final status)."
    )
    waits_ms: dict[str, float] = Field(
        default_factory=dict, description="Chain-scoped concurrency key -> ms waited."
    )
    budget_total_ms: float | None = Field(
        default=None, description="New total budget (set when a resume was given a new budget)."
    )
    trace: dict[str, Any] | None = Field(
        default=None, description="New trace ids of the run (set when a resumed run starts)."
    )


class RunRecord(_Record):
    """Everything a run needs to be resumed anywhere: the spec itself travels with it."""

    schema_version: int = Field(default=RECORD_SCHEMA, alias="schema")
    run_id: str
    chain: str
    spec: dict[str, Any] = Field(description="The normalised chain spec (ChainSpec JSON).")
    source: str | None = Field(
        default=None, description="Directory of the chain file, to resolve its tools on resume."
    )
    input: dict[str, Any]
    mac: str | None = Field(
        default=None,
        description="HMAC of run id, chain, spec, source and input (CHAINRT_RECORD_KEY), or None.",
    )
    status: RunStatus = "running"
    budget_total_ms: float
    budget_used_ms: float = 0.0
    output: Any = None
    error: Redacted = None
    stopped_at: str | None = None
    owner: OwnerLease | None = None
    fencing_token: int = 0
    trace: dict[str, Any] = Field(
        default_factory=dict, description="Trace ids of this run and of the runs it resumed."
    )
    waits_ms: dict[str, float] = Field(default_factory=dict)
    created_at: float = Field(default_factory=time.time)
    updated_at: float = Field(default_factory=time.time)

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    _spec_json: tuple[dict[str, Any], bytes] | None = PrivateAttr(default=None)

    def attach_spec_json(self, data: bytes) -> None:
        """Say that ``data`` is this record's ``spec`` as JSON (what serialising it gives), so
        that a store writing the record does not serialise the spec again (a chain's spec is
        most of its record; one spec serves every run of it: :func:`chainrt.spec._dump.spec_json`).
        It holds for this ``spec`` object only: a copy given another spec serialises that one."""
        self._spec_json = (self.spec, data)

    def spec_json(self) -> bytes | None:
        """The JSON given by :meth:`attach_spec_json` for the ``spec`` this record holds, else None."""
        known = self._spec_json
        return known[1] if known is not None and known[0] is self.spec else None

    @property
    def finished(self) -> bool:
        """True once the run has a final status."""
        return self.status not in ("queued", "running", "waiting")
