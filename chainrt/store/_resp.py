"""Commands written and replies read straight on a bare connection's streams (the hot path's I/O).

redis-py reads a reply through four layers of coroutines (connection, parser, line reader,
stream), formats a description of the host for every reply and decodes bulk strings one by one:
on a 2-CPU machine about as much Python per round trip as the limiter's own code. Here a reply is
read with one coroutine and the stream's own ``readuntil`` / ``readexactly``. What comes back is
what redis-py's parsers (RESP2 and RESP3) hand back for the same bytes: the same Python types,
bulk and simple strings decoded as the connection's encoder decodes them, an error reply as the
exception redis-py makes of it (returned, or raised where redis-py raises it: the
``ConnectionError`` kinds such as ``LOADING``), a lost connection as redis-py's
``ConnectionError``. Only for connections that nothing else reads from (:class:`._lean.LeanRedis`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse

__all__ = ["error_reply", "read_reply", "write"]

_CLOSED = "Connection closed by server."  # redis-py's words for it


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


async def read_reply(conn: Any) -> Any:
    """Read one whole reply from ``conn``; see the module's docstring for what it returns."""
    reader: asyncio.StreamReader = conn._reader
    try:
        line = await reader.readuntil(b"\r\n")
        if line[0] == 58:  # b":" an integer: the answer of most hot-path scripts
            return int(line[1:-2])
        return await _value(conn, reader, line)
    except asyncio.IncompleteReadError as exc:
        raise RedisConnectionError(_CLOSED) from exc
    except OSError as exc:
        raise RedisConnectionError(f"Error while reading from socket: {exc}") from exc


async def _value(conn: Any, reader: asyncio.StreamReader, line: bytes) -> Any:
    kind, body = line[:1], line[1:-2]
    if kind == b":" or kind == b"(":
        return int(body)
    if kind == b"$":
        size = int(body)
        if size < 0:  # RESP2's null
            return None
        return conn.encoder.decode((await reader.readexactly(size + 2))[:-2])
    if kind == b"*" or kind == b"~":
        size = int(body)
        if size < 0:
            return None
        return [await _value(conn, reader, await reader.readuntil(b"\r\n")) for _ in range(size)]
    if kind == b"+":
        return conn.encoder.decode(body)
    if kind == b"-":
        return error_reply(conn, body)
    if kind == b"_":
        return None
    if kind == b"%":
        out = {}
        for _ in range(int(body)):
            key = await _value(conn, reader, await reader.readuntil(b"\r\n"))
            out[key] = await _value(conn, reader, await reader.readuntil(b"\r\n"))
        return out
    if kind == b",":
        return float(body)
    if kind == b"#":
        return body == b"t"
    if kind == b"!":
        return error_reply(conn, (await reader.readexactly(int(body) + 2))[:-2])
    if kind == b"=":
        return conn.encoder.decode((await reader.readexactly(int(body) + 2))[4:-2])
    if kind == b">":  # an out-of-band push (no handler here): skipped, the reply follows it
        for _ in range(int(body)):
            await _value(conn, reader, await reader.readuntil(b"\r\n"))
        return await _value(conn, reader, await reader.readuntil(b"\r\n"))
    raise InvalidResponse(f"Protocol Error: {line!r}")


def error_reply(conn: Any, body: bytes) -> Any:
    """The exception redis-py makes of error reply ``body``: returned, or raised for the
    ``ConnectionError`` kinds (``LOADING`` and the like)."""
    error = conn._parser.parse_error(body.decode("utf-8", errors="replace"))
    if isinstance(error, RedisConnectionError):
        raise error
    return error
