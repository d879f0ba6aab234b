"""The cap on open event streams (``--max-streams``): each holds a socket to its client for as
long as it lasts, so a process that took every stream asked for would run out of file
descriptors (and could then answer nothing, its health checks included). Past the cap a new
stream is answered 429 at once.

The default is half the process's open-files limit (``ulimit -n``), at most
:data:`DEFAULT_MAX`: under ``ulimit -n 1024``, 512 streams, and room for everything else.
"""

from __future__ import annotations

import resource
from collections.abc import AsyncIterable, Callable
from typing import Any

# Imported now, not at the first stream: starlette's streaming response imports anyio's asyncio
# backend on first use, and a first use in a burst of connections that has taken every file
# descriptor failed with "Too many open files" (importing a module needs one).
import anyio._backends._asyncio  # noqa: F401
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

__all__ = ["DEFAULT_MAX", "CappedStream", "StreamSlots", "default_max_streams"]

DEFAULT_MAX = 10_000


def default_max_streams(nofile: int | None = None) -> int:
    """Half the open-files limit (``nofile``: the soft limit of this process when None), at
    least 1 and at most :data:`DEFAULT_MAX`; :data:`DEFAULT_MAX` when the limit is unlimited."""
    if nofile is None:
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if nofile < 0 or nofile == resource.RLIM_INFINITY:
        return DEFAULT_MAX
    return max(1, min(DEFAULT_MAX, nofile // 2))


class StreamSlots:
    """Counts open streams against ``limit``."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = default_max_streams() if limit is None else limit
        self.open = 0
        self.refused = 0

    def take(self) -> Callable[[], None] | None:
        """A slot, as the function that gives it back (once; calling it again does nothing),
        or None when every slot is taken."""
        if self.open >= self.limit:
            self.refused += 1
            return None
        self.open += 1
        given_back = False

        def give_back() -> None:
            nonlocal given_back
            if not given_back:
                given_back = True
                self.open -= 1

        return give_back


class CappedStream(StreamingResponse):
    """A streaming response that gives its slot back when it ends, however it ends (the client
    left, the server stops, or the body was never started)."""

    def __init__(
        self, content: AsyncIterable[Any], release: Callable[[], None], **kwargs: Any
    ) -> None:
        super().__init__(content, **kwargs)
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()
