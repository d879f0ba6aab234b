"""A TCP proxy that holds every chunk a fixed time each way: a network's latency, for benches.

    python bench/_delay_proxy.py LISTEN_PORT TARGET_PORT DELAY_US

Loopback Redis on a bench machine answers in about 0.1 ms, where Redis on another host
answers in 0.2-0.5 ms; ratios that depend on the round trip (issue 18's "64 runs at once vs one")
change with it. This proxy runs in its own process, so its CPU is not counted in the bench's
process, and it models latency, not bandwidth: each direction of each connection has a reader
thread that stamps a chunk with its due time (arrival + delay) and a sender thread that sleeps
until that time and forwards it, so chunks in flight overlap as packets on a wire do. The hop
itself (thread wake-ups, two more socket writes, ``time.sleep``'s timer slack) adds more than
the delay: on the 2-CPU bench machine a raw round trip of 0.10-0.14 ms became 0.19-0.26 ms at
1 us and 0.41-0.52 ms at 50 us (``docs/performance.md``, round 12). So the benches measure the
raw round trip through the same proxy, in the same run, and report that, not the delay.

It prints ``ready`` on stdout once it listens, and runs until it is killed.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import sys
import threading
import time

_Chunk = tuple[float, bytes] | None


def _send(dst: socket.socket, chunks: queue.SimpleQueue[_Chunk]) -> None:
    while (chunk := chunks.get()) is not None:
        due, data = chunk
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        try:
            dst.sendall(data)
        except OSError:
            break
    _close(dst)


def _pump(src: socket.socket, dst: socket.socket, delay: float) -> None:
    chunks: queue.SimpleQueue[_Chunk] = queue.SimpleQueue()
    threading.Thread(target=_send, args=(dst, chunks), daemon=True).start()
    while True:
        try:
            data = src.recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            chunks.put(None)
            return
        chunks.put((time.monotonic() + delay, data))


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def _connected(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def serve(listen_port: int, target_port: int, delay: float) -> None:
    """Accept connections on ``listen_port`` and relay each to ``target_port``, ``delay`` s late."""
    with socket.create_server(("127.0.0.1", listen_port)) as server:
        print("ready", flush=True)
        while True:
            client, _ = server.accept()
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                upstream = _connected(target_port)
            except OSError:  # the server is gone: this client is refused, the proxy stays up
                _close(client)
                continue
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(src, dst, delay), daemon=True).start()


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]) / 1e6)
