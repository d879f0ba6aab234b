"""Slow and large clients against one ``chainrt serve`` (issue 36): what they cost the server.

Starts one ``chainrt serve`` on SQLite and measures, over real sockets:

- a 100 MB POST (``Content-Length`` announced, then the body sent as fast as the server takes
  it): the time until the 413 arrives, the bytes the client got to send, and the server's
  resident memory before and after;
- ``--slow`` connections (default 1000) that send a request line and then one header line every
  second: how many are still open after each few seconds, until the server has dropped them all
  (``--header-timeout``, default 10s), and whether ``/health/ready`` answers meanwhile;
- ``--trickle`` connections (default 200) that send whole headers announcing a 1000-byte body,
  then one body byte a second: the same, until ``--body-timeout`` (default 10s here) drops
  them, and what they were answered (408);
- a burst of ``--burst`` clients (default 1000) against ``--max-connections`` (default 64), each
  sending one ``Connection: close`` request at once: how many were answered 200, in how long,
  and the most descriptors the server held meanwhile (the cap holds them; the rest wait in the
  listen backlog).

    .venv/bin/python bench/api_limits.py [--slow 1000] [--header-timeout 10s]
        [--trickle 200] [--body-timeout 10s] [--burst 1000] [--max-connections 64]
"""

from __future__ import annotations

import argparse
import os
import resource
import select
import socket
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from chainrt.testing.serve_process import ServeProcess  # noqa: E402

CHAINS = ROOT / "tests" / "data" / "access"


def rss_mib(pid: int) -> float:
    """Resident memory of ``pid`` in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def big_post(server: ServeProcess, size: int) -> tuple[float, int, bytes]:
    """Seconds until the answer's status line, bytes sent meanwhile, and the status line."""
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(
        b"POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % size
    )
    sock.setblocking(False)
    chunk = b"x" * 65536
    sent = 0
    started = time.monotonic()
    answer = b""
    while sent < size and time.monotonic() - started < 60:
        try:
            answer += sock.recv(4096)
            if b"\r\n" in answer:
                break
        except BlockingIOError:
            pass
        try:
            sent += sock.send(chunk)
        except (BlockingIOError, BrokenPipeError, ConnectionResetError):
            time.sleep(0.001)
    took = time.monotonic() - started
    sock.close()
    return took, sent, answer.split(b"\r\n", 1)[0]


def slow_clients(server: ServeProcess, count: int) -> None:
    """Open ``count`` header-tricklers; print how many stay open over time."""
    socks = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall(b"GET /health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        sock.setblocking(False)
        socks.append(sock)
    started = time.monotonic()
    alive = set(range(count))
    next_report = 0.0
    while alive and time.monotonic() - started < 120:
        for i in list(alive):
            try:
                socks[i].send(b"X-Slow: 1\r\n")
                if socks[i].recv(1024) == b"":
                    alive.discard(i)
            except BlockingIOError:
                pass
            except OSError:
                alive.discard(i)
        elapsed = time.monotonic() - started
        if elapsed >= next_report:
            ready = server.get("/health/ready", timeout=10).status_code
            print(f"  t={elapsed:5.1f}s  open={len(alive):5d}  /health/ready={ready}")
            next_report += 2.0
        time.sleep(1.0)
    print(f"  all {count} dropped after {time.monotonic() - started:.1f}s" if not alive else "")
    for sock in socks:
        sock.close()


def trickle_bodies(server: ServeProcess, count: int) -> None:
    """Open ``count`` body-tricklers; print how many stay open over time and their answers."""
    socks = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall(
            b"POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n{"
        )
        sock.setblocking(False)
        socks.append(sock)
    started = time.monotonic()
    alive = set(range(count))
    answers: dict[str, int] = {}
    next_report = 0.0
    while alive and time.monotonic() - started < 120:
        for i in list(alive):
            try:
                socks[i].send(b" ")
                got = socks[i].recv(4096)
                if got:
                    status = got.split(b"\r\n", 1)[0].decode(errors="replace")
                    answers[status] = answers.get(status, 0) + 1
                alive.discard(i)  # answered, or closed
            except BlockingIOError:
                pass
            except OSError:
                answers["reset"] = answers.get("reset", 0) + 1
                alive.discard(i)
        elapsed = time.monotonic() - started
        if elapsed >= next_report:
            ready = server.get("/health/ready", timeout=10).status_code
            print(f"  t={elapsed:5.1f}s  open={len(alive):5d}  /health/ready={ready}")
            next_report += 2.0
        time.sleep(1.0)
    took = time.monotonic() - started
    print(f"  all {count} dropped after {took:.1f}s" if not alive else f"  {len(alive)} open")
    print(f"  answers: {answers}")
    for sock in socks:
        sock.close()


def burst(server: ServeProcess, count: int) -> None:
    """``count`` clients at once, one ``Connection: close`` request each: answers, time, and
    the server's descriptors at most meanwhile."""
    request = b"GET /health/live HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    fd_dir = f"/proc/{server.pid}/fd"
    before = len(os.listdir(fd_dir))
    started = time.monotonic()
    socks = {}
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall(request)
        socks[sock.fileno()] = sock
    got: dict[int, bytes] = {fd: b"" for fd in socks}
    statuses: dict[str, int] = {}
    most = before
    while socks and time.monotonic() - started < 120:
        most = max(most, len(os.listdir(fd_dir)))
        readable, _, _ = select.select(list(socks.values()), [], [], 0.05)
        for sock in readable:
            fd = sock.fileno()
            try:
                chunk = sock.recv(4096)
            except OSError:
                chunk = b""
            got[fd] += chunk
            if not chunk:
                status = got[fd].split(b"\r\n", 1)[0].decode(errors="replace") or "closed"
                statuses[status] = statuses.get(status, 0) + 1
                sock.close()
                del socks[fd]
    took = time.monotonic() - started
    for sock in socks.values():
        sock.close()
    print(f"  answers: {statuses}{f'; {len(socks)} unanswered' if socks else ''}")
    print(f"  all answered in {took:.2f}s; server descriptors {before} -> at most {most}")


def main() -> int:
    """Run both measurements and print them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slow", type=int, default=1000)
    parser.add_argument("--header-timeout", default="10s")
    parser.add_argument("--body-mb", type=int, default=100)
    parser.add_argument("--trickle", type=int, default=200)
    parser.add_argument("--body-timeout", default="10s")
    parser.add_argument("--burst", type=int, default=1000)
    parser.add_argument("--max-connections", type=int, default=64)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # this process holds the clients
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 2 * args.burst + 256)), hard))
    folder = Path(tempfile.mkdtemp(prefix="api-limits-"))
    serve_args = ["--header-timeout", args.header_timeout, "--body-timeout", args.body_timeout]
    with ServeProcess(
        store=f"sqlite:///{folder / 'runs.db'}", chains=CHAINS, args=serve_args
    ) as server:
        before = rss_mib(server.pid)
        took, sent, status = big_post(server, args.body_mb * 1_000_000)
        after = rss_mib(server.pid)
        print(f"{args.body_mb} MB POST: {status.decode(errors='replace')!r} after {took:.3f}s")
        print(f"  client sent {sent / 1e6:.2f} MB; server RSS {before:.0f} -> {after:.0f} MiB")
        print(
            f"{args.slow} connections trickling headers (--header-timeout {args.header_timeout}):"
        )
        slow_clients(server, args.slow)
        print(f"{args.trickle} connections trickling a body (--body-timeout {args.body_timeout}):")
        trickle_bodies(server, args.trickle)
    serve_args += ["--max-connections", str(args.max_connections)]
    with ServeProcess(
        store=f"sqlite:///{folder / 'burst.db'}", chains=CHAINS, args=serve_args
    ) as server:
        print(f"{args.burst} clients at once (--max-connections {args.max_connections}):")
        burst(server, args.burst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
