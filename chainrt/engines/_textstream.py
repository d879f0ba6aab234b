"""Turning generated token bytes into clean text pieces (pure; no model needed).

Two things make token-by-token text awkward: a UTF-8 character can be split across tokens, and a
stop string can arrive over several tokens. :class:`TextAssembler` completes the characters and
holds back any tail that could still grow into a stop string, so every piece it releases is final
and the concatenation of the pieces is exactly the answer.
"""

from __future__ import annotations

import codecs

__all__ = ["TextAssembler"]


class TextAssembler:
    """Accumulates decoded text, releasing only what can no longer become a stop string."""

    def __init__(self, stops: list[str] | None = None) -> None:
        self._stops = [s for s in (stops or []) if s]
        # "replace": a token sequence that is not valid UTF-8 must not kill the generation.
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""
        self.text = ""
        """Everything released so far."""
        self.stopped = False
        """True once a stop string was seen (the stop string itself is never released)."""

    def feed(self, data: bytes) -> str:
        """Add the bytes of one token; return the text that became final (maybe "")."""
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(data)
        return self._release(final=False)

    def finish(self) -> str:
        """The generation ended: release what is held back (an unfinished character is dropped)."""
        if self.stopped:
            return ""
        tail = self._decoder.decode(b"", final=True)
        # A cut-off multi-byte character decodes to U+FFFD; drop it rather than emit garbage.
        self._pending += tail.rstrip("\ufffd") if tail else ""
        return self._release(final=True)

    def _release(self, *, final: bool) -> str:
        hits = [i for i in (self._pending.find(s) for s in self._stops) if i >= 0]
        if hits:
            out = self._pending[: min(hits)]
            self._pending = ""
            self.stopped = True
        else:
            keep = 0 if final else self._held_back()
            cut = len(self._pending) - keep
            out, self._pending = self._pending[:cut], self._pending[cut:]
        self.text += out
        return out

    def _held_back(self) -> int:
        """Length of the longest tail of pending text that is a proper prefix of a stop string."""
        best = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(self._pending)), best, -1):
                if self._pending.endswith(stop[:n]):
                    best = n
                    break
        return best
