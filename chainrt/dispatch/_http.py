"""A model served by HTTP endpoints: chainrt workers or any OpenAI-compatible server (docs/dispatch.md).

One :class:`HttpBackend` per pool model. Each attempt picks an endpoint (:mod:`._choice` over the
states in :mod:`._endpoints`), passes its breakers, and POSTs ``/v1/chat/completions`` through
the pool's one shared client with:

* the headers of :mod:`chainrt.wire`: ``X-Chainrt-Deadline`` — the attempt's end in unix ms (a
  chainrt worker stops generating then); ``X-Priority`` — the step's priority; ``traceparent`` —
  the ``llm.dispatch`` span's context;
* a client timeout equal to the time left, so a server that accepts and never answers costs this
  attempt and nothing more.

The time left is measured only once the client is in hand (the client itself is built before a
run's budget clock, see :mod:`._client`). An attempt that is cancelled after its end — the
dispatcher's guard cutting one that overran — is recorded against the endpoint as the
``timeout`` it was; one cancelled before its end (the step was cancelled) gets no verdict.

Every failure becomes a :class:`BackendError` whose ``error_class`` is one of the breaker
classes — ``connect`` (refused, dropped), ``timeout``, ``5xx``, ``oom`` (503), ``overloaded``
(429; a worker's ``insufficient_memory`` refusal is an :class:`~chainrt.errors.InsufficientMemory`
with its ``max_tokens`` advice) — or ``bad_request`` (4xx: the request itself is
wrong, retrying cannot help), ``unavailable`` (no endpoint may be tried now; an endpoint whose
key variable is unset is never tried) or ``auth`` (401/403: the endpoint refused its key).

A hosted endpoint (:mod:`._credentials`) adds its API key (from the environment variable the
pool names), its fixed headers, its route and query to each request, and the pool model's
request options (``max_tokens_field``, extra ``body`` fields) shape the body. Usage (prompt,
completion and cached tokens) is read from the answer's ``usage``; with a ``price`` the answer
carries its cost (:mod:`._usage`).

What goes on the wire and what came back (the body, the streamed reading, the answer, the error a
failure means) is :mod:`._http_wire`'s; the pool's shared client, endpoint table and health
poller are :class:`~._resources.PoolResources`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

import httpx

from ..errors import BackendError
from ..wire import request_headers
from ._backend import BackendAnswer, ModelBackend, TextSink
from ._choice import choose
from ._credentials import Access
from ._endpoints import Ticket
from ._http_wire import (
    endpoint_error,
    error_from_response,
    read_answer,
    request_body,
    short,
    stream_answer,
)
from ._resources import PoolResources
from ._types import LlmCall
from ._usage import Price, priced

__all__ = ["HttpBackend"]


class HttpBackend(ModelBackend):
    """One pool model and its endpoints ((url, capacity) pairs)."""

    def __init__(
        self,
        model: str,
        served_model: str,
        endpoints: Sequence[tuple[str, float]],
        *,
        resources: PoolResources,
        rng: Callable[[], float] = random.random,
        context_window: int | None = None,
        low_confidence_below: float | None = None,
        access: Mapping[str, Access] | None = None,
        request: Mapping[str, Any] | None = None,
        price: Price | None = None,
    ) -> None:
        self.model = model
        self.served_model = served_model
        self.endpoints = list(endpoints)
        self.resources = resources
        self._rng = rng
        self._access = {url: (access or {}).get(url) or Access() for url, _ in self.endpoints}
        self._bases = {url: resources.register(url, self._access[url]) for url, _ in self.endpoints}
        self._request = dict(request or {})
        """The pool model's request options (``max_tokens_field``, ``body``, ``stream_usage``)."""
        self.price = price
        self._context_window = context_window
        self._low_confidence_below = low_confidence_below

    def context_window(self) -> int | None:
        """The pool file's ``context_window`` for this model (None: not given)."""
        return self._context_window

    def available(self) -> bool:
        return self.usable_elsewhere(frozenset())

    def usable_elsewhere(self, avoid: frozenset[str]) -> bool:
        return self.usable_count(avoid) > 0

    def usable_count(self, avoid: frozenset[str]) -> int:
        table = self.resources.table
        now = time.monotonic()
        return sum(
            url not in avoid and table.why_unusable(table.state(url), now) is None
            for url, _ in self.endpoints
        )

    def least_in_flight(self, avoid: frozenset[str]) -> int | None:
        counts = self._in_flight(avoid)
        return min(counts) if counts else None

    def busiest_in_flight(self, avoid: frozenset[str]) -> int:
        return max(self._in_flight(avoid), default=0)

    def _in_flight(self, avoid: frozenset[str]) -> list[int]:
        """Requests in flight on each usable endpoint outside ``avoid``."""
        table = self.resources.table
        now = time.monotonic()
        return [
            table.state(url).in_flight
            for url, _ in self.endpoints
            if url not in avoid and table.why_unusable(table.state(url), now) is None
        ]

    def places(self) -> int:
        return len(self.endpoints)

    def why_unavailable(self) -> str:
        """Why no endpoint can be tried now, one reason per endpoint."""
        table = self.resources.table
        now = time.monotonic()
        return "; ".join(
            f"{url}: {table.why_unusable(table.state(url), now) or 'usable'}"
            for url, _ in self.endpoints
        )

    async def complete(
        self,
        call: LlmCall,
        model: str,
        max_tokens: int,
        deadline: float,
        *,
        avoid: frozenset[str] = frozenset(),
        on_text: TextSink | None = None,
    ) -> BackendAnswer:
        self.resources.start()
        ticket = self._pick(avoid, call.not_endpoint)
        url = ticket.endpoint.url
        table = self.resources.table
        finished = False
        started = time.monotonic()
        deadline, capped = _trial_deadline(call, ticket, deadline)
        try:
            if call.on_endpoint is not None:
                call.on_endpoint(url)
            try:
                answer = await self._post(call, url, max_tokens, deadline, on_text)
            except BackendError as exc:
                if exc.error_class == "timeout" and capped:
                    # The trial had the model's usual time (its p90): the endpoint still does
                    # not answer, which is the verdict the trial was for.
                    table.finish(ticket, error_class="timeout", now=time.monotonic())
                    finished = True
                    raise endpoint_error(
                        f"{exc.message} (the trial of an endpoint whose circuit was open, cut "
                        "at the model's p90)",
                        "timeout",
                        url,
                    ) from None
                if exc.error_class == "timeout" and not _judged(call, started):
                    table.abandon(ticket)
                    finished = True
                    raise
                # A 429 with max_tokens advice refused this request's size, not the endpoint:
                # a smaller request may go at once, so its Retry-After holds this request only.
                endpoint_wait = None if exc.advice_max_tokens is not None else exc.retry_after_s
                table.finish(
                    ticket,
                    error_class=exc.error_class,
                    now=time.monotonic(),
                    retry_after_s=endpoint_wait,
                )
                finished = True
                raise
            table.finish(ticket, error_class=self._verdict(call, answer), now=time.monotonic())
            finished = True
            return answer
        finally:
            if not finished:
                if time.time() >= deadline and (capped or _judged(call, started)):
                    # Cut after its end (the dispatcher's guard): the endpoint did not answer
                    # in time, which is what the timeout breaker counts.
                    table.finish(ticket, error_class="timeout", now=time.monotonic())
                else:  # cancelled with time left (the step was cancelled): no verdict
                    table.abandon(ticket)

    async def prepare(self) -> None:
        """Build the shared client and start health polling before a run's budget clock."""
        self.resources.start()

    async def close(self) -> None:
        """Stop the pool's health polling and close its client (shared: the first close does it)."""
        await self.resources.close()

    def _verdict(self, call: LlmCall, answer: BackendAnswer) -> str | None:
        """The breaker's view of an answer: ``low_confidence`` when it scored below the
        threshold (the step's, else this model's), else None (a plain answer)."""
        below = call.low_confidence_below
        if below is None:
            below = self._low_confidence_below
        if below is None or answer.confidence is None or answer.confidence >= below:
            return None
        return "low_confidence"

    def _pick(self, avoid: frozenset[str], never: str | None = None) -> Ticket:
        """Choose and admit an endpoint; ``never``: one that must not be chosen (a hedge's
        first attempt is there)."""
        table = self.resources.table
        now = time.monotonic()
        candidates = table.candidates(self.endpoints, now, avoid)
        if never is not None:
            candidates = [
                dataclasses.replace(c, usable=False) if c.key == never else c for c in candidates
            ]
        index = choose(candidates, self._rng())
        ticket = None if index is None else table.admit(table.state(candidates[index].key), now)
        if ticket is None:
            raise BackendError(
                f"no endpoint of {self.model!r} can take a request now ({self.why_unavailable()})",
                error_class="unavailable",
                retryable=False,
            )
        return ticket

    async def _post(
        self,
        call: LlmCall,
        url: str,
        max_tokens: int,
        deadline: float,
        on_text: TextSink | None = None,
    ) -> BackendAnswer:
        client = self.resources.clients.get()
        left = deadline - time.time()
        if left <= 0:
            raise BackendError("no time left for the request", error_class="timeout", endpoint=url)
        # call.traceparent is set by tracing inside the attempt's llm.dispatch span: the
        # worker's span is its child.
        access = self._access[url]
        headers = request_headers(
            deadline_s=deadline,
            priority=call.priority,
            traceparent=call.traceparent,
            request_id=f"{call.run_id}:{call.step_id}" if call.run_id else None,
        )
        headers.update(access.auth.request_headers())
        timeout = httpx.Timeout(left, connect=min(left, self.resources.connect_timeout_s))
        target = self._bases[url] + access.chat_path
        if access.query:
            target += "?" + urlencode(access.query)
        body = request_body(
            call, self.served_model, max_tokens, stream=on_text is not None, options=self._request
        )
        try:
            # httpx times connect, write and read apart; this bounds the whole exchange, so the
            # attempt ends at its deadline with a verdict on the endpoint.
            async with asyncio.timeout(left):
                if on_text is not None:
                    got = await stream_answer(
                        client, target, body, headers, timeout, url, on_text, access.auth
                    )
                    return priced(got, self.price)
                response = await client.post(target, content=body, headers=headers, timeout=timeout)
        except TimeoutError:
            raise endpoint_error(f"no answer within {left * 1000:.0f}ms", "timeout", url) from None
        except httpx.TimeoutException as exc:
            if isinstance(exc, httpx.ConnectTimeout):
                raise endpoint_error(
                    f"connecting took over {timeout.connect or 0:.2f}s", "connect", url
                ) from None
            raise endpoint_error(f"no answer within {left * 1000:.0f}ms", "timeout", url) from None
        except httpx.ConnectError as exc:
            raise endpoint_error(f"cannot connect: {short(exc)}", "connect", url) from None
        except httpx.HTTPError as exc:
            raise endpoint_error(
                f"connection dropped: {type(exc).__name__}: {short(exc)}", "connect", url
            ) from None
        if response.status_code != 200:
            raise error_from_response(
                response.status_code, response.headers, response.content, url, auth=access.auth
            )
        return priced(read_answer(response.content, url), self.price)


def _trial_deadline(call: LlmCall, ticket: Ticket, deadline: float) -> tuple[float, bool]:
    """The attempt's end on the endpoint it was let through to, and whether it was capped:
    the trial of a half-open ``timeout`` breaker ends after ``call.trial_s`` when that comes
    first (the trials of other classes ask whether the endpoint answers without an error, which
    a cut would not tell)."""
    if "timeout" not in ticket.trials or call.trial_s is None:
        return deadline, False
    cap = time.time() + call.trial_s
    return (cap, True) if cap < deadline else (deadline, False)


def _judged(call: LlmCall, started: float) -> bool:
    """Whether a timed-out attempt ran long enough for its timeout to count against the endpoint
    (an attempt cut early to keep a fallback's reserve says nothing about a busy, healthy one)."""
    return time.monotonic() - started >= call.judged_after_s
