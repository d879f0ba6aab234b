"""API tokens and the request checks of ``chainrt serve``, as pure functions (table tests):
token lines, hashing, scopes per route, and :func:`check_request`'s decisions."""

from __future__ import annotations

import hashlib
import re

import pytest

from chainrt._api_tokens import (
    ANONYMOUS,
    Principal,
    TokenTable,
    hash_token,
    load_tokens,
    new_token,
    parse_scopes,
    required_scope,
)
from chainrt.errors import InputError
from chainrt.serve._guard import AccessPolicy, Refusal, check_request, host_name, is_loopback

READER = "r" * 20
WRITER = "w" * 20
TABLE = TokenTable.parse(
    f"# comment\n\nalice:read:{hash_token(READER)}\nbob:read,submit,operate:{hash_token(WRITER)}\n",
    "tokens.txt",
)


def test_hash_is_the_sha256_hex_of_the_token() -> None:
    assert hash_token("abc") == hashlib.sha256(b"abc").hexdigest()


def test_find_returns_the_principal_of_the_matching_line_only() -> None:
    assert TABLE.find(READER) == Principal("alice", frozenset({"read"}))
    assert TABLE.find(WRITER) == Principal("bob", frozenset({"read", "submit", "operate"}))
    assert TABLE.find(READER[:-1]) is None  # a prefix is not the token
    assert TABLE.find("") is None
    assert TABLE.find(hash_token(READER)) is None  # the stored hash is not a token


def test_new_token_line_is_accepted_by_a_table() -> None:
    token, line = new_token("ci-bot", ["submit", "read"])
    assert line.startswith("ci-bot:read,submit:")  # scopes in the documented order
    table = TokenTable.parse(line, "env")
    assert table.find(token) == Principal("ci-bot", frozenset({"read", "submit"}))
    other, _ = new_token("ci-bot", ["read"])
    assert other != token


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("alice:read", "expected name:scope[,scope]:sha256-of-token"),
        ("alice:read:abc", "sha256"),
        (f"alice:write:{'a' * 64}", "unknown scope 'write'"),
        (f"al ice:read:{'a' * 64}", "token name"),
        (f"a:read:{'a' * 64}\na:admin:{'b' * 64}", "used twice"),
        (f"alice:read:{'A' * 64}", "sha256"),  # hex digests are lowercase
    ],
)
def test_bad_token_lines_name_the_line(text: str, message: str) -> None:
    with pytest.raises(InputError, match=re.escape(message)) as caught:
        TokenTable.parse(text, "tokens.txt")
    assert caught.value.message.startswith("tokens.txt:")


def test_load_tokens_prefers_the_file_and_refuses_an_empty_one(tmp_path: object) -> None:
    from pathlib import Path

    folder = Path(str(tmp_path))
    line = f"alice:read:{hash_token(READER)}"
    env = f"bob:admin:{hash_token(WRITER)}"
    (folder / "t.txt").write_text(line + "\n")
    from_file = load_tokens(str(folder / "t.txt"), env)
    assert from_file is not None
    assert from_file.find(READER) is not None
    assert from_file.find(WRITER) is None
    from_env = load_tokens(None, env)
    assert from_env is not None
    assert from_env.find(WRITER) is not None
    assert load_tokens(None, None) is None
    assert load_tokens(None, "  ") is None
    (folder / "empty.txt").write_text("# nothing\n")
    with pytest.raises(InputError, match="holds no token lines"):
        load_tokens(str(folder / "empty.txt"), None)
    with pytest.raises(InputError, match="cannot read it"):
        load_tokens(str(folder / "missing.txt"), None)


def test_parse_scopes() -> None:
    assert parse_scopes("read, submit") == frozenset({"read", "submit"})
    with pytest.raises(InputError, match="unknown scope ''"):
        parse_scopes("read,")


@pytest.mark.parametrize(
    ("method", "path", "scope"),
    [
        ("GET", "/v1/runs", "read"),
        ("GET", "/v1/runs/r1/events", "read"),
        ("HEAD", "/v1/chains", "read"),
        ("GET", "/metrics", "read"),
        ("GET", "/openapi.json", "read"),
        ("POST", "/v1/runs", "submit"),
        ("POST", "/v1/runs/r1/cancel", "operate"),
        ("POST", "/v1/runs/r1/resume", "operate"),
        ("POST", "/v1/runs/r1/signal", "operate"),
        ("POST", "/v1/runs/r1/delete", "admin"),  # an unknown state change: closed by default
        ("POST", "/v1/runs/r1/x/cancel", "admin"),
        ("GET", "/v1/dlq", "admin"),  # dead letters: admin even to read
        ("POST", "/v1/dlq/e1/retry", "admin"),
        ("POST", "/v1/admin/reload", "admin"),
        ("DELETE", "/v1/runs", "admin"),
        ("GET", "/health/ready", None),
        ("GET", "/ui/", None),
        ("POST", "/ui/login", None),
        ("GET", "/ui/static/list.js", None),
        ("GET", "/uix", "read"),
    ],
)
def test_required_scope(method: str, path: str, scope: str | None) -> None:
    assert required_scope(method, path) == scope


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("127.0.0.1:8080", "127.0.0.1"),
        ("LocalHost", "localhost"),
        ("[::1]:80", "::1"),
        ("[::1]", "::1"),
        ("example.com:443", "example.com"),
        ("", ""),
    ],
)
def test_host_name(header: str, name: str) -> None:
    assert host_name(header) == name


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.1", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("example.com", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


OPEN = AccessPolicy.build(None, [], max_body=1000)
LOCKED = AccessPolicy.build(TABLE, ["runner.example"], max_body=1000)
JSON = {"content-type": "application/json"}
HOST = {"host": "127.0.0.1:8080"}


def _decide(
    method: str, path: str, headers: dict[str, str], policy: AccessPolicy = OPEN
) -> Refusal | Principal:
    return check_request(method, path, {**HOST, **headers}, policy)


@pytest.mark.parametrize(
    ("method", "path", "headers", "policy", "status"),
    [
        # Host: loopback names and --allowed-host only (DNS rebinding sends its own name).
        ("GET", "/v1/runs", {}, OPEN, None),
        ("GET", "/v1/runs", {"host": "evil.example:8080"}, OPEN, 421),
        ("GET", "/v1/runs", {"host": "localhost:8080"}, OPEN, None),
        ("GET", "/health/live", {"host": "10.1.2.3:8080"}, OPEN, None),  # probes by address
        ("GET", "/v1/runs", {"host": "runner.example", **JSON}, LOCKED, 401),
        ("GET", "/v1/runs", {"host": "evil.example"}, LOCKED, 421),
        # CSRF: JSON only, no foreign Origin, no cross-site fetch.
        ("POST", "/v1/runs/r/cancel", JSON, OPEN, None),
        ("POST", "/v1/runs/r/cancel", {}, OPEN, 415),
        ("POST", "/v1/runs/r/cancel", {"content-type": "text/plain"}, OPEN, 415),
        (
            "POST",
            "/v1/runs/r/cancel",
            {"content-type": "application/x-www-form-urlencoded"},
            OPEN,
            415,
        ),
        (
            "POST",
            "/v1/runs/r/cancel",
            {"content-type": "application/json; charset=utf-8"},
            OPEN,
            None,
        ),
        ("POST", "/v1/runs/r/cancel", {**JSON, "origin": "http://127.0.0.1:8080"}, OPEN, None),
        ("POST", "/v1/runs/r/cancel", {**JSON, "origin": "http://127.0.0.1:9999"}, OPEN, 403),
        ("POST", "/v1/runs/r/cancel", {**JSON, "origin": "http://evil.example"}, OPEN, 403),
        ("POST", "/v1/runs/r/cancel", {**JSON, "origin": "null"}, OPEN, 403),
        ("POST", "/v1/runs/r/cancel", {**JSON, "sec-fetch-site": "cross-site"}, OPEN, 403),
        ("POST", "/v1/runs/r/cancel", {**JSON, "sec-fetch-site": "same-origin"}, OPEN, None),
        ("POST", "/ui/login", {"content-type": "text/plain"}, OPEN, 415),
        ("GET", "/v1/runs", {"origin": "http://evil.example"}, OPEN, None),  # reads: CORS
        # Body size, by Content-Length before a byte is read.
        ("POST", "/v1/runs", {**JSON, "content-length": "1000"}, OPEN, None),
        ("POST", "/v1/runs", {**JSON, "content-length": "1001"}, OPEN, 413),
        ("POST", "/v1/runs", {**JSON, "content-length": "x"}, OPEN, 400),
        # Tokens: 401 without a valid one, 403 without the scope.
        ("GET", "/v1/runs", {}, LOCKED, 401),
        ("GET", "/v1/runs", {"authorization": f"Bearer {READER}"}, LOCKED, None),
        ("GET", "/v1/runs", {"authorization": f"bearer {READER}"}, LOCKED, None),
        ("GET", "/v1/runs", {"authorization": f"Basic {READER}"}, LOCKED, 401),
        ("GET", "/v1/runs", {"authorization": "Bearer nope"}, LOCKED, 401),
        ("GET", "/v1/runs", {"cookie": f"chainrt_token={READER}"}, LOCKED, None),
        ("GET", "/v1/runs", {"cookie": "chainrt_token=nope"}, LOCKED, 401),
        ("POST", "/v1/runs", {**JSON, "authorization": f"Bearer {READER}"}, LOCKED, 403),
        ("POST", "/v1/runs", {**JSON, "authorization": f"Bearer {WRITER}"}, LOCKED, None),
        ("POST", "/v1/runs/r/cancel", {**JSON, "authorization": f"Bearer {READER}"}, LOCKED, 403),
        ("POST", "/v1/runs/r/cancel", {**JSON, "authorization": f"Bearer {WRITER}"}, LOCKED, None),
        ("GET", "/v1/dlq", {"authorization": f"Bearer {WRITER}"}, LOCKED, 403),
        ("GET", "/health/ready", {}, LOCKED, None),
        ("GET", "/ui/", {}, LOCKED, None),
        ("POST", "/ui/login", JSON, LOCKED, None),
        # With a token, CSRF checks still apply (a cookie rides along with a forged form).
        ("POST", "/v1/runs/r/cancel", {"cookie": f"chainrt_token={WRITER}"}, LOCKED, 415),
    ],
)
def test_check_request(
    method: str,
    path: str,
    headers: dict[str, str],
    policy: AccessPolicy,
    status: int | None,
) -> None:
    decided = _decide(method, path, headers, policy)
    if status is None:
        assert isinstance(decided, Principal), decided
    else:
        assert isinstance(decided, Refusal), decided
        assert decided.status == status, decided
    if isinstance(decided, Refusal) and decided.status == 401:
        assert decided.headers.get("WWW-Authenticate") == "Bearer"


def test_without_tokens_everyone_is_anonymous_with_every_scope() -> None:
    assert _decide("POST", "/v1/dlq/x/drop", JSON) == ANONYMOUS
    assert all(ANONYMOUS.may(s) for s in ("read", "submit", "operate", "admin"))


def test_a_star_allows_any_host() -> None:
    policy = AccessPolicy.build(TABLE, ["*"])
    decided = check_request(
        "GET", "/v1/runs", {"host": "anything.example", "authorization": f"Bearer {READER}"}, policy
    )
    assert isinstance(decided, Principal)
