"""The private ``redis-server`` helper's ports: never where a probe can join itself.

CI once saw ``redis-server on port 44996 answered PING with b'PING\\r\\n'``: the readiness probe
connected before the server listened, the kernel picked 44996 as the probe's own source port
(it lies in the ephemeral range) and TCP simultaneous open joined the socket to itself, so the
probe read its own PING back.
"""

from __future__ import annotations

import socket

from chainrt.testing.redis_server import RedisServer, _ephemeral_low, free_port


def test_free_ports_lie_below_the_ephemeral_range() -> None:
    low = _ephemeral_low()
    ports = {free_port() for _ in range(200)}
    assert all(1024 <= port < low for port in ports), sorted(ports)[-5:]
    assert len(ports) > 150  # spread out, so two workers rarely try the same one


def test_a_socket_joined_to_itself_echoes_and_is_recognised() -> None:
    # What the probe met: a socket bound to P and connected to P talks to itself.
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.connect(("127.0.0.1", port))
        assert sock.getsockname() == sock.getpeername()
        sock.sendall(b"PING\r\n")
        assert sock.recv(16) == b"PING\r\n"


def test_the_helper_starts_on_a_port_below_the_range_and_answers() -> None:
    with RedisServer() as server:
        assert server.port < _ephemeral_low()
        with socket.create_connection(("127.0.0.1", server.port), timeout=2) as sock:
            sock.sendall(b"PING\r\n")
            assert sock.recv(16).startswith(b"+PONG")
