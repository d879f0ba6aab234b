"""Credentials in URLs never reach a record, ``inspect`` or an error (issue 12 findings 5, 7).

A pool endpoint ``http://bob:hunter2@host`` is a real worker that wants Basic auth: the password
must still be sent to it, and must not be kept in step records or printed.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

import chainrt
from chainrt._records import AttemptRecord, StepRecord
from chainrt._redact import redact_text
from chainrt.cli import main
from chainrt.errors import CheckpointError
from chainrt.store import open_store

SECRET = "hunter2"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("http://bob:hunter2@h:8001", "http://bob:***@h:8001"),
        ("failed at https://bob:hunter2@h/v1 (503)", "failed at https://bob:***@h/v1 (503)"),
        ("http://token@h", "http://***@h"),
        ("http://bob:hu@n/ter2@h:1/x", "http://bob:***@h:1/x"),  # unencoded '@' and '/'
        (
            '{"u": "http://a:hunter2@h", "v": "http://c:hunter2@i"}',
            '{"u": "http://a:***@h", "v": "http://c:***@i"}',
        ),
        ("mail bob@example.com about http://h:1", "mail bob@example.com about http://h:1"),
        ("no url here", "no url here"),
    ],
)
def test_redact_text(text: str, shown: str) -> None:
    assert redact_text(text) == shown


def test_records_mask_credentials_when_built_and_when_read() -> None:
    attempt = AttemptRecord(
        attempt=1, endpoint="http://bob:hunter2@h:1", status="connect", elapsed_ms=1.0,
        detail="cannot connect to http://bob:hunter2@h:1",
    )  # fmt: skip
    assert SECRET not in attempt.model_dump_json()
    stored = (
        '{"step_id": "s", "status": "failed", "error": "http://bob:hunter2@h said no",'
        '"attempt_log": [{"attempt": 1, "endpoint": "http://bob:hunter2@h", "status": "x",'
        '"elapsed_ms": 1}]}'
    )  # as an older chainrt wrote it
    assert SECRET not in StepRecord.model_validate_json(stored).model_dump_json()


class _Worker(BaseHTTPRequestHandler):
    """Answers every request 503 and notes the Authorization header it got."""

    seen: ClassVar[list[str | None]] = []

    def do_POST(self) -> None:
        self.seen.append(self.headers.get("Authorization"))
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({"error": {"message": "busy", "type": "overloaded"}}).encode()
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST

    def log_message(self, format: str, *args: object) -> None:
        return None


@pytest.fixture
def worker() -> Iterator[tuple[str, list[str | None]]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Worker)
    seen: list[str | None] = []
    _Worker.seen = seen
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://bob:{SECRET}@127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_pool_credentials_are_sent_but_never_recorded_or_printed(
    worker: tuple[str, list[str | None]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, seen = worker
    pool = tmp_path / "pool.yaml"
    pool.write_text(
        "models:\n  primary:\n    served_model: m\n"
        f'    endpoints:\n      - {{url: "{url}", capacity: 1}}\n'
    )
    chain = tmp_path / "c.yaml"
    chain.write_text(
        "name: p\nbudget: 5s\nsteps:\n  - id: ask\n    llm: {model: primary, prompt: hi}\n"
        "    fallbacks: []\n    static_answer: sorry\n"
    )
    store = f"sqlite:///{tmp_path / 's.db'}"
    result = asyncio.run(chainrt.load(chain).arun({}, run_id="r1", store=store, pool=str(pool)))
    assert result.output == "sorry"  # the worker said 503: the static answer stood in
    assert "Basic Ym9iOmh1bnRlcjI=" in seen  # bob:hunter2 still went to the worker
    with sqlite3.connect(tmp_path / "s.db") as conn:
        rows = [r[0] for r in conn.execute("SELECT record FROM steps")]
    assert rows
    assert all(SECRET not in row for row in rows)
    assert any("bob:***@127.0.0.1" in row for row in rows)  # the endpoint is still named
    capsys.readouterr()
    for args in (
        ["inspect", "r1", "--store", store],
        ["inspect", "r1", "--store", store, "--json"],
    ):
        assert main(args) == 0
        out, err = capsys.readouterr()
        assert "bob:***@127.0.0.1" in out
        assert SECRET not in out + err


@pytest.mark.parametrize(
    "url",
    [
        "redis://:s3c/ret@localhost:6379/0",
        "redis://:s3c?ret@localhost:6379/0",
        "redis://:s3c#ret@localhost:6379/0",
        "redis://user:s3c:ret@localhost:99999/0",
        "rediss://:s3cret@[::1/0",
        "redis://:s3c[ret@localhost:6379/0",
    ],
)
def test_a_malformed_redis_url_shows_no_part_of_its_password(url: str) -> None:
    with pytest.raises(CheckpointError) as info:
        open_store(url)
    message = str(info.value)
    assert "invalid Redis store URL" in message
    assert "percent-encode" in message
    for part in ("s3c", "ret"):
        assert part not in message.replace("redis", "").replace("localhost", ""), message
