"""The deadlines of :mod:`._timeouts` on uvicorn's httptools protocol (llhttp, in C): the same
rules, told by the parser's callbacks instead of h11's states.

A connection is in one of four phases: waiting for a request (no byte of it yet), in its head
(request line and headers arriving), in its body, or answered-to (the request is whole and the
app answers it). The header deadline runs from the connection's opening, or from the first byte
of a next request, until the head is whole; the body deadline from then until the body is.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ._accept import ConnectionGate
from ._timeouts import LINGER_S, TIMED_OUT_BODY

__all__ = ["tools_protocol"]

_IDLE, _HEAD, _BODY, _WHOLE = range(4)

_TIMED_OUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n" % len(TIMED_OUT_BODY)
) + TIMED_OUT_BODY


class _ToolsDeadlines(HttpToolsProtocol):
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    gate: ConnectionGate | None = None
    _phase = _IDLE
    _deadline: asyncio.TimerHandle | None = None
    _body_deadline: asyncio.TimerHandle | None = None
    _lingering: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

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
        if self._body_deadline is None and self._phase == _BODY:
            self._body_deadline = self.loop.call_later(self.body_timeout_s, self._body_late)

    def on_message_complete(self) -> None:
        self._phase = _WHOLE
        self._disarm_body()  # the body is in (or there was none)
        super().on_message_complete()

    def on_response_complete(self) -> None:
        if self._phase == _WHOLE:
            self._phase = _IDLE  # a next request may come on this connection
        super().on_response_complete()

    def eof_received(self) -> None:
        if self._lingering is not None:
            self._linger_done()  # the client is done sending: close now
            return
        super().eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._lingering is not None:
            self._lingering.cancel()
            self._lingering = None
        self._disarm()
        self._disarm_body()
        super().connection_lost(exc)
        if self.gate is not None:
            self.gate.wake()

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.header_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _disarm_body(self) -> None:
        if self._body_deadline is not None:
            self._body_deadline.cancel()
            self._body_deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self._phase in (_IDLE, _HEAD) and not self.transport.is_closing():
            self.transport.close()

    def _body_late(self) -> None:
        self._body_deadline = None
        if self._phase != _BODY or self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_started and not cycle.disconnected:
            self.transport.write(_TIMED_OUT)
            # The app waiting for the body hears a disconnect; what it answers goes nowhere.
            cycle.disconnected = True
            cycle.message_event.set()
            if self.gate is not None:
                self.gate.body_timeouts += 1
            if self.transport.can_write_eof():
                self.transport.write_eof()  # the 408, then FIN; reading goes on, dropped
                self.transport.resume_reading()
                self._lingering = self.loop.call_later(LINGER_S, self._linger_done)
                return
        self.transport.close()

    def _linger_done(self) -> None:
        if self._lingering is not None:
            self._lingering.cancel()
            self._lingering = None
        if not self.transport.is_closing():
            self.transport.close()


def tools_protocol(
    header_timeout_s: float, body_timeout_s: float, gate: ConnectionGate | None = None
) -> type[Any]:
    """uvicorn's httptools protocol class with the deadlines of :mod:`._timeouts`."""
    return type(
        "DeadlinesHttpToolsProtocol",
        (_ToolsDeadlines,),
        {"header_timeout_s": header_timeout_s, "body_timeout_s": body_timeout_s, "gate": gate},
    )
