"""Every Redis name the limiter uses comes from here (one builder, never formatted in place).

Layout, for a concurrency key ``K`` under the default prefix ``chainrt:ck``::

    chainrt:ck:{K}:holders   sorted set  member -> lease expiry (ms, Redis server time)
    chainrt:ck:{K}:queue     sorted set  member -> ticket number (FIFO order)
    chainrt:ck:{K}:tickets   sorted set  member -> ticket expiry (ms); a dead waiter's ticket lapses
    chainrt:ck:{K}:rate      string      GCRA theoretical arrival time (ms)
    chainrt:ck:{K}:undone    sorted set  member -> expiry (ms) of abandoned acquisitions: a try
                                         still in flight for one of them must not take a slot
    chainrt:ck:wake:<instance>           pub/sub channel of one limiter instance (wake-ups)

All keys of ``K`` share the hash tag ``{K}``, so they live in one Redis Cluster slot and one Lua
script may touch them all. A member is ``"<instance>:<n>:<holder>"``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from .._errors import ConcurrencyError

__all__ = ["DEFAULT_PREFIX", "KeyNames", "check_prefix", "key_names", "wake_channel_prefix"]

DEFAULT_PREFIX = "chainrt:ck"


class KeyNames(NamedTuple):
    """The Redis keys behind one concurrency key, in the order the Lua scripts expect them."""

    holders: str
    queue: str
    tickets: str
    rate: str
    undone: str


def check_prefix(prefix: str) -> str:
    """Refuse a prefix that would break the hash tags (braces) or blur the layout."""
    if not prefix or "{" in prefix or "}" in prefix or prefix.endswith(":"):
        raise ConcurrencyError(
            "limiter key prefix must be non-empty, without braces or a trailing ':', "
            f"got {prefix!r}"
        )
    return prefix


@lru_cache(maxsize=4096)
def key_names(prefix: str, key: str) -> KeyNames:
    """Names of the Redis keys behind concurrency key ``key``."""
    base = f"{prefix}:{{{key}}}"
    return KeyNames(*(f"{base}:{part}" for part in KeyNames._fields))


def wake_channel_prefix(prefix: str) -> str:
    """Channel name of an instance minus its id (the scripts append the id from the member)."""
    return f"{prefix}:wake:"
