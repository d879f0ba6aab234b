"""API access on the command line: ``chainrt serve``'s token, host and limit options, the
``--token`` of the commands that call a server, and ``chainrt token new`` (docs/security.md)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from .._durations import parse_budget_ms, parse_duration_ms
from ..errors import InputError

__all__ = [
    "add_client_options",
    "add_serve_options",
    "add_token_command",
    "auth_headers",
    "serve_options",
    "token",
]

_UNITS = {"": 1, "b": 1, "k": 1024, "kib": 1024, "m": 1024**2, "mib": 1024**2}


def add_serve_options(parser: argparse.ArgumentParser) -> None:
    """``chainrt serve``'s access and limit options."""
    parser.add_argument(
        "--tokens",
        metavar="FILE",
        help="API tokens accepted, name:scope[,scope]:sha256 a line (default: "
        "CHAINRT_API_TOKENS; none: loopback only, everyone may do everything)",
    )
    parser.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="allow a non-loopback --host without tokens (anyone who reaches it may do anything)",
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a Host name accepted besides the loopback names (repeatable; * for any)",
    )
    parser.add_argument(
        "--max-body", default="4MiB", help="largest request body accepted (default 4MiB)"
    )
    parser.add_argument(
        "--max-budget", default="1h", help="largest budget a submit or resume may ask for"
    )
    parser.add_argument(
        "--header-timeout", default="10s", help="time a client gets to send a request's headers"
    )
    parser.add_argument(
        "--idle-timeout", default="5s", help="an idle kept-alive connection is closed after this"
    )
    parser.add_argument(
        "--body-timeout",
        default="30s",
        help="time a client gets to send a request's body once its headers are in (then 408)",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        help="connections open at once; more wait to be accepted (default: ulimit -n less 192)",
    )


def _bytes(raw: str) -> int:
    text = raw.strip().lower()
    number = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = text[len(number) :]
    if not number.isdigit() or unit not in _UNITS:
        raise InputError(f"--max-body must be a size like 4MiB, 512KiB or 1048576, got {raw!r}")
    return int(number) * _UNITS[unit]


def serve_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``ServeConfig`` fields of :func:`add_serve_options`' flags (one-line errors)."""
    max_body = _bytes(args.max_body)
    if max_body < 1024:
        raise InputError(f"--max-body must be at least 1KiB, got {args.max_body!r}")
    if args.max_connections is not None and args.max_connections < 1:
        raise InputError(f"--max-connections must be at least 1, got {args.max_connections}")
    timeouts = {}
    for flag, value in (
        ("--header-timeout", args.header_timeout),
        ("--idle-timeout", args.idle_timeout),
        ("--body-timeout", args.body_timeout),
    ):
        seconds = parse_duration_ms(value, what=flag) / 1000
        if seconds <= 0:
            raise InputError(f"{flag} must be greater than zero, got {value!r}")
        timeouts[flag] = seconds
    return {
        "tokens": args.tokens,
        "insecure_no_auth": args.insecure_no_auth,
        "allowed_hosts": list(args.allowed_host),
        "max_body": max_body,
        "max_budget_ms": parse_budget_ms(args.max_budget, what="--max-budget"),
        "header_timeout_s": timeouts["--header-timeout"],
        "idle_timeout_s": timeouts["--idle-timeout"],
        "body_timeout_s": timeouts["--body-timeout"],
        "max_connections": args.max_connections,
    }


def add_client_options(parser: argparse.ArgumentParser) -> None:
    """``--token`` for a command that calls a ``chainrt serve``."""
    parser.add_argument(
        "--token", help="API token sent as Authorization: Bearer (default: CHAINRT_API_TOKEN)"
    )


def auth_headers(args: argparse.Namespace) -> dict[str, str]:
    """The ``Authorization`` header for ``--token`` or ``CHAINRT_API_TOKEN`` (none without)."""
    from .._settings import get_settings

    given = getattr(args, "token", None)
    if given is None:
        secret = get_settings().api_token
        given = secret.get_secret_value() if secret is not None else None
    if not given:
        return {}
    if any(c in given for c in "\r\n") or not given.isascii():
        raise InputError("--token must be one line of ASCII text")
    return {"Authorization": f"Bearer {given}"}


def add_token_command(sub: Any) -> None:
    """Add ``chainrt token new NAME --scopes read,submit``."""
    token_p = sub.add_parser("token", help="make API tokens for chainrt serve")
    actions = token_p.add_subparsers(dest="token_command", required=True)
    new_p = actions.add_parser("new", help="print a new token and its line for a token file")
    new_p.add_argument("name", help="who holds the token (shown in 403 answers)")
    new_p.add_argument(
        "--scopes", default="read", help="comma-separated: read, submit, operate, admin"
    )
    new_p.add_argument("--json", action="store_true", help="print one JSON object")


async def token(args: argparse.Namespace) -> int:
    """``chainrt token new``: the token (give it to its holder) and the line (for the server)."""
    from .._api_tokens import new_token, parse_scopes

    value, line = new_token(args.name, parse_scopes(args.scopes, "--scopes"))
    if args.json:
        print(json.dumps({"token": value, "line": line}))
    else:
        print(f"token: {value}")
        print(f"line:  {line}")
        print("# the token is shown once: the server keeps only its sha256 (the line)")
    return 0
