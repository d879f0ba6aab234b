"""What travels between the runner's dispatcher and a worker over HTTP (public, light).

Both sides import this module — the dispatcher to send a request and read a refusal, the worker to
read the request and shape its refusals — so the two cannot drift apart. It imports only the
standard library.

Request headers (besides the OpenAI body)::

    X-Chainrt-Deadline: 1767225600123     the attempt's end, unix milliseconds (integer)
    X-Priority: critical|high|normal|low  admission order at the worker (default normal)
    traceparent, tracestate               W3C trace context of the dispatcher's span
    X-Request-Id: RUN_ID:STEP_ID          for the worker's logs

Priorities rank ``critical`` (0) before ``high`` (1), ``normal`` (2) and ``low`` (3); an engine's
``GenerationRequest.priority`` is the rank.

Error answers have OpenAI's shape, ``{"error": {"type", "message", "param", "code"}}``, and an
``advice`` object on a memory refusal (:func:`insufficient_memory_body`). The types a chainrt worker sends, by status::

    400  invalid_request_error            the request is malformed (param names the field)
    404  not_found                        no such route or model
    413  request_too_large                the body is over the worker's limit
    413  context_length_exceeded          prompt + max_tokens can never fit (advice.max_tokens)
    429  insufficient_memory              not enough free memory now: advice.max_tokens fits now,
                                          or retry after advice.retry_after_s (and Retry-After)
    429  queue_full                       too many requests waiting (Retry-After)
    500  internal_error, engine_error, injected_error
    503  engine_oom, engine_unavailable, not_ready     the worker recovers in process (Retry-After)
    504  deadline                         the deadline passed while the request was queued

The dispatcher keys its circuit breakers on the status alone (:func:`breaker_class`), so a plain
vLLM or any OpenAI-compatible server is judged the same way; ``insufficient_memory`` becomes
:class:`chainrt.errors.InsufficientMemory`, carrying the advice.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final, Literal, cast

__all__ = [
    "CONTEXT_LENGTH_EXCEEDED",
    "DEADLINE",
    "DEADLINE_HEADER",
    "DEFAULT_PRIORITY",
    "ENGINE_ERROR",
    "ENGINE_OOM",
    "ENGINE_UNAVAILABLE",
    "INJECTED_ERROR",
    "INSUFFICIENT_MEMORY",
    "INTERNAL_ERROR",
    "INVALID_REQUEST",
    "NOT_FOUND",
    "NOT_READY",
    "PRIORITIES",
    "PRIORITY_HEADER",
    "QUEUE_FULL",
    "REQUEST_ID_HEADER",
    "REQUEST_TOO_LARGE",
    "TRACEPARENT_HEADER",
    "TRACESTATE_HEADER",
    "Priority",
    "WireError",
    "breaker_class",
    "decode_deadline",
    "encode_deadline",
    "error_body",
    "insufficient_memory_body",
    "parse_error_body",
    "parse_priority",
    "request_headers",
]

# ---------------------------------------------------------------------------------- headers

DEADLINE_HEADER: Final = "X-Chainrt-Deadline"
"""The attempt's end as unix milliseconds; a chainrt worker stops generating then."""
PRIORITY_HEADER: Final = "X-Priority"
"""``critical``, ``high``, ``normal`` or ``low`` (case-insensitive; default ``normal``)."""
TRACEPARENT_HEADER: Final = "traceparent"
"""W3C trace context: the worker's server span becomes a child of the dispatcher's span."""
TRACESTATE_HEADER: Final = "tracestate"
"""W3C vendor trace state, passed along with ``traceparent``."""
REQUEST_ID_HEADER: Final = "X-Request-Id"
"""``run_id:step_id`` of the step the request serves (for logs)."""

# ------------------------------------------------------------------------------- priorities

Priority = Literal["critical", "high", "normal", "low"]
"""The admission priority of a request (``X-Priority``; ``llm.priority`` of a step)."""

PRIORITIES: Mapping[str, int] = MappingProxyType({"critical": 0, "high": 1, "normal": 2, "low": 3})
"""Priority names and their rank: lower is served first (``GenerationRequest.priority``)."""

DEFAULT_PRIORITY: Final[Priority] = "normal"
"""The priority of a request without ``X-Priority``."""

# --------------------------------------------------------------------------- error types

INVALID_REQUEST: Final = "invalid_request_error"
NOT_FOUND: Final = "not_found"
REQUEST_TOO_LARGE: Final = "request_too_large"
CONTEXT_LENGTH_EXCEEDED: Final = "context_length_exceeded"
INSUFFICIENT_MEMORY: Final = "insufficient_memory"
QUEUE_FULL: Final = "queue_full"
INTERNAL_ERROR: Final = "internal_error"
ENGINE_ERROR: Final = "engine_error"
INJECTED_ERROR: Final = "injected_error"
ENGINE_OOM: Final = "engine_oom"
ENGINE_UNAVAILABLE: Final = "engine_unavailable"
NOT_READY: Final = "not_ready"
DEADLINE: Final = "deadline"

_DETAIL_CHARS = 200
_SECONDS_NOT_MS = 1e11
"""A deadline below this many ms (1973) was almost surely sent in seconds by mistake."""


def encode_deadline(deadline_s: float) -> str:
    """``X-Chainrt-Deadline`` for a deadline in unix seconds (whole ms, rounded down)."""
    return str(math.floor(deadline_s * 1000))


def decode_deadline(value: str) -> float:
    """``X-Chainrt-Deadline`` as unix seconds; ValueError (a one-line reason) when malformed."""
    try:
        millis = float(value)
    except ValueError:
        millis = math.nan
    if not math.isfinite(millis) or millis <= 0:
        raise ValueError(
            f"{DEADLINE_HEADER} must be a unix time in milliseconds, got {value[:40]!r}"
        )
    if millis < _SECONDS_NOT_MS:
        raise ValueError(
            f"{DEADLINE_HEADER}={value[:40]} looks like seconds; send unix milliseconds "
            f"(now is about {int(time.time() * 1000)})"
        )
    return millis / 1000.0


def parse_priority(value: str | None) -> Priority:
    """``X-Priority`` as a priority name (None: the default); ValueError when unknown."""
    if value is None:
        return DEFAULT_PRIORITY
    name = value.strip().lower()
    if name not in PRIORITIES:
        raise ValueError(
            f"{PRIORITY_HEADER} must be one of {', '.join(PRIORITIES)}; got {value[:40]!r}"
        )
    return cast(Priority, name)


def request_headers(
    *,
    deadline_s: float,
    priority: Priority,
    traceparent: str | None = None,
    request_id: str | None = None,
) -> dict[str, str]:
    """The chainrt headers of one generation request (JSON content type included)."""
    headers = {
        "Content-Type": "application/json",
        DEADLINE_HEADER: encode_deadline(deadline_s),
        PRIORITY_HEADER: priority,
    }
    if traceparent:
        headers[TRACEPARENT_HEADER] = traceparent
    if request_id:
        headers[REQUEST_ID_HEADER] = request_id
    return headers


# ------------------------------------------------------------------------------ error bodies


def error_body(
    kind: str, message: str, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error shape: ``{"error": {"type", "message", "param", "code"}}``."""
    return {"error": {"type": kind, "message": message, "param": param, "code": code}}


def insufficient_memory_body(
    message: str, *, max_tokens: int, retry_after_s: float
) -> dict[str, Any]:
    """The 429 memory refusal (docs/workers.md): ``max_tokens`` fits now, or retry after a while."""
    return {
        "error": {
            "type": INSUFFICIENT_MEMORY,
            "message": message,
            "advice": {"max_tokens": max_tokens, "retry_after_s": retry_after_s},
        }
    }


@dataclass(frozen=True, slots=True)
class WireError:
    """What an error answer said, read defensively (any server may send anything)."""

    kind: str | None
    """The error ``type`` (None when the body has none)."""
    message: str
    """The message, on one line and at most 200 characters."""
    advice_max_tokens: int | None = None
    """A positive ``advice.max_tokens`` (what would be admitted), else None."""
    advice_retry_after_s: float | None = None
    """A finite, non-negative ``advice.retry_after_s``, else None."""


def parse_error_body(body: bytes) -> WireError:
    """Read an OpenAI-style (or vLLM-style, or not JSON at all) error body; never raises."""
    try:
        data = json.loads(body)
    except ValueError:
        return WireError(None, _one_line(body[:_DETAIL_CHARS].decode("utf-8", "replace")))
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict):
        error = data if isinstance(data, dict) else {}
    kind = error.get("type")
    message = error.get("message")
    advice = error.get("advice")
    advice = advice if isinstance(advice, dict) else {}
    tokens = advice.get("max_tokens")
    wait = advice.get("retry_after_s")
    return WireError(
        kind if isinstance(kind, str) else None,
        _one_line(str(message))[:_DETAIL_CHARS] if message is not None else "",
        tokens if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0 else None,
        float(wait)
        if isinstance(wait, int | float)
        and not isinstance(wait, bool)
        and math.isfinite(wait)
        and wait >= 0
        else None,
    )


def breaker_class(status: int) -> str:
    """The error class a non-200 status counts as for the dispatcher's breakers and retries.

    ``overloaded`` (429), ``oom`` (503), ``timeout`` (408, 504: the deadline passed on the
    server's side), ``bad_request`` (other 4xx: retrying cannot help), ``5xx`` (the rest).
    """
    if status == 429:
        return "overloaded"
    if status == 503:
        return "oom"
    if status in (408, 504):
        return "timeout"
    if 400 <= status < 500:
        return "bad_request"
    return "5xx"


def _one_line(text: str) -> str:
    return " ".join(text.split())
