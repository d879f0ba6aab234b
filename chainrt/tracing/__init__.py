"""Tracing to Jaeger (or any OTLP receiver) through OpenTelemetry (docs/tracing.md).

Tracing is on when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, or
``OTEL_TRACES_EXPORTER``) is set, or when it is forced (``chainrt run --trace``,
``CHAINRT_TRACE=1``). The standard variables configure the rest: ``OTEL_EXPORTER_OTLP_PROTOCOL``
(``http/protobuf``, the default, or ``grpc``), ``OTEL_SERVICE_NAME`` (default ``chainrt-runner``),
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*``, headers and certificates.
``OTEL_TRACES_EXPORTER=none`` or ``OTEL_SDK_DISABLED=true`` turns tracing off, even when forced.

    from chainrt.tracing import hooks_from_env, in_memory_hooks
    hooks = hooks_from_env(get_settings(), force=True)   # OtelHooks, or NO_HOOKS when off
    hooks = in_memory_hooks()                            # tests and benches: hooks.exporter

Off, nothing here imports OpenTelemetry and the runtime keeps :data:`chainrt._hooks.NO_HOOKS`.
One :class:`TracerProvider` with a batching processor is built per process and configuration
and kept here (the global OpenTelemetry provider is left alone).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._errors import ChainRTError
from .._hooks import NO_HOOKS, Hooks
from .._settings import Settings, get_settings
from . import _attributes as attributes

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from ._export import ReportingExporter
    from ._hooks import OtelHooks

__all__ = [
    "DEFAULT_EXPORT_TIMEOUT_S",
    "RUNNER_SERVICE_NAME",
    "WORKER_SERVICE_NAME",
    "OtelHooks",
    "TraceConfig",
    "attributes",
    "hooks_from_env",
    "in_memory_hooks",
    "tracer_provider_from_env",
]

log = logging.getLogger("chainrt.tracing")

RUNNER_SERVICE_NAME = "chainrt-runner"
"""``service.name`` of runner processes unless ``OTEL_SERVICE_NAME`` says otherwise."""
WORKER_SERVICE_NAME = "chainrt-worker"
"""``service.name`` of worker processes unless ``OTEL_SERVICE_NAME`` says otherwise."""

DEFAULT_EXPORT_TIMEOUT_S = 3.0
"""Export timeout (retries included) unless ``OTEL_EXPORTER_OTLP[_TRACES]_TIMEOUT`` sets one.

OpenTelemetry's own default is 10 s: a CLI run whose collector is down would then wait that long
before exiting. A batch that cannot be sent within 3 s is dropped (with a logged warning).
"""

_PROTOCOLS = ("http/protobuf", "grpc")
_EXPORTERS = ("otlp", "console")
_TRUE = ("1", "true", "yes", "on")


@dataclass(frozen=True, slots=True)
class TraceConfig:
    """What the ``OTEL_*`` variables ask for, decided without importing OpenTelemetry."""

    exporters: tuple[str, ...]
    """``otlp`` and/or ``console`` (spans as JSON on stderr)."""
    protocol: str
    """OTLP protocol: ``http/protobuf`` or ``grpc``."""
    environment: tuple[tuple[str, str], ...] = field(repr=False)  # headers may hold secrets
    """Every ``OTEL_*`` variable: exporters read their endpoint, headers... from them."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str], *, force: bool = False) -> TraceConfig | None:
        """The configuration ``environ`` describes, or None when tracing is off.

        Raises :class:`chainrt.ChainRTError` for an exporter or protocol chainrt cannot use.
        """
        if environ.get("OTEL_SDK_DISABLED", "").strip().lower() in _TRUE:
            return None
        named = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
        exporters = tuple(e.strip() for e in named.split(",") if e.strip())
        if "none" in exporters:
            return None
        endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        if not (force or endpoint or exporters):
            return None
        unknown = [e for e in exporters if e not in _EXPORTERS]
        if unknown:
            raise ChainRTError(
                f"OTEL_TRACES_EXPORTER={named!r}: chainrt can export to "
                f"{', '.join(_EXPORTERS)} or none, not {', '.join(unknown)}; send OTLP to a "
                "collector (Jaeger receives OTLP directly)"
            )
        variable = next(
            (
                name
                for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
                if environ.get(name)
            ),
            None,
        )
        protocol = environ[variable].strip() if variable else "http/protobuf"
        if protocol not in _PROTOCOLS:
            raise ChainRTError(
                f"{variable}={protocol!r} is not supported; use {' or '.join(_PROTOCOLS)}"
            )
        variables = tuple(sorted((k, v) for k, v in environ.items() if k.startswith("OTEL_")))
        return cls(exporters=exporters or ("otlp",), protocol=protocol, environment=variables)


_providers: dict[tuple[str, TraceConfig], TracerProvider] = {}
_providers_lock = threading.Lock()
_reporters: dict[int, ReportingExporter] = {}
"""``id(provider)`` → the OTLP exporter wrapper of that provider (providers live as long)."""


def tracer_provider_from_env(service_name: str, *, force: bool = False) -> TracerProvider | None:
    """The process's tracer provider for ``service_name`` as ``OTEL_*`` configure it, or None.

    ``service_name`` is the default ``service.name`` (``OTEL_SERVICE_NAME`` and
    ``OTEL_RESOURCE_ATTRIBUTES`` win). The provider is built once per process and configuration
    (a batching span processor and its exporter thread) and shut down, flushing, at exit.
    None means tracing is off, or was asked for by the environment alone and OpenTelemetry is
    not installed (then a warning is logged); forced tracing without OpenTelemetry raises.
    """
    config = TraceConfig.from_env(os.environ, force=force)
    if config is None:
        return None
    key = (service_name, config)
    with _providers_lock:
        provider = _providers.get(key)
        if provider is None:
            try:
                provider = _build_provider(service_name, config)
            except ImportError as exc:
                if force:
                    raise ChainRTError(
                        f"tracing needs OpenTelemetry ({exc.name} is missing): "
                        "pip install -e '.[otel]' in the chainrt repository"
                    ) from exc
                log.warning(
                    "OTEL_* variables ask for tracing but OpenTelemetry is not installed "
                    "(pip install -e '.[otel]' in the chainrt repository); tracing is off"
                )
                return None
            _providers[key] = provider
        return provider


def hooks_from_env(settings: Settings | None = None, *, force: bool = False) -> Hooks:
    """Tracing hooks for a runner: :class:`OtelHooks` when tracing is on, else ``NO_HOOKS``.

    ``force`` (the CLI's ``--trace``) and ``settings.trace`` (``CHAINRT_TRACE``) turn tracing on
    without any ``OTEL_*`` variable; spans then go to the default OTLP endpoint
    (``http://localhost:4318``). ``settings.jaeger_url`` is where trace links point.
    """
    settings = settings if settings is not None else get_settings()
    provider = tracer_provider_from_env(RUNNER_SERVICE_NAME, force=force or settings.trace)
    if provider is None:
        return NO_HOOKS
    from ._hooks import OtelHooks

    return OtelHooks(
        provider, jaeger_url=settings.jaeger_url, delivery=_reporters.get(id(provider))
    )


def in_memory_hooks(*, jaeger_url: str = "http://localhost:16686") -> OtelHooks:
    """Hooks that keep every finished span in memory (``hooks.exporter.get_finished_spans()``).

    Spans are exported synchronously as they end (no batching thread), on a provider of their
    own: for tests and benchmarks.
    """
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON

    from ._hooks import OtelHooks

    exporter = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create({"service.name": RUNNER_SERVICE_NAME}),
        sampler=ALWAYS_ON,
        shutdown_on_exit=False,
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return OtelHooks(provider, jaeger_url=jaeger_url, exporter=exporter)


def _build_provider(service_name: str, config: TraceConfig) -> TracerProvider:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

    from .._version import __version__

    detected = Resource.create()  # OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, sdk info
    defaults: dict[str, Any] = {}
    named = str(detected.attributes.get("service.name") or "")
    if not named or named.startswith("unknown_service"):
        defaults["service.name"] = service_name
    if "service.version" not in detected.attributes:
        defaults["service.version"] = __version__
    provider = TracerProvider(resource=detected.merge(Resource(defaults)))
    variables = dict(config.environment)
    timeout = None  # None: the exporter reads the OTEL_* timeout variables itself
    if not ({"OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"} & set(variables)):
        timeout = DEFAULT_EXPORT_TIMEOUT_S
    for name in config.exporters:
        exporter: SpanExporter
        if name == "console":
            import sys

            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            exporter = ConsoleSpanExporter(out=sys.stderr)  # stdout may carry --json output
        elif config.protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcExporter,
            )

            exporter = GrpcExporter(timeout=timeout)  # endpoint, headers, TLS: from OTEL_*
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                OTLPSpanExporter as HttpExporter,
            )

            exporter = HttpExporter(timeout=timeout)
        if name == "otlp":
            from ._export import ReportingExporter, otlp_target

            endpoint = variables.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or variables.get(
                "OTEL_EXPORTER_OTLP_ENDPOINT"
            )
            exporter = _reporters[id(provider)] = ReportingExporter(
                exporter, otlp_target(endpoint, config.protocol)
            )
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def __getattr__(name: str) -> Any:
    # OtelHooks lives with OpenTelemetry's imports; load it only when someone asks for it.
    if name == "OtelHooks":
        from ._hooks import OtelHooks

        return OtelHooks
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
