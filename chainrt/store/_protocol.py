"""The checkpoint-store protocol every backend implements (SQLite, Redis).

All methods are async. A backend is correct when it passes ``chainrt.testing.store_conformance``
unchanged. The invariants the runner relies on:

* ``commit`` writes a step record and the run's progress atomically (all or nothing), and only if
  the caller's fencing ``token`` is still the run's current token (else :class:`FencedOut`).
* ``claim`` is a compare-and-set on the fencing token: it succeeds only if the run's token is
  still ``expected_token``, and then bumps it, so two processes can never both own a run.
* Records are JSON; a record that does not parse raises :class:`CorruptRecord`, never loads half.
* Every write is safe to send twice: an identical ``create_run`` or ``claim`` retry succeeds, and
  ``commit`` is idempotent for the same token and content (retries after a lost reply).
"""

from __future__ import annotations

import abc

from .._records import OwnerLease, RunProgress, RunRecord, RunStatus, StepRecord
from ._answers import AnswerCache, kept
from ._signals import KeptSignal, SignalRecord

__all__ = ["DEFAULT_MAX_RECORD_BYTES", "CheckpointStore"]

DEFAULT_MAX_RECORD_BYTES = 4 * 1024 * 1024
"""Records larger than this (serialised) are refused with RecordTooLarge, never truncated."""


class CheckpointStore(abc.ABC):
    """Durable home of run and step records. One instance per process is enough."""

    url: str
    """The store's URL with any password removed (safe to print)."""

    raw_url: str
    """The URL as given, password included (to open a limiter on the same server)."""

    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES

    @abc.abstractmethod
    async def create_run(self, run: RunRecord) -> None:
        """Insert a new run (with its owner lease). CheckpointError if the id exists."""

    @abc.abstractmethod
    async def get_run(self, run_id: str) -> RunRecord:
        """Load a run. RunNotFound if absent, CorruptRecord if unreadable."""

    @abc.abstractmethod
    async def get_steps(self, run_id: str) -> dict[str, StepRecord]:
        """All step records of a run, by step id (empty if none)."""

    @abc.abstractmethod
    async def commit(
        self, run_id: str, token: int, progress: RunProgress, step: StepRecord | None = None
    ) -> None:
        """Atomically write ``step`` (if any) and ``progress``; FencedOut if token is stale.

        Fields of ``progress`` that are None and optional (``budget_total_ms``, ``trace``) leave
        the stored value unchanged; ``release_owner`` clears the owner lease.
        """

    @abc.abstractmethod
    async def claim(self, run_id: str, expected_token: int, owner: OwnerLease) -> int:
        """Take ownership if the token is still ``expected_token``; return the new token.

        The new token is ``expected_token + 1`` and is stored in ``owner.token``; the run's
        status becomes ``running`` again (a ``partial``/``failed``/``rejected`` run may be resumed
        with more budget). A ``completed`` run cannot be claimed (CheckpointError). FencedOut if
        the token moved (someone else claimed first).
        """

    @abc.abstractmethod
    async def renew(self, run_id: str, token: int, expires_at: float) -> None:
        """Extend the owner lease; FencedOut if ``token`` is no longer current."""

    @abc.abstractmethod
    async def list_runs(
        self,
        status: RunStatus | None = None,
        limit: int = 100,
        *,
        before: tuple[float, str] | None = None,
        chain: str | None = None,
    ) -> list[RunRecord]:
        """Runs, newest first (``created_at``, then ``run_id``, both descending), optionally only
        those with ``status`` and only those of ``chain``; with ``before`` (``created_at,
        run_id`` of a run), only the runs after it in that order: keyset pages that hold however
        many runs the store keeps. A page filtered by status or by chain reads from an index of
        that status or chain: it costs about the same whatever else the store holds."""

    @abc.abstractmethod
    async def put_signal(self, run_id: str, signal: SignalRecord) -> KeptSignal:
        """Keep ``signal`` for the run (the first of its name wins; the same payload again is a
        retry, another is SignalRefused), atomically with reading the run's status, which comes
        back with what was kept. RunNotFound if no such run; SignalRefused if it has ended."""

    @abc.abstractmethod
    async def get_signal(self, run_id: str, name: str) -> SignalRecord | None:
        """The signal ``name`` kept for the run, or None (:mod:`chainrt.store._signals`)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections. The store is unusable afterwards."""

    def answer_cache(self) -> AnswerCache:
        """The answer cache of ``degrade: [cache]`` kept in this store, one per store object.

        This default keeps answers in memory (one process); a backend that can keep them beside
        its runs returns its own, and a wrapper around a store (tracing) returns its inner
        store's: the runner asks its store, whatever wraps it, never the store's class.
        """
        return kept(self, AnswerCache)
