"""Commands written and replies read straight on a bare connection's streams (the hot path's I/O).

redis-py reads a reply through four layers of coroutines (connection, parser, line reader,
stream), formats a description of the host for every reply and decodes bulk strings one by one:
on a 2-CPU machine about as much Python per round trip as the limiter's own code. Here the bytes
are read with the stream's own ``read`` and parsed by :class:`._resp_parse.ReplyParser` (the one
RESP reader of the hot path, which the pipe uses too). What comes back is what redis-py's parsers
(RESP2 and RESP3) hand back for the same bytes: see :mod:`._resp_parse`; a lost connection is
redis-py's ``ConnectionError``. Only for connections that nothing else reads from
(:class:`._lean.LeanRedis`).
"""

from __future__ import annotations

from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse

from ._resp_parse import INCOMPLETE, ReplyParser

__all__ = ["read_replies", "write"]

_CLOSED = "Connection closed by server."  # redis-py's words for it
_CHUNK = 65536


async def write(conn: Any, command: list[bytes]) -> None:
    """Write the packed ``command`` on ``conn`` (a connected redis-py asyncio connection)."""
    writer = conn._writer
    try:
        if len(command) == 1:
            writer.write(command[0])
        else:
            writer.writelines(command)
        await writer.drain()
    except OSError as exc:
        raise RedisConnectionError(f"Error while writing to socket: {exc}") from exc


async def read_replies(conn: Any, count: int) -> list[Any]:
    """Read ``count`` whole replies from ``conn``: what the commands written on it answer.
    Bytes past them (nothing may follow on a connection nobody else reads) are a protocol
    error: the caller drops the connection."""
    reader = conn._reader
    parser = ReplyParser(conn)
    out: list[Any] = []
    try:
        while len(out) < count:
            reply = parser.next()
            if reply is not INCOMPLETE:
                out.append(reply)
                continue
            data = await reader.read(_CHUNK)
            if not data:
                raise RedisConnectionError(_CLOSED)
            parser.feed(data)
    except OSError as exc:
        raise RedisConnectionError(f"Error while reading from socket: {exc}") from exc
    if parser.pending():
        raise InvalidResponse("bytes after the replies asked for")
    return out
