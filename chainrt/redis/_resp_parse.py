"""Whole RESP replies taken from the bytes a connection has received so far, without awaiting.

The one RESP reader of the hot path: the pipe (:mod:`._pipe`) hands each reply to its caller from
the transport's ``data_received`` callback (no reader task between the socket and the caller, so a
reply reaches its caller one loop turn sooner), and :func:`._resp.read_replies` feeds it what it
reads from a bare connection's stream. What comes back is what redis-py's parsers (RESP2 and
RESP3) hand back for the same bytes: the same Python types, bulk and simple strings decoded as the
connection's encoder decodes them, an error reply as the exception redis-py makes of it (returned,
or raised where redis-py raises it: the ``ConnectionError`` kinds such as ``LOADING``); a protocol
violation raises redis-py's ``InvalidResponse``.
"""

from __future__ import annotations

from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse

__all__ = ["INCOMPLETE", "ReplyParser", "error_reply"]

INCOMPLETE: Any = object()
"""What :meth:`ReplyParser.next` returns while the next reply has not fully arrived."""


class _Short(Exception):
    """The buffer ends inside the reply being parsed."""


class ReplyParser:
    """The replies in the bytes of one connection, fed in as they arrive (``conn``: the redis-py
    connection whose encoder and error parser the replies go through)."""

    __slots__ = ("_buf", "_conn", "_pos")

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._buf = b""
        self._pos = 0

    def feed(self, data: bytes) -> None:
        """Add bytes received from the connection."""
        if self._pos >= len(self._buf):  # the usual case: every earlier reply was whole
            self._buf, self._pos = data, 0
        else:
            self._buf, self._pos = self._buf[self._pos :] + data, 0

    def pending(self) -> bool:
        """Whether bytes past the last whole reply are buffered."""
        return self._pos < len(self._buf)

    def next(self) -> Any:
        """The next whole reply, or :data:`INCOMPLETE` (nothing consumed) until it has come."""
        buf, pos = self._buf, self._pos
        if pos >= len(buf):
            return INCOMPLETE
        if buf[pos] == 58:  # b":" an integer: the answer of most hot-path scripts
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                return INCOMPLETE
            self._pos = eol + 2
            return int(buf[pos + 1 : eol])
        try:
            value, self._pos = _parse(buf, pos, self._conn)
        except _Short:
            return INCOMPLETE
        return value


def _parse(buf: bytes, pos: int, conn: Any) -> tuple[Any, int]:
    """The reply starting at ``pos`` and the offset after it (raises ``_Short`` if cut off)."""
    eol = buf.find(b"\r\n", pos)
    if eol < 0:
        raise _Short
    kind, body, after = buf[pos], buf[pos + 1 : eol], eol + 2
    if kind in (58, 40):  # b":" b"("
        return int(body), after
    if kind == 36:  # b"$"
        size = int(body)
        if size < 0:  # RESP2's null
            return None, after
        return conn.encoder.decode(_take(buf, after, size)), after + size + 2
    if kind in (42, 126):  # b"*" b"~"
        size = int(body)
        if size < 0:
            return None, after
        items = []
        for _ in range(size):
            item, after = _parse(buf, after, conn)
            items.append(item)
        return items, after
    if kind == 43:  # b"+"
        return conn.encoder.decode(body), after
    if kind == 45:  # b"-"
        return error_reply(conn, body), after
    if kind == 95:  # b"_"
        return None, after
    if kind == 37:  # b"%"
        out = {}
        for _ in range(int(body)):
            key, after = _parse(buf, after, conn)
            out[key], after = _parse(buf, after, conn)
        return out, after
    if kind == 44:  # b","
        return float(body), after
    if kind == 35:  # b"#"
        return body == b"t", after
    if kind == 33:  # b"!"
        size = int(body)
        return error_reply(conn, _take(buf, after, size)), after + size + 2
    if kind == 61:  # b"="
        size = int(body)
        return conn.encoder.decode(_take(buf, after, size)[4:]), after + size + 2
    if kind == 62:  # b">" an out-of-band push (no handler here): skipped, the reply follows it
        for _ in range(int(body)):
            _, after = _parse(buf, after, conn)
        return _parse(buf, after, conn)
    raise InvalidResponse(f"Protocol Error: {buf[pos:after]!r}")


def _take(buf: bytes, start: int, size: int) -> bytes:
    """``size`` bytes at ``start``, which a CRLF must follow."""
    if len(buf) < start + size + 2:
        raise _Short
    return buf[start : start + size]


def error_reply(conn: Any, body: bytes) -> Any:
    """The exception redis-py makes of error reply ``body``: returned, or raised for the
    ``ConnectionError`` kinds (``LOADING`` and the like)."""
    error = conn._parser.parse_error(body.decode("utf-8", errors="replace"))
    if isinstance(error, RedisConnectionError):
        raise error
    return error
