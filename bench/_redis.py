"""The private redis-server the benches start: persistence on by default, as compose runs it.

docker-compose.yml runs Redis with ``--appendonly yes`` (fsync once a second), so a bench that
measured a Redis without persistence would flatter every write. ``--no-persistence`` turns it
off to show what persistence costs; every bench prints which one it measured.

``--delay-us D`` puts ``bench/_delay_proxy.py`` between the bench and the server, holding every
chunk D microseconds each way: Redis on another host, for figures that depend on the round trip.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from chainrt.testing.redis_server import RedisServer, free_port

__all__ = [
    "add_delay_flag",
    "add_persistence_flag",
    "delay_label",
    "persistence_label",
    "private_server",
    "reached",
]


def add_persistence_flag(parser: argparse.ArgumentParser) -> None:
    """Add ``--no-persistence`` to a bench's arguments."""
    parser.add_argument(
        "--no-persistence",
        action="store_true",
        help="private Redis without the append-only file (default: AOF, fsync every second, "
        "as docker-compose runs it)",
    )


def private_server(args: argparse.Namespace) -> RedisServer:
    """A private redis-server configured from the parsed arguments (not started)."""
    return RedisServer(durable=not args.no_persistence, appendfsync="everysec")


def persistence_label(args: argparse.Namespace) -> str:
    """How the private server persists, for the bench's output."""
    if args.no_persistence:
        return "persistence off (--no-persistence)"
    return "persistence on: AOF, appendfsync everysec (as docker-compose)"


def add_delay_flag(parser: argparse.ArgumentParser) -> None:
    """Add ``--delay-us`` (a network's latency between the bench and its private Redis)."""
    parser.add_argument(
        "--delay-us",
        type=int,
        default=0,
        help="reach the private Redis through bench/_delay_proxy.py, which holds every chunk "
        "this many microseconds each way (default 0: loopback, no proxy)",
    )


def delay_label(args: argparse.Namespace) -> str:
    """How the bench reaches its private server, for the bench's output."""
    if not args.delay_us:
        return "reached on loopback, no added latency"
    return (
        f"reached through bench/_delay_proxy.py: +{args.delay_us} us each way "
        "(the raw round trip below is measured through it too)"
    )


@contextlib.contextmanager
def reached(server: RedisServer, args: argparse.Namespace) -> Iterator[str]:
    """The URL the bench uses for ``server``: its own, or a delay proxy's in front of it."""
    if not args.delay_us:
        yield server.url
        return
    port = free_port()
    script = Path(__file__).with_name("_delay_proxy.py")
    proxy = subprocess.Popen(
        [sys.executable, str(script), str(port), str(server.port), str(args.delay_us)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proxy.stdout is not None
        if proxy.stdout.readline().strip() != "ready":
            raise RuntimeError(f"bench/_delay_proxy.py did not start (exit {proxy.poll()})")
        yield server.url.replace(f":{server.port}", f":{port}", 1)
    finally:
        proxy.kill()
        proxy.wait()
        if proxy.stdout is not None:
            proxy.stdout.close()
