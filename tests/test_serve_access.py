"""API access and limits of a real ``chainrt serve`` over HTTP (docs/security.md): tokens and
scopes, the cross-site request checks, the body limit before reading, slow clients dropped,
every poison body a 422 before anything is written, and resume budgets in the right unit."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from chainrt._api_tokens import hash_token
from chainrt.testing.redis_server import free_port
from chainrt.testing.serve_process import ServeProcess

CHAINS = Path(__file__).parent / "data" / "access"
REPO = Path(__file__).resolve().parent.parent
READ = "read-token-0123456789"
SUBMIT = "submit-token-0123456789"
OPERATE = "operate-token-0123456789"
TOKENS = "\n".join(
    [
        f"viewer:read:{hash_token(READ)}",
        f"ci:read,submit:{hash_token(SUBMIT)}",
        f"ops:read,operate:{hash_token(OPERATE)}",
    ]
)


# Seven `chainrt serve` processes and real slow clients: about 2 minutes on 2 cores, so the
# slow tier (the quick tier's goal is 10 minutes in all).
pytestmark = pytest.mark.slow


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _open_runner(tmp_path: Path, http: str = "httptools") -> ServeProcess:
    """No tokens, on loopback: open, as the docs say, but only to requests that pass the
    Host, Origin and Content-Type checks. Small limits so the tests stay quick. ``http``: the
    HTTP protocol (``CHAINRT_SERVE_HTTP``)."""
    args = ["--max-body", "64KiB", "--header-timeout", "1s", "--max-budget", "10m"]
    return ServeProcess(
        store=f"sqlite:///{tmp_path / 'runs.db'}",
        chains=CHAINS,
        max_runs=2,
        args=args,
        env={"CHAINRT_SERVE_HTTP": http},
    )


@pytest.fixture
def open_runner(tmp_path: Path) -> Iterator[ServeProcess]:
    """:func:`_open_runner` on the default protocol."""
    with _open_runner(tmp_path) as runner:
        yield runner


@pytest.fixture(params=["httptools", "h11"])
def open_runner_each_protocol(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[ServeProcess]:
    """:func:`_open_runner` on httptools, then on h11."""
    with _open_runner(tmp_path, request.param) as runner:
        yield runner


@pytest.fixture
def locked_runner(tmp_path: Path) -> Iterator[ServeProcess]:
    env = {"CHAINRT_API_TOKENS": TOKENS}
    with ServeProcess(
        store=f"sqlite:///{tmp_path / 'runs.db'}", chains=CHAINS, max_runs=2, env=env
    ) as runner:
        yield runner


def wait_status(r: ServeProcess, run_id: str, wanted: set[str], **kw: Any) -> dict[str, Any]:
    deadline = time.monotonic() + 60  # generous: a loaded 2-core box
    while True:
        run: dict[str, Any] = r.get(f"/v1/runs/{run_id}", **kw).json()
        if run["status"] in wanted:
            return run
        assert time.monotonic() < deadline, f"{run_id} still {run['status']}"
        time.sleep(0.05)


def test_tokens_and_scopes(locked_runner: ServeProcess) -> None:
    r = locked_runner
    nap = {"chain": "nap", "input": {"seconds": 30.0, "label": "x"}, "run_id": "t1"}
    no_token = r.get("/v1/runs")
    assert no_token.status_code == 401
    assert no_token.headers["www-authenticate"] == "Bearer"
    assert no_token.json()["error"]["type"] == "unauthorized"
    assert r.get("/v1/runs", headers=bearer("not-a-token")).status_code == 401
    assert r.get("/v1/runs", headers=bearer(READ)).json() == []
    assert r.get("/metrics").status_code == 401
    assert r.get("/health/ready").status_code == 200  # probes need no token
    assert r.get("/ui/").status_code == 200  # the page; its data needs a token

    refused = r.post("/v1/runs", json=nap, headers=bearer(READ))
    assert refused.status_code == 403
    assert "'submit'" in refused.json()["error"]["message"]
    assert r.get("/v1/runs/t1", headers=bearer(READ)).status_code == 404  # nothing written
    assert r.post("/v1/runs", json=nap, headers=bearer(SUBMIT)).status_code == 202
    wait_status(r, "t1", {"running"}, headers=bearer(READ))
    assert r.post("/v1/runs/t1/cancel", headers=bearer(SUBMIT)).status_code == 403
    assert r.post("/v1/runs/t1/cancel").status_code == 401
    assert wait_status(r, "t1", {"running"}, headers=bearer(READ))["status"] == "running"
    done = r.post("/v1/runs/t1/cancel", headers=bearer(OPERATE))
    assert (done.status_code, done.json()["status"]) == (202, "cancelled")


def test_cli_sends_the_token(locked_runner: ServeProcess) -> None:
    r = locked_runner
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("CHAINRT_API_TOKEN", None)
    command = [sys.executable, "-m", "chainrt", "submit", "five", "--input", "{}"]
    command += ["--server", r.url, "--json"]

    def chainrt(*extra: str, **more_env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*command, *extra],
            capture_output=True,
            text=True,
            env={**env, **more_env},
            timeout=120,
            check=False,
        )

    refused = chainrt()
    assert refused.returncode == 3  # EXIT_RUNTIME: the server refused
    assert "answered 401" in refused.stderr
    assert len(refused.stderr.splitlines()) == 1
    by_flag = chainrt("--token", SUBMIT, "--run-id", "cli-1")
    assert by_flag.returncode == 0, by_flag.stderr
    assert json.loads(by_flag.stdout)["run_id"] == "cli-1"
    by_env = chainrt("--run-id", "cli-2", CHAINRT_API_TOKEN=SUBMIT)
    assert by_env.returncode == 0, by_env.stderr
    wait_status(r, "cli-2", {"completed"}, headers=bearer(READ))
    cancel = subprocess.run(
        [sys.executable, "-m", "chainrt", "cancel", "cli-2", "--server", r.url, "--json"],
        capture_output=True,
        text=True,
        env={**env, "CHAINRT_API_TOKEN": OPERATE},
        timeout=120,
        check=False,
    )
    assert cancel.returncode == 0, cancel.stderr
    assert json.loads(cancel.stdout) == {"run_id": "cli-2", "status": "completed"}


def test_token_new_prints_a_line_a_server_accepts(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    made = subprocess.run(
        [
            sys.executable,
            "-m",
            "chainrt",
            "token",
            "new",
            "ci",
            "--scopes",
            "submit,read",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    printed = json.loads(made.stdout)
    assert printed["line"] == f"ci:read,submit:{hash_token(printed['token'])}"
    tokens = tmp_path / "tokens.txt"
    tokens.write_text(printed["line"] + "\n")
    with ServeProcess(
        store=f"sqlite:///{tmp_path / 'runs.db'}", chains=CHAINS, args=["--tokens", str(tokens)]
    ) as r:
        assert r.get("/v1/chains").status_code == 401
        assert r.get("/v1/chains", headers=bearer(printed["token"])).status_code == 200


def test_non_loopback_host_without_tokens_is_refused(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("CHAINRT_API_TOKENS", None)
    command = [sys.executable, "-m", "chainrt", "serve", "--host", "0.0.0.0"]
    command += ["--port", str(free_port()), "--chains", str(CHAINS)]
    command += ["--store", f"sqlite:///{tmp_path / 'runs.db'}"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "--insecure-no-auth" in done.stderr
    assert "--tokens" in done.stderr


def test_cross_site_requests_are_refused(open_runner: ServeProcess) -> None:
    r = open_runner
    nap = {"chain": "nap", "input": {"seconds": 30.0, "label": "x"}, "run_id": "c1"}
    assert r.post("/v1/runs", json=nap).status_code == 202
    wait_status(r, "c1", {"running"})
    url = f"{r.url}/v1/runs/c1/cancel"
    # What a <form enctype=text/plain> and fetch(..., {mode: "no-cors"}) can send.
    form = httpx.post(url, content=b'{"x": "="}', headers={"Content-Type": "text/plain"})
    assert (form.status_code, form.json()["error"]["type"]) == (415, "unsupported_media_type")
    assert httpx.post(url).status_code == 415  # no body, no type: the resume-with-no-body case
    foreign = httpx.post(url, json={}, headers={"Origin": "http://evil.example"})
    assert (foreign.status_code, foreign.json()["error"]["type"]) == (403, "cross_origin")
    rebound = httpx.post(url, json={}, headers={"Host": f"evil.example:{r.port}"})
    assert rebound.status_code == 421
    assert httpx.get(f"{r.url}/v1/runs", headers={"Host": "evil.example"}).status_code == 421
    assert r.get("/v1/runs/c1").json()["status"] == "running"  # nothing got through
    own = httpx.post(url, json={}, headers={"Origin": r.url})
    assert (own.status_code, own.json()["status"]) == (202, "cancelled")


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _answer(sock: socket.socket) -> bytes:
    sock.settimeout(30)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_large_bodies_get_413_before_they_are_read(open_runner: ServeProcess) -> None:
    r = open_runner
    before = _rss_kib(r.pid)
    # 100 MB announced, nothing sent: the answer comes at once, the body is never read.
    with socket.create_connection(("127.0.0.1", r.port)) as sock:
        sock.sendall(
            b"POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100000000\r\n\r\n"
        )
        head = _answer(sock)
    assert head.startswith(b"HTTP/1.1 413 "), head[:200]
    # Chunked, no length: refused once the count passes --max-body (64 KiB here).
    chunk = b"x" * 16384
    with socket.create_connection(("127.0.0.1", r.port)) as sock:
        sock.sendall(
            b"POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        for _ in range(8):
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        head = _answer(sock)
    assert head.startswith(b"HTTP/1.1 413 "), head[:200]
    body = r.post("/v1/runs", content=b" " * 70_000, headers={"content-type": "application/json"})
    assert (body.status_code, body.json()["error"]["type"]) == (413, "body_too_large")
    # 100 MB were never buffered: the runner grew by far less than one such body (it grew by
    # ~480 MB before); 30 MB leaves room for allocator noise on a loaded machine.
    assert _rss_kib(r.pid) - before < 30_000
    assert r.get("/health/ready").status_code == 200


def test_slow_clients_are_dropped(open_runner_each_protocol: ServeProcess) -> None:
    r = open_runner_each_protocol  # --header-timeout 1s
    silent = [socket.create_connection(("127.0.0.1", r.port)) for _ in range(20)]
    trickling = [socket.create_connection(("127.0.0.1", r.port)) for _ in range(20)]
    for sock in trickling:
        sock.sendall(b"GET /health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    opened = time.monotonic()
    open_ones = set(range(40))
    everyone = silent + trickling
    for sock in everyone:
        sock.setblocking(False)
    # A header line every 0.2 s would keep a connection forever without the deadline; 20 s
    # is far beyond the 1 s deadline and far below "never" (the finding: 40 s and counting).
    while open_ones and time.monotonic() - opened < 20:
        for i in list(open_ones):
            sock = everyone[i]
            try:
                if i >= 20:
                    sock.sendall(b"X-Slow: 1\r\n")
                if sock.recv(1024) == b"":
                    open_ones.discard(i)
            except BlockingIOError:
                pass
            except OSError:  # reset or broken pipe: closed by the server
                open_ones.discard(i)
        time.sleep(0.2)
    for sock in everyone:
        sock.close()
    assert not open_ones, f"{len(open_ones)} slow connections still open after 20 s"
    assert r.get("/health/live").status_code == 200  # a normal client is still served


POISON: list[tuple[dict[str, Any], str]] = [
    ({"chain": "nap", "input": {"seconds": 1.0, "label": "x"}, "budget": True}, "budget"),
    ({"chain": "nap", "input": {"seconds": 1.0, "label": "x"}, "budget": 1e308}, "budget"),
    ({"chain": "nap", "input": {"seconds": 1.0, "label": "x"}, "budget": 1e-300}, "budget"),
    ({"chain": "nap", "input": {"seconds": 1.0, "label": "x"}, "budget": "0.0000001ms"}, "budget"),
    ({"chain": "nap", "input": {"seconds": 1.0, "label": "x"}, "budget": "2h"}, "budget"),
    ({"chain": "nap", "input": {"seconds": 1.0, "label": "x"}, "budget": -1}, "budget"),
    ({"chain": "nap", "input": {"seconds": 1.0, "label": "x"}, "priority": "urgent"}, "priority"),
    ({"chain": "nap", "input": {"seconds": 1.0, "label": "x"}, "run_id": "."}, "run_id"),
    ({"chain": "nap", "input": {"seconds": 1.0, "label": "x"}, "run_id": ".."}, "run_id"),
]


def _deep(levels: int) -> Any:
    value: Any = "bottom"
    for _ in range(levels):
        value = {"a": value}
    return value


def test_poison_bodies_are_422_naming_the_field_and_nothing_is_written(
    open_runner: ServeProcess,
) -> None:
    r = open_runner
    for body, field in POISON:
        answer = r.post("/v1/runs", json={**body, "run_id": body.get("run_id", "p1")})
        assert answer.status_code == 422, (body, answer.text)
        assert answer.json()["error"]["field"] == field, answer.text
    deep = {"chain": "keep", "input": {"data": _deep(200)}, "priority": "critical"}
    answer = r.post("/v1/runs", json=deep)
    assert (answer.status_code, answer.json()["error"]["field"]) == (422, "input"), answer.text
    assert "deeper than 64 levels" in answer.json()["error"]["message"]
    raw = {
        # A lone surrogate (the finding: a 500 with a traceback).
        "surrogate": b'{"chain": "nap", "input": {"seconds": 1, "label": "\\ud800"}}',
        "surrogate in a key": b'{"chain": "nap", "input": {"\\udfff": 1}}',
        "surrogate in the chain": b'{"chain": "\\ud800", "input": {}}',
        "duplicate key": b'{"chain": "nap", "input": {"seconds": 1, "seconds": 2}}',
        "not UTF-8": b'{"chain": "nap", "input": {"label": "\xff"}}',
    }
    for name, content in raw.items():
        answer = r.post("/v1/runs", content=content, headers={"content-type": "application/json"})
        assert answer.status_code == 422, (name, answer.text)
        assert answer.json()["error"]["type"] == "invalid_request", (name, answer.text)
    fields = {
        name: r.post("/v1/runs", content=raw[name], headers={"content-type": "application/json"})
        .json()["error"]
        .get("field")
        for name in ("surrogate", "surrogate in the chain")
    }
    assert fields == {"surrogate": "input", "surrogate in the chain": "chain"}
    too_deep = r.post("/v1/runs", json={"chain": "keep", "input": {"data": _deep(64)}})
    assert (too_deep.status_code, too_deep.json()["error"]["field"]) == (422, "input")
    assert r.get("/v1/runs").json() == []  # nothing was recorded
    ok = {"chain": "keep", "input": {"data": _deep(63)}, "budget": "10m"}
    assert r.post("/v1/runs", json=ok).status_code == 202  # the limits themselves are accepted


def test_resume_budget_is_the_time_asked_for(open_runner: ServeProcess) -> None:
    r = open_runner
    body = {"chain": "nap", "input": {"seconds": 600.0, "label": "x"}, "run_id": "rb"}
    assert r.post("/v1/runs", json=body).status_code == 202
    wait_status(r, "rb", {"running"})
    assert r.post("/v1/runs/rb/cancel").json()["status"] == "cancelled"
    used = wait_status(r, "rb", {"cancelled"})["budget"]["used_ms"]
    assert r.post("/v1/runs/rb/resume", json={"budget": "2h"}).status_code == 422  # > 10m
    assert r.post("/v1/runs/rb/resume", json={"budget": True}).status_code == 422
    assert r.post("/v1/runs/rb/resume", json={"budget": "30s"}).status_code == 202
    run = wait_status(r, "rb", {"running"})
    # 30 s more than it had used (the finding: 30,000,000 ms); the run's own clock may have
    # added what the resume took to start, never a factor of 1000.
    assert used + 30_000 <= run["budget"]["total_ms"] <= used + 31_000, run["budget"]
    r.post("/v1/runs/rb/cancel")


def test_docs_are_off_and_error_types_are_snake_case(open_runner: ServeProcess) -> None:
    r = open_runner
    assert r.get("/docs").status_code == 404  # Swagger UI would load from a CDN
    assert r.get("/openapi.json").status_code == 200
    assert (
        r.post("/v1/runs", json={"chain": "five", "input": {}, "run_id": "d1"}).status_code == 202
    )
    wait_status(r, "d1", {"completed"})
    again = r.post("/v1/runs/d1/resume", json={})
    assert (again.status_code, again.json()["error"]["type"]) == (409, "checkpoint_error")
