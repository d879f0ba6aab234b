"""JSON in and out of the stores: size limit on the way in, schema check on the way out.

Both stores keep a run in parts so that a step commit never rewrites the (possibly large) spec
and input: the record as created (``record``), the progress of the latest commit (``progress``),
and plain fields for what scripts and SQL compare or change (status, fencing token, owner lease,
timestamps). :func:`assemble_run` puts the parts back together into one :class:`RunRecord`.
Nothing here is pickled or evaluated: records are pydantic models validated from JSON.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

from .._errors import (
    CheckpointError,
    CorruptRecord,
    FencedOut,
    LeaseReleased,
    RecordTooLarge,
    RunNotFound,
)
from .._records import RECORD_SCHEMA, OwnerLease, RunProgress, RunRecord, StepRecord

__all__ = [
    "FINAL_STATUSES",
    "as_dict",
    "assemble_run",
    "check_owner",
    "decode_progress",
    "decode_run",
    "decode_step",
    "encode",
    "encode_trace",
    "fenced",
    "finished",
    "no_lease",
    "not_found",
]

FINAL_STATUSES: frozenset[str] = frozenset(
    {"completed", "partial", "rejected", "failed", "cancelled"}
)
"""Run statuses after which the run's records expire (all but ``queued``/``running``/``waiting``)."""

_M = TypeVar("_M", bound=BaseModel)

_ADAPTERS: dict[type[BaseModel], TypeAdapter[Any]] = {
    model: TypeAdapter(model) for model in (RunRecord, StepRecord, RunProgress)
}
_SERIALIZERS = {model: model.__pydantic_serializer__ for model in _ADAPTERS}
_STATUSES = FINAL_STATUSES | {"queued", "running", "waiting"}
_TRACE: TypeAdapter[dict[str, Any]] = TypeAdapter(dict[str, Any])


def encode(record: RunRecord | StepRecord | RunProgress, *, limit: int, what: str) -> bytes:
    """Serialise ``record`` to UTF-8 JSON; RecordTooLarge (nothing written) if over ``limit``.

    ``what`` names the record in the error, e.g. ``"step 'summary' of run 'r1'"``.
    """
    spec = record.spec_json() if isinstance(record, RunRecord) else None
    if spec is not None and isinstance(record, RunRecord):
        data = _run_with_spec(record, spec)
    else:
        # The model's own serializer, called directly: TypeAdapter.dump_json's keyword handling
        # costs about as much as serialising a step record (issue 18).
        data = _SERIALIZERS[type(record)].to_json(record, by_alias=True)
    if len(data) > limit:
        raise RecordTooLarge(
            f"{what} is {_size(len(data))} as JSON, over the store's limit of {_size(limit)} "
            "(max_record_bytes); nothing was written. Make the output smaller (e.g. store a "
            "reference instead of the payload) or raise the limit."
        )
    return data


_BEFORE_SPEC = {"schema_version", "run_id", "chain"}
_NOT_AFTER_SPEC = {*_BEFORE_SPEC, "spec"}


def _run_with_spec(record: RunRecord, spec: bytes) -> bytes:
    """``record`` as JSON with its already serialised ``spec`` put in place: the same bytes as
    serialising the whole record (fields in declaration order; tests/test_store_codec.py)."""
    adapter = _ADAPTERS[RunRecord]
    head = adapter.dump_json(record, by_alias=True, include=_BEFORE_SPEC)
    tail = adapter.dump_json(record, by_alias=True, exclude=_NOT_AFTER_SPEC)
    return b"".join((head[:-1], b',"spec":', spec, b",", tail[1:]))


def encode_trace(trace: dict[str, Any]) -> bytes:
    """Serialise a run's trace ids (kept apart: a commit may replace them, see RunProgress)."""
    data: bytes = _TRACE.dump_json(trace)
    return data


def decode_run(raw: bytes | str, *, run_id: str, where: str) -> RunRecord:
    """Parse a stored run record; CorruptRecord naming the run and ``where`` it was read from."""
    return _decode(RunRecord, raw, what=f"run {run_id!r}", where=where)


def decode_step(raw: bytes | str, *, run_id: str, step_id: str, where: str) -> StepRecord:
    """Parse a stored step record; CorruptRecord naming run, step and ``where``."""
    return _decode(StepRecord, raw, what=f"step {step_id!r} of run {run_id!r}", where=where)


def decode_progress(raw: bytes | str, *, run_id: str, where: str) -> RunProgress:
    """Parse the stored progress of a run; CorruptRecord naming the run and ``where``."""
    return _decode(RunProgress, raw, what=f"progress of run {run_id!r}", where=where)


def assemble_run(
    base: RunRecord,
    *,
    status: str,
    token: int,
    progress: RunProgress | None,
    owner_host: str | None,
    owner_pid: int | None,
    owner_expires_at: float | None,
    updated_at: float,
    budget_total_ms: float | None = None,
    trace: bytes | str | None = None,
    where: str = "",
) -> RunRecord:
    """The current run: ``base`` (as created) overlaid with the fields that change later.

    ``budget_total_ms`` and ``trace`` (JSON) are None while no commit has replaced them.
    """
    if status not in _STATUSES:
        raise CorruptRecord(
            f"the stored run {base.run_id!r} at {where} has an unknown status {status!r}; "
            "nothing was loaded from it. Inspect or delete that key/row."
        )
    owner = None
    if owner_host is not None and owner_pid is not None and owner_expires_at is not None:
        owner = OwnerLease(host=owner_host, pid=owner_pid, token=token, expires_at=owner_expires_at)
    update: dict[str, Any] = {
        "status": status,
        "fencing_token": token,
        "owner": owner,
        "updated_at": updated_at,
    }
    if progress is not None:
        update.update(
            budget_used_ms=progress.budget_used_ms,
            output=progress.output,
            error=progress.error,
            stopped_at=progress.stopped_at,
            waits_ms=progress.waits_ms,
        )
    if budget_total_ms is not None:
        update["budget_total_ms"] = budget_total_ms
    if trace is not None:
        try:
            update["trace"] = _TRACE.validate_json(trace)
        except ValidationError:
            raise CorruptRecord(
                f"the stored trace ids of run {base.run_id!r} at {where} are not a JSON object; "
                "nothing was loaded from the run. Inspect or delete that key/row."
            ) from None
    return base.model_copy(update=update)


def check_owner(run: RunRecord) -> None:
    """A new run's owner lease must carry the run's fencing token (CheckpointError if not)."""
    if run.owner is not None and run.owner.token != run.fencing_token:
        raise CheckpointError(
            f"run {run.run_id!r}: owner.token ({run.owner.token}) must equal fencing_token "
            f"({run.fencing_token})"
        )


# The errors both stores raise, worded once.


def not_found(run_id: str, url: str) -> RunNotFound:
    """No such run in the store at ``url``."""
    return RunNotFound(
        f"no run {run_id!r} in {url} (never created, or expired after finishing); "
        "`chainrt runs` lists the runs it holds"
    )


def fenced(run_id: str, token: int, current: int, *, action: str) -> FencedOut:
    """The caller's fencing ``token`` is stale: another process took the run over."""
    return FencedOut(
        f"cannot {action} run {run_id!r} with fencing token {token}: its token is now "
        f"{current}, so another process owns it; this process must stop working on it"
    )


def finished(run_id: str, status: str) -> CheckpointError:
    """A completed run cannot be claimed."""
    return CheckpointError(
        f"run {run_id!r} has {status}; a completed run cannot be claimed or resumed (its "
        "result is final)"
    )


def no_lease(run_id: str) -> LeaseReleased:
    """The run's owner lease was released (the run finished): nothing to renew."""
    return LeaseReleased(
        f"run {run_id!r} has no owner lease any more (released when it finished); there is "
        "nothing to renew"
    )


def _decode(model: type[_M], raw: bytes | str, *, what: str, where: str) -> _M:
    try:
        record = model.model_validate_json(raw)
    except ValidationError as exc:
        newer = _newer_schema(raw)
        if newer is not None:
            raise CorruptRecord(_newer_message(what, where, newer)) from None
        problem = _first_problem(exc)
        raise CorruptRecord(
            f"the stored {what} at {where} is not a valid record ({problem}); nothing was "
            "loaded from it. Inspect or delete that key/row; the run cannot be resumed as is."
        ) from None
    version = getattr(record, "schema_version", RECORD_SCHEMA)
    if version > RECORD_SCHEMA:
        raise CorruptRecord(_newer_message(what, where, version))
    return record


def _newer_schema(raw: bytes | str) -> int | None:
    """The record's ``schema`` if it is a version newer than this chainrt reads, else None."""
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    version = data.get("schema") if isinstance(data, dict) else None
    if isinstance(version, int) and not isinstance(version, bool) and version > RECORD_SCHEMA:
        return version
    return None


def _newer_message(what: str, where: str, version: int) -> str:
    return (
        f"the stored {what} at {where} has record schema {version}, but this chainrt reads "
        f"schema {RECORD_SCHEMA} at most; it was written by a newer chainrt. Upgrade chainrt "
        "to read it."
    )


def _first_problem(exc: ValidationError) -> str:
    error = exc.errors(include_url=False)[0]
    loc = ".".join(str(part) for part in error["loc"]) or "<record>"
    count = exc.error_count()
    more = f" and {count - 1} more problem(s)" if count > 1 else ""
    return f"{loc}: {error['msg']}{more}"


def _size(n: int) -> str:
    if n >= 1024 * 1024:
        return f"{n / (1024 * 1024):.1f} MiB"
    if n >= 1024:
        return f"{n / 1024:.1f} KiB"
    return f"{n} bytes"


def as_dict(reply: Any) -> dict[bytes, bytes]:
    """A hash as read (``HGETALL``): a dict from the client; read raw on the pipe, a flat list
    of fields and values (RESP2) or a map (RESP3)."""
    if isinstance(reply, dict):
        return reply
    if isinstance(reply, list) and len(reply) % 2 == 0:
        return dict(zip(reply[::2], reply[1::2], strict=True))
    raise CheckpointError(f"a hash read from Redis came back as {type(reply).__name__}")
