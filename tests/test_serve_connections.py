"""Connections of a real ``chainrt serve`` over real sockets (docs/security.md, Limits on
clients): a body trickled past ``--body-timeout`` is answered 408 and dropped; past
``--max-connections`` new connections wait to be accepted and are served once one closes; with
the cap set above what the process can hold, a burst is served without a traceback storm."""

from __future__ import annotations

import resource
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from chainrt.serve._accept import RESERVE, default_max_connections
from chainrt.testing.redis_server import free_port
from chainrt.testing.serve_process import ServeProcess

CHAINS = Path(__file__).parent / "data" / "access"
LIVE = b"GET /health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
CAP = 4


@pytest.fixture(scope="module", params=["httptools", "h11"])
def runner(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServeProcess]:
    """Small limits; long header and idle timeouts, so that held connections stay held. On
    both HTTP protocols: httptools (the default where installed) and h11 (the fallback)."""
    folder = tmp_path_factory.mktemp("connections")
    args = ["--body-timeout", "1s", "--max-connections", str(CAP)]
    args += ["--header-timeout", "60s", "--idle-timeout", "60s"]
    env = {"CHAINRT_SERVE_HTTP": request.param}
    with ServeProcess(
        store=f"sqlite:///{folder / 'runs.db'}", chains=CHAINS, max_runs=1, args=args, env=env
    ) as server:
        yield server


def read_answer(sock: socket.socket, timeout_s: float = 30.0) -> bytes:
    """What the server sends until a whole response head is in, or it closes."""
    sock.settimeout(timeout_s)
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = sock.recv(4096)
        if not chunk:
            break
        got += chunk
    return got


def metric(runner: ServeProcess, name: str) -> float:
    """One unlabelled figure of ``/metrics``."""
    for line in runner.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def test_default_cap_leaves_a_reserve() -> None:
    assert default_max_connections(1024) == 1024 - RESERVE
    assert default_max_connections(256) == 192  # a quarter at most
    assert default_max_connections(2) == 2
    assert default_max_connections(resource.RLIM_INFINITY) > 10_000


def test_a_trickled_body_is_answered_408_and_dropped(runner: ServeProcess) -> None:
    # The same body sent whole is read and answered (422: no chain named).
    whole = runner.post("/v1/runs", content=b"{}", headers={"content-type": "application/json"})
    assert whole.status_code == 422
    sock = socket.create_connection(("127.0.0.1", runner.port))
    sock.sendall(
        b"POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n{"
    )
    sock.setblocking(False)
    sent, answer, started = 1, b"", time.monotonic()
    # A byte every 0.1 s takes 100 s for the 1000 announced: a server without a body deadline
    # is still reading when the 30 s below are up; this one (--body-timeout 1s) cuts it short.
    while time.monotonic() - started < 30 and b"\r\n\r\n" not in answer:
        try:
            sent += sock.send(b" ")
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
        except BlockingIOError:
            pass
        except OSError:  # reset: dropped without an answer
            break
        time.sleep(0.1)
    answer += read_answer(sock, 10) if b"\r\n\r\n" in answer else b""
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"body-timeout" in answer
    assert sent < 1000
    assert runner.get("/health/live").status_code == 200
    assert "Traceback" not in runner.log()
    assert metric(runner, "chainrt_serve_body_timeouts_total") >= 1


def test_a_408_reaches_a_client_that_is_still_sending(runner: ServeProcess) -> None:
    # A client that keeps writing its (too slow, too long) body while the deadline passes: the
    # server must not close with its bytes unread, which resets the connection at once and can
    # drop the 408 still in the send queue (CI once saw a trickling client get no answer). It
    # answers, stops writing, reads and drops what still comes for a moment, then closes.
    sock = socket.create_connection(("127.0.0.1", runner.port))
    sock.sendall(
        b"POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000000\r\n\r\n{"
    )
    sock.setblocking(False)
    answer, reset, started = b"", False, time.monotonic()
    pace = 0.002  # 1 KiB every 2 ms: the announced 1 MB (under --max-body-bytes) takes 2 s
    while time.monotonic() - started < 20 and b"\r\n\r\n" not in answer:
        try:
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
            continue
        except BlockingIOError:
            pass
        except OSError:
            reset = True
            break
        try:
            sock.send(b" " * 1024)
        except BlockingIOError:
            pass
        except OSError:
            reset = True
            break
        time.sleep(pace)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408"), (answer[:200], reset)
    assert b"body-timeout" in answer
    assert runner.get("/health/live").status_code == 200


def test_past_the_cap_connections_wait_and_are_served_when_one_closes(
    runner: ServeProcess,
) -> None:
    held = [socket.create_connection(("127.0.0.1", runner.port)) for _ in range(CAP)]
    started = time.monotonic()
    for sock in held:
        sock.sendall(LIVE)
        assert read_answer(sock).startswith(b"HTTP/1.1 200")  # kept alive: each holds a slot
    answered_s = time.monotonic() - started
    waiting = socket.create_connection(("127.0.0.1", runner.port))  # the kernel's backlog
    waiting.sendall(LIVE)
    # Not accepted while CAP connections are open: no answer in many times what CAP answers
    # took just now (the same server, the same moment).
    quiet_s = max(1.0, 10 * answered_s)
    readable, _, _ = select.select([waiting], [], [], quiet_s)
    assert not readable, "a connection past --max-connections was served"
    held.pop().close()
    assert read_answer(waiting).startswith(b"HTTP/1.1 200")
    for sock in [*held, waiting]:
        sock.close()
    assert metric(runner, "chainrt_serve_connections_limit") == CAP
    assert metric(runner, "chainrt_serve_connections_cap_reached_total") >= 1


def test_a_burst_past_the_descriptors_is_served_without_a_traceback_storm(
    tmp_path: Path,
) -> None:
    # --max-connections far above what `ulimit -n 128` holds: the accept fails for lack of
    # descriptors, pauses and is tried again (logged once), and every client is served.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (128, hard))
    try:
        server = ServeProcess(
            store=f"sqlite:///{tmp_path / 'runs.db'}",
            chains=CHAINS,
            max_runs=1,
            args=["--max-connections", "10000"],
        ).start()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        clients = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(200)]
        for sock in clients:
            sock.sendall(LIVE)
        answers = []
        for sock in clients:
            answers.append(read_answer(sock, 60)[:12])
            sock.close()  # its descriptor back: a later one is accepted
        assert answers == [b"HTTP/1.1 200"] * len(clients)
        assert server.get("/health/ready").status_code == 200
        log = server.log()
        assert log.count("Traceback") == 0
        assert 1 <= log.count("accepting connections failed") <= 3
    finally:
        server.stop()


def test_streams_that_could_take_every_connection_are_refused_at_start(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "chainrt", "serve", "--port", str(free_port())]
    command += ["--chains", str(CHAINS), "--store", f"sqlite:///{tmp_path / 'runs.db'}"]
    command += ["--max-connections", "10", "--max-streams", "10"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--max-streams 10 must be below --max-connections 10" in done.stderr
    assert "Traceback" not in done.stderr
