"""The private redis-server the benches start: persistence on by default, as compose runs it.

docker-compose.yml runs Redis with ``--appendonly yes`` (fsync once a second), so a bench that
measured a Redis without persistence would flatter every write. ``--no-persistence`` turns it
off to show what persistence costs; every bench prints which one it measured.
"""

from __future__ import annotations

import argparse

from chainrt.testing.redis_server import RedisServer

__all__ = ["add_persistence_flag", "persistence_label", "private_server"]


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
