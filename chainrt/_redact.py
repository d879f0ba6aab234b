"""Credentials masked out of URLs and of free text that quotes them, before anything is
recorded, logged or shown (store URLs, endpoint URLs, error messages)."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit

__all__ = ["redact_text", "redact_url"]

_SECRET_QUERY_KEYS = frozenset({"password", "pass", "pwd", "token", "secret"})


def redact_url(url: str) -> str:
    """``url`` with its password (in the user part or the query string) replaced by ``***``.

    The result is safe to print and log; everything else of the URL is kept as written.
    A string that does not parse as a URL is returned with everything after ``@`` kept and
    everything before it masked, so a malformed URL never leaks a secret either.
    """
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError on a malformed port
    except ValueError:
        _, sep, tail = url.rpartition("@")
        return f"***@{tail}" if sep else url
    shown = url
    if "@" in parts.netloc:
        userinfo, _, hostport = parts.netloc.rpartition("@")
        user, colon, _password = userinfo.partition(":")
        # A lone user part (redis://secret@host) may be a credential too: mask it whole.
        netloc = f"{user}:***@{hostport}" if colon else f"***@{hostport}"
        shown = shown.replace(f"//{parts.netloc}", f"//{netloc}", 1)
    if parts.query:
        pairs = parse_qsl(parts.query, keep_blank_values=True)
        if any(k.lower() in _SECRET_QUERY_KEYS for k, _ in pairs):
            query = urlencode(
                [(k, "***" if k.lower() in _SECRET_QUERY_KEYS else v) for k, v in pairs],
                safe="*",
            )
            shown = shown.replace(f"?{parts.query}", f"?{query}", 1)
    return shown


# scheme://userinfo@ inside free text. The user part runs to the last '@' before a space or a
# quote, so a password holding an unencoded '@' or '/' is masked whole (over-masking a path that
# holds an '@' is the safe way to be wrong).
_USERINFO = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)([^\s\"'<>]*)@")


def _mask_userinfo(match: re.Match[str]) -> str:
    user, colon, _password = match.group(2).partition(":")
    if colon and "/" not in user:
        return f"{match.group(1)}{user}:***@"
    return f"{match.group(1)}***@"


def redact_text(text: str) -> str:
    """``text`` with the credentials of every URL in it masked (``http://bob:***@host``).

    For endpoint URLs and error messages that quote them before they are recorded or shown; a
    URL's user name is kept (as :func:`redact_url` does), its password never is.
    """
    if "@" not in text or "://" not in text:
        return text
    return _USERINFO.sub(_mask_userinfo, text)
