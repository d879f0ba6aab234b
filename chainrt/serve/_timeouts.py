"""Slow clients are dropped: uvicorn's HTTP/1.1 protocol with a deadline for each request's
headers and another for its body.

uvicorn closes a keep-alive connection idle after a response (``timeout_keep_alive``, our
``--idle-timeout``), but it waits forever for a connection that sends nothing, that sends its
request line and headers a byte at a time, or that announces a body and trickles it: a thousand
such connections hold a thousand descriptors. Here:

- a connection gets ``--header-timeout`` from the moment it opens, or from the first byte of
  each next request, to deliver that request's headers whole; past it, it is closed;
- a request whose headers are in gets ``--body-timeout`` to deliver its body whole; past it, it
  is answered ``408`` (unless its answer has started) and the connection is closed. After a
  ``408`` the close lingers (:data:`LINGER_S`): the server stops writing (FIN) and reads and
  drops what the client still sends, so the ``408`` reaches a client that is still sending.
  A socket closed with unread bytes in it is reset at once, and the reset can overtake the
  ``408`` still in the send queue: CI saw a trickling client get no answer at all.

The protocol also tells the connection cap (:class:`~chainrt.serve._accept.ConnectionGate`)
when a connection closes.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from ._accept import ConnectionGate

__all__ = ["LINGER_S", "TIMED_OUT_BODY", "Deadlines", "connection_protocol"]

LINGER_S = 1.0
"""How long a connection answered ``408`` is read and drained before it is closed."""

TIMED_OUT_BODY = json.dumps(
    {
        "error": {
            "type": "request_timeout",
            "message": "the request body did not arrive in time (chainrt serve --body-timeout)",
        }
    }
).encode()
"""The body of the ``408`` answer."""


class Deadlines:
    """The deadlines of a connection, on top of one of uvicorn's HTTP/1.1 protocols (put it
    first among the bases). The protocol-specific part says where the request is
    (:meth:`in_head`, :meth:`in_body`) and writes the ``408`` (:meth:`write_timed_out`); it
    calls :meth:`_arm` when a next request's first bytes come, :meth:`_disarm` once the head is
    in, :meth:`_start_body_deadline` then, :meth:`_disarm_body` once the body is in."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    gate: ConnectionGate | None = None
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    cycle: Any
    _deadline: asyncio.TimerHandle | None = None
    _body_deadline: asyncio.TimerHandle | None = None
    _lingering: asyncio.TimerHandle | None = None

    def in_head(self) -> bool:
        """No request yet, or its head not whole: the header deadline applies."""
        raise NotImplementedError

    def in_body(self) -> bool:
        """The head is in, the body not whole: the body deadline applies."""
        raise NotImplementedError

    def write_timed_out(self) -> None:
        """Write the whole ``408`` answer (:data:`TIMED_OUT_BODY`)."""
        raise NotImplementedError

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._arm()

    def eof_received(self) -> None:
        if self._lingering is not None:
            self._linger_done()  # the client is done sending: close now
            return
        super().eof_received()  # type: ignore[misc]

    def connection_lost(self, exc: Exception | None) -> None:
        if self._lingering is not None:
            self._lingering.cancel()
            self._lingering = None
        self._disarm()
        self._disarm_body()
        super().connection_lost(exc)  # type: ignore[misc]
        if self.gate is not None:
            self.gate.wake()

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.header_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _start_body_deadline(self) -> None:
        if self._body_deadline is None:
            self._body_deadline = self.loop.call_later(self.body_timeout_s, self._body_late)

    def _disarm_body(self) -> None:
        if self._body_deadline is not None:
            self._body_deadline.cancel()
            self._body_deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.in_head() and not self.transport.is_closing():
            self.transport.close()

    def _body_late(self) -> None:
        self._body_deadline = None
        if not self.in_body() or self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_started and not cycle.disconnected:
            self.write_timed_out()
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


class _Deadlines(Deadlines, H11Protocol):
    def data_received(self, data: bytes) -> None:
        if self._lingering is not None:
            return  # answered 408: what the client still sends is dropped
        if self._deadline is None and self.conn.their_state is h11.IDLE:
            self._arm()  # the first bytes of a next request on a kept-alive connection
        super().data_received(data)
        state = self.conn.their_state
        if state is not h11.IDLE:
            self._disarm()  # the request line and headers are in
        if state is h11.SEND_BODY:
            self._start_body_deadline()
        else:
            self._disarm_body()  # the body is in (or there was none)

    def in_head(self) -> bool:
        return bool(self.conn.their_state is h11.IDLE)

    def in_body(self) -> bool:
        return bool(self.conn.their_state is h11.SEND_BODY)

    def write_timed_out(self) -> None:
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(TIMED_OUT_BODY)),
            (b"connection", b"close"),
        ]
        try:
            out = self.conn.send(h11.Response(status_code=408, headers=headers))
            out = (out or b"") + (self.conn.send(h11.Data(data=TIMED_OUT_BODY)) or b"")
            out += self.conn.send(h11.EndOfMessage()) or b""
            self.transport.write(out)
        except h11.LocalProtocolError:
            pass


def connection_protocol(
    header_timeout_s: float, body_timeout_s: float, gate: ConnectionGate | None = None
) -> type[Any]:
    """uvicorn's h11 protocol class with ``header_timeout_s`` and ``body_timeout_s`` deadlines
    for each request (pass it as ``uvicorn.Config(http=...)``), telling ``gate`` when a
    connection closes. (:func:`chainrt.serve._timeouts_tools.tools_protocol` is the same on
    httptools.)"""
    return type(
        "DeadlinesH11Protocol",
        (_Deadlines,),
        {"header_timeout_s": header_timeout_s, "body_timeout_s": body_timeout_s, "gate": gate},
    )
