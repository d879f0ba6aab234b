"""The wire contract between dispatcher and worker (``chainrt.wire``): pure, table-tested.

The HTTP round trips are tested where both sides run for real: tests/test_worker_errors.py (a
worker's refusals, read back by the dispatcher) and tests/test_dispatch_protocol.py (headers).
"""

from __future__ import annotations

import json
import math
import time

import pytest

from chainrt import wire


@pytest.mark.parametrize("deadline", [1767225600.0, 1767225600.123, 1767225600.9999, None])
def test_a_deadline_survives_the_wire_to_the_millisecond(deadline: float | None) -> None:
    if deadline is None:  # now (a fixed id: parallel test workers collect the same tests)
        deadline = time.time()
    encoded = wire.encode_deadline(deadline)
    assert encoded.isdigit()
    decoded = wire.decode_deadline(encoded)
    assert deadline - 0.001 < decoded <= deadline  # rounded down: never later than asked


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("soon", "must be a unix time in milliseconds"),
        ("", "must be a unix time in milliseconds"),
        ("-5", "must be a unix time in milliseconds"),
        ("0", "must be a unix time in milliseconds"),
        ("nan", "must be a unix time in milliseconds"),
        ("inf", "must be a unix time in milliseconds"),
        ("1767225600", "looks like seconds"),
        ("x" * 500, "'" + "x" * 40 + "'"),  # echoed, but cut short
    ],
)
def test_a_bad_deadline_is_one_clear_line(value: str, fragment: str) -> None:
    with pytest.raises(ValueError, match="X-Chainrt-Deadline") as info:
        wire.decode_deadline(value)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)
    assert len(str(info.value)) < 200


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, "normal"), ("critical", "critical"), (" HIGH ", "high"), ("Low", "low")],
)
def test_priorities(value: str | None, expected: str) -> None:
    assert wire.parse_priority(value) == expected


def test_priority_ranks_order_admission_and_cannot_be_changed() -> None:
    assert sorted(wire.PRIORITIES, key=wire.PRIORITIES.__getitem__) == [
        "critical",
        "high",
        "normal",
        "low",
    ]
    assert wire.PRIORITIES[wire.DEFAULT_PRIORITY] == 2
    with pytest.raises(TypeError):
        wire.PRIORITIES["urgent"] = -1  # type: ignore[index]
    with pytest.raises(ValueError, match="one of critical, high, normal, low; got 'urgent'"):
        wire.parse_priority("urgent")


def test_request_headers() -> None:
    headers = wire.request_headers(
        deadline_s=1767225600.5, priority="high", traceparent="00-abc-def-01", request_id="r:s"
    )
    assert headers == {
        "Content-Type": "application/json",
        "X-Chainrt-Deadline": "1767225600500",
        "X-Priority": "high",
        "traceparent": "00-abc-def-01",
        "X-Request-Id": "r:s",
    }
    bare = wire.request_headers(deadline_s=1767225600.5, priority="normal")
    assert set(bare) == {"Content-Type", "X-Chainrt-Deadline", "X-Priority"}


@pytest.mark.parametrize(
    ("status", "error_class"),
    [
        (429, "overloaded"),
        (503, "oom"),
        (504, "timeout"),
        (408, "timeout"),
        (400, "bad_request"),
        (404, "bad_request"),
        (413, "bad_request"),
        (500, "5xx"),
        (502, "5xx"),
    ],
)
def test_breaker_class_by_status(status: int, error_class: str) -> None:
    assert wire.breaker_class(status) == error_class


def test_the_memory_refusal_reads_back_as_it_was_written() -> None:
    body = json.dumps(wire.insufficient_memory_body("full", max_tokens=7, retry_after_s=0.25))
    assert wire.parse_error_body(body.encode()) == wire.WireError(
        wire.INSUFFICIENT_MEMORY, "full", 7, 0.25
    )
    plain = json.dumps(wire.error_body(wire.QUEUE_FULL, "too many\nwaiting", param="x"))
    assert wire.parse_error_body(plain.encode()) == wire.WireError(
        wire.QUEUE_FULL, "too many waiting"
    )


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"", wire.WireError(None, "")),
        (b"<html>Bad\n  Gateway</html>", wire.WireError(None, "<html>Bad Gateway</html>")),
        (b"[1, 2]", wire.WireError(None, "")),
        (b'{"message": "vllm style", "type": "BadRequestError"}',
         wire.WireError("BadRequestError", "vllm style")),
        (b'{"error": {"type": 5, "message": null}}', wire.WireError(None, "")),
        (b'{"error": {"advice": {"max_tokens": true, "retry_after_s": "soon"}}}',
         wire.WireError(None, "")),
        (b'{"error": {"advice": {"max_tokens": 0, "retry_after_s": -1}}}', wire.WireError(None, "")),
        (b'{"error": {"advice": {"max_tokens": 3.5, "retry_after_s": NaN}}}',
         wire.WireError(None, "")),
        (b'{"error": {"advice": [1]}}', wire.WireError(None, "")),
        (b'{"error": {"message": "' + b"m" * 500 + b'"}}', wire.WireError(None, "m" * 200)),
    ],
)  # fmt: skip
def test_any_error_body_is_read_without_raising(body: bytes, expected: wire.WireError) -> None:
    got = wire.parse_error_body(body)
    assert got == expected
    assert got.advice_retry_after_s is None or math.isfinite(got.advice_retry_after_s)
