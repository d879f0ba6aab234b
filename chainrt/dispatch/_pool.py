"""The worker-pool file (``--pool`` / ``CHAINRT_POOL``): model names → endpoints (docs/dispatch.md).

    models:
      primary:
        served_model: qwen3-8b          # the name sent to the server (default: the key)
        endpoints:
          - {url: "http://gpu-node-1:8000", capacity: 128000}
          - {url: "unix:///run/chainrt/w1.sock", capacity: 64000}
    health: {interval: 1s, timeout: 500ms}          # optional: /health/ready polling
    breakers:                                       # optional: per error class
      connect: {min_requests: 2, cooldown: 2s}
    connect_timeout: 1s                             # optional
    latency_window: 20                              # optional: answers kept per model for p50

A model may give ``context_window: 8192`` (tokens, prompt + answer): a request that cannot fit
skips it (or has its ``max_tokens`` cut, for a step with ``on_memory_pressure: shrink``).
A model may give ``low_confidence_below: 0.6``: its answers scored below that count against the
endpoint's ``low_confidence`` breaker (a step's ``verify.below`` takes precedence).

The file is read like a chain file (same safe YAML loader); every problem is one
:class:`~chainrt.SpecError` naming ``file:line: field``. ``local`` stays the in-process model
unless the file maps ``local`` to endpoints of its own.
"""

from __future__ import annotations

import os
import re
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, ValidationError, field_validator, model_validator

from .._errors import SpecError
from .._strict import Strict as _Strict
from ..spec._models import DurationMs
from ..spec._template import format_path
from ..spec._yaml import YamlDocument, parse_yaml, read_yaml
from ._backend import ModelBackend
from ._breaker import BREAKER_CLASSES, DEFAULT_POLICIES, BreakerPolicy
from ._credentials import Access, EndpointAuth, TlsOptions
from ._usage import Price

__all__ = [
    "BreakerConfig",
    "EndpointConfig",
    "HealthConfig",
    "ModelConfig",
    "PoolConfig",
    "load_pool_backends",
    "load_pool_config",
    "parse_pool_config",
    "pool_backends",
]

_RESERVED_MODELS = frozenset({"static"})
"""Names the attempt log uses for itself (the static answer)."""


_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,100}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,199}$")
_KEY_HEADERS = frozenset({"authorization", "api-key", "x-api-key", "proxy-authorization"})
"""Headers that carry secrets: their value comes from ``api_key_env``, never the file."""
_OWN_HEADERS = frozenset(
    {"content-type", "content-length", "host", "x-chainrt-deadline", "x-priority", "traceparent"}
)
_OWN_BODY = frozenset({"model", "messages", "stream", "stream_options", "max_tokens"})
"""Request fields chainrt writes itself (``max_tokens`` goes by ``max_tokens_field``)."""


class TlsConfig(_Strict):
    """Certificate options of an ``https://`` endpoint."""

    ca_file: str | None = Field(
        default=None, min_length=1, description="PEM bundle of the CAs to trust (a private CA)."
    )
    cert_file: str | None = Field(
        default=None, min_length=1, description="Client certificate (PEM) for mutual TLS."
    )
    key_file: str | None = Field(
        default=None, min_length=1, description="The client certificate's key (PEM)."
    )
    verify: bool = Field(
        default=True, description="false: do not check the server's certificate (tests only)."
    )

    def options(self) -> TlsOptions:
        """The dispatch-side form."""
        return TlsOptions(self.ca_file, self.cert_file, self.key_file, self.verify)


class EndpointConfig(_Strict):
    """One server of a model."""

    url: str = Field(description="http://host:port[/prefix], https://..., or unix:///path.sock")
    capacity: float = Field(
        default=1.0,
        gt=0,
        le=1e12,
        description="Relative size (e.g. KV-cache tokens); traffic is shared in proportion.",
    )
    api_key_env: str | None = Field(
        default=None,
        description="Environment variable holding the API key (read at each request; the key "
        "itself is never written to the pool file, a record or a log).",
    )
    api_key_header: str = Field(
        default="Authorization",
        description="Header the key goes in: Authorization (as 'Bearer KEY') or e.g. api-key.",
    )
    headers: dict[str, str] = Field(
        default_factory=dict, description="Fixed extra headers (not secrets: use api_key_env)."
    )
    tls: TlsConfig | None = Field(default=None, description="Certificate options (https only).")
    chat_path: str = Field(
        default="/v1/chat/completions",
        description="Path of the chat completions route, after the URL.",
    )
    query: dict[str, str] = Field(
        default_factory=dict, description="Query parameters of every request (api-version)."
    )
    health: bool | None = Field(
        default=None,
        description="Poll /health/ready (default: yes, unless the endpoint has api_key_env: "
        "hosted APIs have no health route; their breakers judge them).",
    )

    @field_validator("api_key_env")
    @classmethod
    def _check_env(cls, value: str | None) -> str | None:
        if value is not None and not _ENV_NAME.match(value):
            raise ValueError(
                f"api_key_env {value[:60]!r} must be the NAME of an environment variable "
                "(letters, digits, _), not the key itself"
            )
        return value

    @field_validator("api_key_header")
    @classmethod
    def _check_key_header(cls, value: str) -> str:
        if not _HEADER_NAME.match(value):
            raise ValueError(f"api_key_header {value[:60]!r} is not a valid header name")
        return value

    @field_validator("headers")
    @classmethod
    def _check_headers(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not _HEADER_NAME.match(name):
                raise ValueError(f"header name {name[:60]!r} is not valid")
            if name.lower() in _KEY_HEADERS:
                raise ValueError(
                    f"header {name!r} carries a secret: put the key in an environment variable "
                    "and name it with api_key_env (and api_key_header)"
                )
            if name.lower() in _OWN_HEADERS:
                raise ValueError(f"header {name!r} is set by chainrt itself")
            if any(c in text for c in "\r\n\0"):
                raise ValueError(f"header {name!r} has a line break in its value")
        return value

    @field_validator("chat_path")
    @classmethod
    def _check_path(cls, value: str) -> str:
        if not value.startswith("/") or "?" in value or "#" in value or " " in value:
            raise ValueError(f"chat_path {value!r} must be a path starting with / (no query)")
        return value

    @model_validator(mode="after")
    def _tls_needs_https(self) -> EndpointConfig:
        if self.tls is not None and not self.url.startswith("https://"):
            raise ValueError(f"tls is for https:// endpoints; {self.url!r} is not one")
        return self

    def auth(self) -> EndpointAuth:
        """The dispatch-side form of this endpoint's key and headers."""
        return EndpointAuth(self.api_key_env, self.api_key_header, dict(self.headers))

    def polled(self) -> bool:
        """Whether its /health/ready is polled."""
        return self.health if self.health is not None else self.api_key_env is None

    def same_access(self, other: EndpointConfig) -> bool:
        """Whether ``other`` (the same URL elsewhere in the pool) is reached the same way."""
        fields = ("api_key_env", "api_key_header", "headers", "tls", "chat_path", "query", "health")
        return all(getattr(self, f) == getattr(other, f) for f in fields)

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme in ("http", "https"):
            if not parts.hostname:
                raise ValueError(f"url {value!r} has no host; write http://host:port")
            try:
                parts.port  # noqa: B018 - raises ValueError on a bad port
            except ValueError:
                raise ValueError(f"url {value!r} has an invalid port") from None
            if parts.query or parts.fragment:
                raise ValueError(f"url {value!r} must not have a query or fragment")
            return value.rstrip("/")
        if parts.scheme == "unix":
            if parts.netloc or not parts.path.startswith("/"):
                raise ValueError(
                    f"url {value!r}: a Unix socket is written unix:///absolute/path.sock"
                )
            return value
        raise ValueError(f"url {value!r} must start with http://, https:// or unix:///")


class RequestConfig(_Strict):
    """What a hosted API needs in the request body beyond what chainrt sends."""

    max_tokens_field: Literal["max_tokens", "max_completion_tokens"] = Field(
        default="max_tokens",
        description="The body field the answer's length limit goes in (newer OpenAI models "
        "take only max_completion_tokens).",
    )
    body: dict[str, Any] = Field(
        default_factory=dict,
        description="Fields added to every request body (top_p, reasoning_effort, user...); "
        "null removes a field chainrt sends (temperature for a model that refuses it).",
    )
    stream_usage: bool = Field(
        default=True,
        description="Ask a streamed answer for its token usage (stream_options.include_usage).",
    )

    @field_validator("body")
    @classmethod
    def _check_body(cls, value: dict[str, Any]) -> dict[str, Any]:
        for name in value:
            if name in _OWN_BODY:
                raise ValueError(f"body field {name!r} is written by chainrt itself")
        return value


class PriceConfig(_Strict):
    """What a model's tokens cost, in the user's own unit per one million tokens."""

    prompt: float = Field(ge=0, le=1e9, description="Per 1M prompt (input) tokens.")
    completion: float = Field(ge=0, le=1e9, description="Per 1M completion (output) tokens.")
    cached: float | None = Field(
        default=None,
        ge=0,
        le=1e9,
        description="Per 1M cached prompt tokens (default: the prompt price).",
    )

    def prices(self) -> Price:
        """The dispatch-side form."""
        return Price(self.prompt, self.completion, self.cached)


class ModelConfig(_Strict):
    """A model name of the pool and the servers that serve it."""

    request: RequestConfig = Field(default_factory=RequestConfig)
    price: PriceConfig | None = Field(
        default=None, description="Cost per 1M tokens: gives each attempt's `cost`."
    )

    served_model: str | None = Field(
        default=None, min_length=1, description="Model name sent to the servers (default: key)."
    )
    endpoints: list[EndpointConfig] = Field(min_length=1, max_length=1000)
    context_window: int | None = Field(
        default=None,
        ge=1,
        le=100_000_000,
        description="Tokens the model's context holds (prompt + answer); a request that cannot "
        "fit skips this model, or has its max_tokens cut with on_memory_pressure: shrink.",
    )
    low_confidence_below: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="An answer whose confidence_score is below this counts as a low_confidence "
        "outcome for the endpoint's breaker (a step's verify.below takes precedence).",
    )

    @field_validator("endpoints")
    @classmethod
    def _unique(cls, value: list[EndpointConfig]) -> list[EndpointConfig]:
        seen: set[str] = set()
        for endpoint in value:
            if endpoint.url in seen:
                raise ValueError(f"endpoint {endpoint.url!r} is listed twice")
            seen.add(endpoint.url)
        return value


class HealthConfig(_Strict):
    """Background polling of every endpoint's ``/health/ready``."""

    enabled: bool = True
    interval: DurationMs = Field(default=1000.0, description="Time between two polls.")
    timeout: DurationMs = Field(default=500.0, description="A poll slower than this fails.")

    @field_validator("interval", "timeout")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("must be greater than zero")
        return value


class BreakerConfig(_Strict):
    """Override of one error class's breaker; unset fields keep the class default."""

    window: int | None = Field(default=None, ge=1, le=100_000)
    min_requests: int | None = Field(default=None, ge=1, le=100_000)
    failure_rate: float | None = Field(default=None, gt=0, le=1)
    cooldown: DurationMs | None = None
    trip_unproven: int | None = Field(default=None, ge=0, le=100_000)
    max_cooldown: DurationMs | None = None

    def policy(self, base: BreakerPolicy) -> BreakerPolicy:
        """The class default with this override applied (ValueError when inconsistent)."""
        cooldown_s = self.cooldown / 1000 if self.cooldown is not None else base.cooldown_s
        max_cooldown_s = base.max_cooldown_s
        if self.max_cooldown is not None:
            max_cooldown_s = self.max_cooldown / 1000
        elif max_cooldown_s is not None:
            max_cooldown_s = max(max_cooldown_s, cooldown_s)  # a longer cooldown stays valid
        return BreakerPolicy(
            window=self.window if self.window is not None else base.window,
            min_requests=self.min_requests if self.min_requests is not None else base.min_requests,
            failure_rate=self.failure_rate if self.failure_rate is not None else base.failure_rate,
            cooldown_s=cooldown_s,
            trip_unproven=self.trip_unproven
            if self.trip_unproven is not None
            else base.trip_unproven,
            max_cooldown_s=max_cooldown_s,
        )


BreakerClass = Literal["connect", "timeout", "5xx", "oom", "overloaded", "low_confidence", "auth"]


class PoolConfig(_Strict):
    """The whole pool file."""

    models: dict[str, ModelConfig] = Field(description="Model name (as chains write it) → servers.")
    health: HealthConfig = Field(default_factory=HealthConfig)
    breakers: dict[BreakerClass, BreakerConfig] = Field(default_factory=dict)
    connect_timeout: DurationMs = Field(
        default=1000.0, description="Longest wait for a TCP/Unix connection (capped by deadline)."
    )
    latency_window: int = Field(
        default=20, ge=1, le=10_000, description="Recent answers per model kept for the p50."
    )

    @field_validator("models")
    @classmethod
    def _names(cls, value: dict[str, ModelConfig]) -> dict[str, ModelConfig]:
        for name in value:
            if name in _RESERVED_MODELS:
                raise ValueError(f"{name!r} is reserved for the static answer; rename the model")
            if not name.strip() or len(name) > 200:
                raise ValueError(f"model name {name!r} must be 1-200 visible characters")
        # Endpoint state (breakers, readiness) is kept per URL: one URL is one server, reached
        # one way, whichever model sends to it.
        seen: dict[str, tuple[str, EndpointConfig]] = {}
        for name, model in value.items():
            for endpoint in model.endpoints:
                first = seen.setdefault(endpoint.url, (name, endpoint))
                if not first[1].same_access(endpoint):
                    raise ValueError(
                        f"endpoint {endpoint.url!r} of {name!r} has other api_key_env, headers, "
                        f"tls, chat_path, query or health than under {first[0]!r}; one URL must "
                        "be reached the same way by every model"
                    )
        return value

    def breaker_policies(self) -> dict[str, BreakerPolicy]:
        """Every breaker class's policy: defaults with this file's overrides."""
        return {
            name: (
                self.breakers[name].policy(DEFAULT_POLICIES[name])
                if name in self.breakers
                else DEFAULT_POLICIES[name]
            )
            for name in BREAKER_CLASSES
        }


def _problem(doc: YamlDocument, error: Any) -> tuple[int | None, str, str]:
    loc = tuple(error["loc"])
    # Dict-key validation errors end in "[key]"; pydantic adds it as an extra loc element.
    loc = tuple(part for part in loc if part != "[key]")
    kind = error["type"]
    if kind == "extra_forbidden":
        message = f"unknown key {str(loc[-1])!r}"
    elif kind == "missing":
        message = "required key is missing"
    else:
        message = str(error["msg"]).removeprefix("Value error, ")
    return doc.line(loc), format_path(loc), message


def parse_pool_config(source: str | bytes, *, file: str | None = None) -> PoolConfig:
    """Parse pool YAML text; :class:`SpecError` with ``file:line: field`` when it is invalid."""
    doc = parse_yaml(source, file=file)
    return _validate(doc, file)


def load_pool_config(path: str | os.PathLike[str]) -> PoolConfig:
    """Read and validate a pool file."""
    name = os.fspath(path)
    return _validate(read_yaml(name), name)


def _validate(doc: YamlDocument, file: str | None) -> PoolConfig:
    try:
        config = PoolConfig.model_validate(doc.data)
    except ValidationError as exc:
        problems = sorted(
            (_problem(doc, e) for e in exc.errors(include_url=False)),
            key=lambda p: (p[0] is None, p[0] or 0),
        )
        line, where, message = problems[0]
        if len(problems) > 1:
            message += f" (and {len(problems) - 1} more problem(s))"
        raise SpecError(message, file=file, line=line, field=where or None) from None
    for name, override in config.breakers.items():
        # Checked here, not in a validator, so the error points at the class's own line.
        try:
            override.policy(DEFAULT_POLICIES[name])
        except ValueError as exc:
            path = ("breakers", name)
            raise SpecError(
                f"{exc} (unset fields keep the {name} defaults)",
                file=file,
                line=doc.line(path),
                field=format_path(path),
            ) from None
    return config


def pool_backends(config: PoolConfig) -> dict[str, ModelBackend]:
    """One :class:`~chainrt.dispatch.HttpBackend` per model of ``config``, sharing one HTTP
    client, one health poller and one table of endpoint states (breakers, in-flight counts)."""
    from ._http import HttpBackend
    from ._resources import PoolResources

    resources = PoolResources(
        config.breaker_policies(),
        health_interval_s=config.health.interval / 1000 if config.health.enabled else None,
        health_timeout_s=config.health.timeout / 1000,
        connect_timeout_s=config.connect_timeout / 1000,
    )
    return {
        name: HttpBackend(
            name,
            model.served_model or name,
            [(e.url, e.capacity) for e in model.endpoints],
            resources=resources,
            context_window=model.context_window,
            low_confidence_below=model.low_confidence_below,
            access={e.url: _access(e) for e in model.endpoints},
            request=model.request.model_dump(),
            price=None if model.price is None else model.price.prices(),
        )
        for name, model in config.models.items()
    }


def _access(endpoint: EndpointConfig) -> Access:
    return Access(
        auth=endpoint.auth(),
        tls=None if endpoint.tls is None else endpoint.tls.options(),
        chat_path=endpoint.chat_path,
        query=dict(endpoint.query),
        polled=endpoint.polled(),
    )


def load_pool_backends(path: str | os.PathLike[str]) -> dict[str, ModelBackend]:
    """The backends of the pool file at ``path`` (:class:`SpecError` when the file is invalid)."""
    return pool_backends(load_pool_config(path))
