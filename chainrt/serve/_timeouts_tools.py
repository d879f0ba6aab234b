"""The deadlines of :mod:`._timeouts` on uvicorn's httptools protocol (llhttp, in C): the same
rules, told by the parser's callbacks instead of h11's states.

A connection is in one of four phases: waiting for a request (no byte of it yet), in its head
(request line and headers arriving), in its body, or answered-to (the request is whole and the
app answers it). The header deadline runs from the connection's opening, or from the first byte
of a next request, until the head is whole; the body deadline from then until the body is.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ._accept import ConnectionGate
from ._timeouts import TIMED_OUT_BODY, Deadlines

__all__ = ["tools_protocol"]

_IDLE, _HEAD, _BODY, _WHOLE = range(4)

_TIMED_OUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n" % len(TIMED_OUT_BODY)
) + TIMED_OUT_BODY


class _ToolsDeadlines(Deadlines, HttpToolsProtocol):
    _phase = _IDLE

    def data_received(self, data: bytes) -> None:
        if self._lingering is not None:
            return  # answered 408: what the client still sends is dropped
        if self._deadline is None and self._phase == _IDLE:
            self._arm()  # the first bytes of a next request on a kept-alive connection
        super().data_received(data)

    # The parser's callbacks (called from ``data_received``).

    def on_message_begin(self) -> None:
        self._phase = _HEAD
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._phase = _BODY
        self._disarm()  # the request line and headers are in
        super().on_headers_complete()
        if self._phase == _BODY:
            self._start_body_deadline()

    def on_message_complete(self) -> None:
        self._phase = _WHOLE
        self._disarm_body()  # the body is in (or there was none)
        super().on_message_complete()

    def on_response_complete(self) -> None:
        if self._phase == _WHOLE:
            self._phase = _IDLE  # a next request may come on this connection
        super().on_response_complete()

    def in_head(self) -> bool:
        return self._phase in (_IDLE, _HEAD)

    def in_body(self) -> bool:
        return self._phase == _BODY

    def write_timed_out(self) -> None:
        self.transport.write(_TIMED_OUT)


def tools_protocol(
    header_timeout_s: float, body_timeout_s: float, gate: ConnectionGate | None = None
) -> type[Any]:
    """uvicorn's httptools protocol class with the deadlines of :mod:`._timeouts`."""
    return type(
        "DeadlinesHttpToolsProtocol",
        (_ToolsDeadlines,),
        {"header_timeout_s": header_timeout_s, "body_timeout_s": body_timeout_s, "gate": gate},
    )
