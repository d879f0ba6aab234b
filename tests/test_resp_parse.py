"""The reply parser (chainrt.redis._resp_parse) gives the same replies for the same bytes fed
straight in (the pipe) or read from a stream (chainrt.redis._resp.read_replies, a bare
connection), however they are cut into chunks. tests/test_redis_lean.py checks them against
redis-py's own parsers on a real server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio import Connection
from redis.exceptions import BusyLoadingError, InvalidResponse, NoScriptError, ResponseError

from chainrt.redis._resp import read_replies
from chainrt.redis._resp_parse import INCOMPLETE, ReplyParser

REPLIES = [
    b":42\r\n",
    b":-7\r\n",
    b"$5\r\nhello\r\n",
    b"$0\r\n\r\n",
    b"$-1\r\n",
    b"+OK\r\n",
    b"*-1\r\n",
    b"*0\r\n",
    b"*3\r\n:1\r\n$3\r\nabc\r\n*2\r\n+x\r\n$-1\r\n",
    b"$12\r\nline\r\nbreaks\r\n",  # a CRLF inside a bulk string is data
    b"-ERR wrong number of arguments\r\n",
    b"-NOSCRIPT No matching script. Please use EVAL.\r\n",
    b"%2\r\n+a\r\n:1\r\n+b\r\n*1\r\n:2\r\n",  # RESP3 map
    b"~2\r\n:1\r\n:2\r\n",  # RESP3 set
    b",3.5\r\n",
    b"#t\r\n",
    b"#f\r\n",
    b"_\r\n",
    b"(12345678901234567890\r\n",
    b"=8\r\ntxt:some\r\n",
    b"!9\r\nERR blobs\r\n",
    b">2\r\n+message\r\n+hi\r\n:5\r\n",  # a push, skipped: the reply after it is the answer
]


def _conn(decode: bool) -> Connection:
    return Connection(decode_responses=decode)


async def _awaited(conn: Connection, data: bytes, count: int) -> list[Any]:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    conn._reader = reader
    return await read_replies(conn, count)


def _parsed(conn: Connection, chunks: list[bytes]) -> list[Any]:
    parser, out = ReplyParser(conn), []
    for chunk in chunks:
        parser.feed(chunk)
        while (reply := parser.next()) is not INCOMPLETE:
            out.append(reply)
    return out


def _same(a: list[Any], b: list[Any]) -> bool:
    """Equal, with exceptions compared by type and message."""
    norm = [
        [(type(x), str(x)) if isinstance(x, BaseException) else x for x in side] for side in (a, b)
    ]
    return norm[0] == norm[1]


@pytest.mark.parametrize("decode", [False, True])
async def test_every_kind_of_reply_reads_as_the_awaited_reader_reads_it(decode: bool) -> None:
    data = b"".join(REPLIES)
    expected = await _awaited(_conn(decode), data, len(REPLIES))
    whole = _parsed(_conn(decode), [data])
    byte_by_byte = _parsed(_conn(decode), [data[i : i + 1] for i in range(len(data))])
    in_sevens = _parsed(_conn(decode), [data[i : i + 7] for i in range(0, len(data), 7)])
    assert _same(whole, expected)
    assert _same(byte_by_byte, expected)
    assert _same(in_sevens, expected)
    assert isinstance(whole[11], NoScriptError)
    assert isinstance(whole[10], ResponseError)
    assert whole[-1] == 5


def test_a_reply_cut_short_waits_for_the_rest() -> None:
    parser = ReplyParser(_conn(False))
    parser.feed(b":1\r\n$9\r\nhalf")
    assert parser.next() == 1
    assert parser.next() is INCOMPLETE
    assert parser.next() is INCOMPLETE  # nothing consumed meanwhile
    parser.feed(b"-done\r\n:2")
    assert parser.next() == b"half-done"
    assert parser.next() is INCOMPLETE
    parser.feed(b"\r\n")
    assert parser.next() == 2
    assert parser.next() is INCOMPLETE


def test_a_loading_reply_raises_as_redis_py_does() -> None:
    parser = ReplyParser(_conn(False))
    parser.feed(b"-LOADING Redis is loading the dataset in memory\r\n")
    with pytest.raises(BusyLoadingError):
        parser.next()


def test_bytes_that_are_not_resp_are_a_protocol_error() -> None:
    parser = ReplyParser(_conn(False))
    parser.feed(b"?what\r\n")
    with pytest.raises(InvalidResponse, match="Protocol Error"):
        parser.next()
