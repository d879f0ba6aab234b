"""API tokens of ``chainrt serve``: who may call what (see docs/security.md).

A token file (``--tokens FILE``) or ``CHAINRT_API_TOKENS`` holds one token a line,
``name:scope[,scope]:sha256-of-token``; the server keeps only the hashes. A request's token is
hashed and compared with every line in constant time (:func:`hmac.compare_digest`), so neither
the answer nor its timing tells how much of a guess was right.

Scopes: ``read`` (every GET: runs, events, chains, metrics, the dashboard's data), ``submit``
(``POST /v1/runs``), ``operate`` (cancel, resume, signal) and ``admin`` (dead letters, reloads).
:func:`required_scope` maps a request to the scope it needs; it is pure and table-tested.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, get_args

from .errors import InputError

__all__ = [
    "ANONYMOUS",
    "SCOPES",
    "Principal",
    "Scope",
    "TokenTable",
    "hash_token",
    "load_tokens",
    "new_token",
    "parse_scopes",
    "required_scope",
]

Scope = Literal["read", "submit", "operate", "admin"]
SCOPES: tuple[Scope, ...] = get_args(Scope)
"""Every scope, in the order the docs list them."""

_NAME = re.compile(r"[A-Za-z0-9_.@-]{1,64}")
_DIGEST = re.compile(r"[0-9a-f]{64}")
_OPERATIONS = ("cancel", "resume", "signal")
_ADMIN_PREFIXES = ("/v1/dlq", "/v1/admin")


@dataclass(frozen=True)
class Principal:
    """Who made a request: a token's name and scopes (``anonymous`` with every scope when the
    server has no tokens, which it allows on loopback only)."""

    name: str
    scopes: frozenset[Scope]

    def may(self, scope: Scope) -> bool:
        """Whether this principal holds ``scope``."""
        return scope in self.scopes


ANONYMOUS = Principal("anonymous", frozenset(SCOPES))


def hash_token(token: str) -> str:
    """The sha256 hex digest of ``token``: what a token line stores."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def parse_scopes(text: str, where: str = "scopes") -> frozenset[Scope]:
    """``read,submit`` as a set of scopes; InputError naming an unknown one."""
    found: set[Scope] = set()
    for part in text.split(","):
        name = part.strip()
        if name not in SCOPES:
            known = ", ".join(SCOPES)
            raise InputError(f"{where}: unknown scope {name!r} (known: {known})")
        found.add(name)
    return frozenset(found)


def new_token(name: str, scopes: Iterable[Scope]) -> tuple[str, str]:
    """A new random token and its line for a token file: ``(token, "name:scopes:sha256")``."""
    if not _NAME.fullmatch(name):
        raise InputError(f"token name must be 1-64 of A-Z a-z 0-9 _ . @ -, got {name!r}")
    token = "crt_" + secrets.token_urlsafe(32)
    chosen = ",".join(s for s in SCOPES if s in set(scopes))
    if not chosen:
        raise InputError("a token needs at least one scope")
    return token, f"{name}:{chosen}:{hash_token(token)}"


class TokenTable:
    """The tokens a server accepts (hashes only), read from token lines."""

    def __init__(self, entries: Iterable[tuple[str, frozenset[Scope], str]] = ()) -> None:
        self._entries = [(name, scopes, bytes.fromhex(digest)) for name, scopes, digest in entries]

    @classmethod
    def parse(cls, text: str, where: str) -> TokenTable:
        """Token lines (blank lines and ``#`` comments skipped); InputError naming the line."""
        entries: list[tuple[str, frozenset[Scope], str]] = []
        names: set[str] = set()
        for number, raw in enumerate(text.splitlines(), start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            at = f"{where}:{number}"
            parts = line.split(":")
            if len(parts) != 3:
                raise InputError(f"{at}: expected name:scope[,scope]:sha256-of-token")
            name, scopes, digest = (p.strip() for p in parts)
            if not _NAME.fullmatch(name):
                raise InputError(f"{at}: token name must be 1-64 of A-Z a-z 0-9 _ . @ -")
            if name in names:
                raise InputError(f"{at}: the token name {name!r} is used twice")
            if not _DIGEST.fullmatch(digest):
                raise InputError(
                    f"{at}: the third field must be the token's sha256 (64 lowercase hex "
                    "digits; `chainrt token new` prints a whole line)"
                )
            names.add(name)
            entries.append((name, parse_scopes(scopes, at), digest))
        return cls(entries)

    def __len__(self) -> int:
        return len(self._entries)

    def find(self, token: str) -> Principal | None:
        """The principal whose hash matches ``token``, or None. Every line is compared (in
        constant time each), found or not."""
        digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        found: Principal | None = None
        for name, scopes, stored in self._entries:
            if hmac.compare_digest(digest, stored):
                found = Principal(name, scopes)
        return found


def required_scope(method: str, path: str) -> Scope | None:
    """The scope a request needs, or None for what anyone may load (health probes, the
    dashboard's pages and login). Unknown state-changing routes need ``admin``: a new route is
    closed until it says otherwise."""
    method = method.upper()
    if path.startswith("/health/"):
        return None
    if path == "/ui" or path.startswith("/ui/"):
        # The pages hold no data (their scripts read the API, which is checked) and the login
        # form must load before anyone is logged in.
        return None
    if any(path == p or path.startswith(p + "/") for p in _ADMIN_PREFIXES):
        return "admin"
    if method in ("GET", "HEAD", "OPTIONS"):
        return "read"
    if path == "/v1/runs" and method == "POST":
        return "submit"
    parts = path.split("/")
    if (
        method == "POST"
        and len(parts) == 5
        and parts[1:3] == ["v1", "runs"]
        and parts[4] in _OPERATIONS
    ):
        return "operate"
    return "admin"


def load_tokens(path: str | None, env_text: str | None) -> TokenTable | None:
    """The tokens of ``--tokens FILE``, else of ``CHAINRT_API_TOKENS``; None when neither is
    given (the server then has no tokens). A file that cannot be read, or a bad line, is an
    InputError naming it."""
    if path is not None:
        try:
            with open(path, encoding="utf-8") as file:
                text = file.read(1024 * 1024)
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"--tokens {path}: cannot read it: {exc}") from None
        table = TokenTable.parse(text, path)
        where = path
    elif env_text is not None and env_text.strip():
        table = TokenTable.parse(env_text, "CHAINRT_API_TOKENS")
        where = "CHAINRT_API_TOKENS"
    else:
        return None
    if len(table) == 0:
        raise InputError(f"{where} holds no token lines (name:scope[,scope]:sha256-of-token)")
    return table
