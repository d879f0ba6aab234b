"""The store's commit script call packed for the wire: one format for all its arguments.

Every durable step on Redis sends one ``EVALSHA`` of the commit script: 2 keys and 11
arguments. Packed by the generic :func:`chainrt.redis.pack_args` (a loop with a type test and a format
per argument) it cost 4.1-4.8 us per commit on the loaded 2-CPU machine (``timeit``), a few %
of a step's own Python when many runs share one process (issue 18, round 7); here the 13 bulk
strings go through one ``%`` format: 3.1-3.2 us in the same runs (1.3-1.6x faster), with the
same bytes (``tests/test_commit_wire.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..redis import pack_args

__all__ = ["COMMIT_ARGS", "COMMIT_KEYS", "commit_wire"]

COMMIT_KEYS = 2
"""The commit script's key count (the run's hash, its steps' hash)."""

COMMIT_ARGS = 11
"""The commit script's argument count (see ``RedisStore.commit``)."""

_BULKS = b"$%d\r\n%b\r\n" * (COMMIT_KEYS + COMMIT_ARGS)


def commit_wire(head: bytes, keys: Sequence[str], args: Sequence[str | bytes]) -> bytes:
    """``head`` (the packed ``*16``, ``EVALSHA``, sha and key count) followed by ``keys`` and
    ``args`` as RESP bulk strings: the bytes of ``head + pack_args((*keys, *args))``."""
    data = [a.encode() if type(a) is str else a for a in (*keys, *args)]
    if len(data) != COMMIT_KEYS + COMMIT_ARGS:  # another shape: the generic packer
        return head + pack_args(data)
    k0, k1, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10 = data
    return head + _BULKS % (
        len(k0), k0, len(k1), k1,
        len(a0), a0, len(a1), a1, len(a2), a2, len(a3), a3, len(a4), a4, len(a5), a5,
        len(a6), a6, len(a7), a7, len(a8), a8, len(a9), a9, len(a10), a10,
    )  # fmt: skip
