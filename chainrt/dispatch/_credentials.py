"""How a request reaches a hosted endpoint: its API key, extra headers and TLS settings.

A pool endpoint may name an environment variable holding its API key (``api_key_env``). The key
is read from the environment at each request — never copied into a record, an event, a trace or
a message — so a key rotated in the environment (``chainrt serve`` embedded in a process that
refreshes it, a test) is used from the next request on. While the variable is unset or empty the
endpoint is unusable, and every attempt log and ``why_unavailable`` says which variable is
missing. A ``401``/``403`` answer is the ``auth`` error class: its message names the variable
(and, should the server quote the key back, the key is replaced by ``***``).

TLS settings (``tls: {ca_file, cert_file, key_file, verify}``) build one :class:`ssl.SSLContext`
per distinct setting; the shared client routes an endpoint's host and port through a transport
using it (see :mod:`._client`).
"""

from __future__ import annotations

import functools
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["AUTH_STATUSES", "Access", "EndpointAuth", "TlsOptions", "auth_message", "tls_context"]

AUTH_STATUSES = frozenset({401, 403})
"""Answers that say the credentials are wrong: a configuration error, not a busy server."""

BEARER_HEADER = "Authorization"
"""The default key header; the key is sent as ``Bearer KEY`` there, bare in any other header."""


@dataclass(frozen=True, slots=True)
class TlsOptions:
    """Certificate options of an ``https://`` endpoint (all None/True: the process default)."""

    ca_file: str | None = None
    """PEM bundle of the CAs to trust instead of the system's (a private CA, a test server)."""
    cert_file: str | None = None
    """Client certificate (PEM) for mutual TLS."""
    key_file: str | None = None
    """The client certificate's private key (PEM); may be inside ``cert_file``."""
    verify: bool = True
    """False: do not check the server's certificate (a test box only; never in production)."""

    @property
    def default(self) -> bool:
        """True when these options are the process default (the shared SSL context serves)."""
        return self == TlsOptions()


@functools.cache
def tls_context(options: TlsOptions) -> ssl.SSLContext:
    """The SSL context of ``options`` (built once per distinct setting; OSError/ssl.SSLError
    when a file cannot be read)."""
    context = ssl.create_default_context(cafile=options.ca_file)
    if not options.verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if options.cert_file is not None:
        context.load_cert_chain(options.cert_file, options.key_file)
    return context


@dataclass(frozen=True, slots=True)
class EndpointAuth:
    """What goes with every request to one endpoint besides chainrt's own headers."""

    api_key_env: str | None = None
    """Environment variable holding the API key (None: the endpoint takes no key)."""
    api_key_header: str = BEARER_HEADER
    """Header the key goes in: ``Authorization: Bearer KEY``, or bare (Azure's ``api-key``)."""
    headers: Mapping[str, str] = field(default_factory=dict)
    """Fixed extra headers (not secrets: they are part of the pool file)."""

    def key(self) -> str | None:
        """The API key now (None: no key wanted, or the variable is unset or empty)."""
        if self.api_key_env is None:
            return None
        return os.environ.get(self.api_key_env, "").strip() or None

    def missing(self) -> str | None:
        """Why no request may go now (the key's variable is unset), or None."""
        if self.api_key_env is not None and self.key() is None:
            return f"API key variable {self.api_key_env} is not set (or empty)"
        return None

    def request_headers(self) -> dict[str, str]:
        """The headers to add to a request (the key among them, when one is wanted)."""
        out = dict(self.headers)
        key = self.key()
        if key is not None:
            if self.api_key_header.lower() == BEARER_HEADER.lower():
                out[BEARER_HEADER] = f"Bearer {key}"
            else:
                out[self.api_key_header] = key
        return out

    def scrub(self, text: str) -> str:
        """``text`` with the current key replaced by ``***`` (a server may quote it back)."""
        key = self.key()
        if key is None or not text:
            return text
        text = text.replace(key, "***")
        # OpenAI quotes a masked key ("sk-abc***********wxyz"): its visible ends are fragments
        # of the key too. Drop any quoted token that shares the key's first or last 4 chars.
        if len(key) >= 8:
            words = text.split(" ")
            text = " ".join(
                "***" if len(w) >= 8 and (w.startswith(key[:4]) or w.rstrip(".,;")[-4:] == key[-4:])
                else w
                for w in words
            )  # fmt: skip
        return text


def auth_message(status: int, detail: str, auth: EndpointAuth | None) -> str:
    """The attempt log's words for a ``401``/``403``: what was refused and which variable to
    check; ``detail`` (the server's own message) is kept after it, the key scrubbed out."""
    refused = "refused the API key" if status == 401 else "refused access"
    if auth is None or auth.api_key_env is None:
        lead = (
            f"HTTP {status}: the server {refused}; the endpoint has no api_key_env "
            "(set api_key_env in the pool file if it needs a key)"
        )
    else:
        lead = (
            f"HTTP {status}: the server {refused} from {auth.api_key_env} "
            f"(wrong, expired or rotated key? check {auth.api_key_env})"
        )
    if auth is not None:
        detail = auth.scrub(detail)
    return f"{lead}: {detail}" if detail else lead


@dataclass(frozen=True, slots=True)
class Access:
    """How requests reach one endpoint: its key and headers, TLS, route and polling."""

    auth: EndpointAuth = field(default_factory=EndpointAuth)
    tls: TlsOptions | None = None
    chat_path: str = "/v1/chat/completions"
    query: Mapping[str, str] = field(default_factory=dict)
    polled: bool = True
    """Whether the health poller watches its ``/health/ready``."""
