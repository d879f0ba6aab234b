"""A model served by HTTP endpoints: chainrt workers or any OpenAI-compatible server (DESIGN §7).

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
wrong, retrying cannot help) or ``unavailable`` (no endpoint may be tried now).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import email.utils
import json
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx

from ..errors import BackendError, InsufficientMemory
from ..wire import INSUFFICIENT_MEMORY, breaker_class, parse_error_body, request_headers
from ._backend import BackendAnswer, ModelBackend, TextSink
from ._breaker import BreakerPolicy
from ._choice import choose
from ._client import ClientPool, ssl_context
from ._endpoints import EndpointTable, Ticket
from ._health import HealthPoller
from ._hops import extensions
from ._sse import ChunkReader
from ._types import LlmCall

__all__ = ["HttpBackend", "PoolResources", "error_from_response", "parse_retry_after"]

CHAT_PATH = "/v1/chat/completions"
_MAX_RETRY_AFTER_S = 3600.0
_DETAIL_CHARS = 200
_DRAIN_S = 0.05
"""Longest wait for a streamed body to end after its ``[DONE]``."""


class PoolResources:
    """What the backends of one pool share: the client, the endpoint table, the health poller."""

    def __init__(
        self,
        policies: Mapping[str, BreakerPolicy],
        *,
        health_interval_s: float | None = 1.0,
        health_timeout_s: float = 0.5,
        connect_timeout_s: float = 1.0,
    ) -> None:
        ssl_context()  # built here, at set-up, so that no request's deadline pays for it
        self.clients = ClientPool()
        self.table = EndpointTable(policies, unready_on_connect_error=health_interval_s is not None)
        self.health = (
            None
            if health_interval_s is None
            else HealthPoller(
                self.table, self.clients, interval_s=health_interval_s, timeout_s=health_timeout_s
            )
        )
        self.connect_timeout_s = connect_timeout_s

    def register(self, url: str) -> str:
        """Make ``url`` reachable (and polled); returns the HTTP base to send requests to."""
        base = self.clients.register(url)
        if self.health is not None:
            self.health.watch(url, base)
        return base

    def start(self) -> None:
        """Start health polling in the running loop (idempotent, cheap)."""
        self.clients.get()
        if self.health is not None:
            self.health.ensure_running()

    async def close(self) -> None:
        """Stop polling and close the client (idempotent)."""
        if self.health is not None:
            await self.health.close()
        await self.clients.close()


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
    ) -> None:
        self.model = model
        self.served_model = served_model
        self.endpoints = list(endpoints)
        self.resources = resources
        self._rng = rng
        self._bases = {url: resources.register(url) for url, _ in self.endpoints}
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
        table = self.resources.table
        now = time.monotonic()
        counts = [
            table.state(url).in_flight
            for url, _ in self.endpoints
            if url not in avoid and table.why_unusable(table.state(url), now) is None
        ]
        return min(counts) if counts else None

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
                    raise _error(
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
        headers = request_headers(
            deadline_s=deadline,
            priority=call.priority,
            traceparent=call.traceparent,
            request_id=f"{call.run_id}:{call.step_id}" if call.run_id else None,
        )
        timeout = httpx.Timeout(left, connect=min(left, self.resources.connect_timeout_s))
        target = self._bases[url] + CHAT_PATH
        body = _body(call, self.served_model, max_tokens, stream=on_text is not None)
        try:
            # httpx times connect, write and read apart; this bounds the whole exchange, so the
            # attempt ends at its deadline with a verdict on the endpoint.
            async with asyncio.timeout(left):
                if on_text is not None:
                    return await _stream(client, target, body, headers, timeout, url, on_text)
                response = await client.post(target, content=body, headers=headers, timeout=timeout)
        except TimeoutError:
            raise _error(f"no answer within {left * 1000:.0f}ms", "timeout", url) from None
        except httpx.TimeoutException as exc:
            if isinstance(exc, httpx.ConnectTimeout):
                raise _error(
                    f"connecting took over {timeout.connect or 0:.2f}s", "connect", url
                ) from None
            raise _error(f"no answer within {left * 1000:.0f}ms", "timeout", url) from None
        except httpx.ConnectError as exc:
            raise _error(f"cannot connect: {_short(exc)}", "connect", url) from None
        except httpx.HTTPError as exc:
            raise _error(
                f"connection dropped: {type(exc).__name__}: {_short(exc)}", "connect", url
            ) from None
        if response.status_code != 200:
            raise error_from_response(response.status_code, response.headers, response.content, url)
        return _answer(response.content, url)


async def _stream(
    client: httpx.AsyncClient,
    target: str,
    body: bytes,
    headers: dict[str, str],
    limits: httpx.Timeout,
    url: str,
    on_text: TextSink,
) -> BackendAnswer:
    """POST a streamed request and hand each piece of text to ``on_text`` as it arrives.

    Leaving early (the deadline, a cancelled step, a hedge that lost) closes the connection,
    which stops a chainrt worker's generation at its next token.
    """
    async with client.stream(
        "POST", target, content=body, headers=headers, timeout=limits
    ) as response:
        if response.status_code != 200:
            content = await response.aread()
            raise error_from_response(response.status_code, response.headers, content, url)
        reader = ChunkReader(url)
        lines = response.aiter_lines()
        async for line in lines:
            text = reader.feed(line)
            if text is not None:
                on_text(text)
            if reader.done:
                break
        if reader.done:
            # The body ends right after [DONE]: reading it to its end keeps the connection in
            # the pool (an unread body closes it, and the next request pays a new connection
            # before its first token). A server that does not end it soon is not waited for.
            with contextlib.suppress(httpx.HTTPError, TimeoutError):
                async with asyncio.timeout(_DRAIN_S):
                    async for _ in lines:
                        pass
        return reader.answer()


def _body(call: LlmCall, served_model: str, max_tokens: int, *, stream: bool = False) -> bytes:
    payload: dict[str, Any] = {
        "model": served_model,
        "messages": [{"role": role, "content": content} for role, content in call.messages],
        "max_tokens": max_tokens,
        "temperature": call.temperature,
    }
    if stream:
        payload["stream"] = True
        payload["stream_options"] = {"include_usage": True}
    if call.stop:
        payload["stop"] = call.stop
    if call.json_schema is not None:
        payload["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": call.json_schema},
        }
    elif call.json_output:
        payload["response_format"] = {"type": "json_object"}
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:_DETAIL_CHARS]


def _error(message: str, error_class: str, url: str, *, retryable: bool = True) -> BackendError:
    return BackendError(message, error_class=error_class, retryable=retryable, endpoint=url)


def _answer(content: bytes, url: str) -> BackendAnswer:
    """The answer in an OpenAI chat.completion body; a malformed body is the server's fault."""
    try:
        data = json.loads(content)
        choice = data["choices"][0]
        text = choice["message"].get("content") or ""
        finish = choice.get("finish_reason") or "stop"
        usage = data.get("usage") or {}
        prompt_tokens = int(usage.get("prompt_tokens") or 0)
        completion_tokens = int(usage.get("completion_tokens") or 0)
        if not isinstance(text, str) or not isinstance(finish, str):
            raise TypeError("content and finish_reason must be strings")
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        raise _error(
            f"malformed chat completion from the server: {_short(exc)}", "5xx", url
        ) from None
    return BackendAnswer(
        text, finish, prompt_tokens, completion_tokens, endpoint=url, **extensions(data)
    )


def parse_retry_after(value: str | None) -> float | None:
    """``Retry-After`` (seconds or an HTTP date) as seconds from now; None when absent or bad."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - time.time()
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), _MAX_RETRY_AFTER_S)


def error_from_response(
    status: int, headers: Mapping[str, str], body: bytes, url: str
) -> BackendError:
    """The :class:`BackendError` a non-200 answer means (pure: no I/O).

    The error class follows the status (:func:`chainrt.wire.breaker_class`); a worker's
    ``insufficient_memory`` refusal is an :class:`~chainrt.errors.InsufficientMemory` carrying
    its advice.
    """
    error = parse_error_body(body)
    what = (
        f"HTTP {status}"
        + (f" {error.kind}" if error.kind else "")
        + (f": {error.message}" if error.message else "")
    )
    retry_after = parse_retry_after(headers.get("retry-after"))
    error_class = breaker_class(status)
    if status == 429:
        wait = error.advice_retry_after_s if error.advice_retry_after_s is not None else retry_after
        if error.kind == INSUFFICIENT_MEMORY:
            return InsufficientMemory(
                what, advice_max_tokens=error.advice_max_tokens, retry_after_s=wait, endpoint=url
            )
        return BackendError(
            what,
            error_class=error_class,
            retry_after_s=wait,
            endpoint=url,
            advice_max_tokens=error.advice_max_tokens,
        )
    if error_class == "bad_request":
        return BackendError(what, error_class=error_class, retryable=False, endpoint=url)
    if error_class == "timeout":
        return BackendError(what, error_class=error_class, endpoint=url)
    return BackendError(what, error_class=error_class, retry_after_s=retry_after, endpoint=url)


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
