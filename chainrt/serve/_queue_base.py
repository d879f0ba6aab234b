"""What every run queue of ``chainrt serve`` shares: entries, deliveries, dead letters, keys.

:class:`RunQueue` is what the service needs of a queue; ``_queue.RedisQueue`` (Redis Streams,
a fleet) and ``_queue_local.LocalQueue`` (one process, the SQLite store) implement it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal, cast

from ..redis.keys import QueueKeys, stream_key

__all__ = [
    "DEFAULT_MAX_DELIVERIES",
    "PRIORITIES",
    "DeadLetter",
    "Delivery",
    "Entry",
    "Priority",
    "QueueDepth",
    "QueueKeys",
    "RunQueue",
    "stream_key",
]

Priority = Literal["critical", "high", "normal", "low"]
PRIORITIES: tuple[Priority, ...] = ("critical", "high", "normal", "low")
DEFAULT_MAX_DELIVERIES = 3
"""Deliveries of an entry whose handling fails for good before it goes to the dead letters."""


@dataclass(frozen=True, slots=True)
class Entry:
    """What a queue entry asks for: start (or take over) ``run_id``, or resume it (``op``).
    ``chain`` routes it to the runners that serve that chain ("" for any runner)."""

    run_id: str
    op: Literal["start", "resume"] = "start"
    budget_ms: float | None = None
    chain: str = ""

    def fields(self) -> dict[str, str]:
        """The stream entry's fields."""
        budget = "" if self.budget_ms is None else repr(self.budget_ms)
        out = {"run_id": self.run_id, "op": self.op, "budget_ms": budget}
        if self.chain:
            out["chain"] = self.chain
        return out

    @classmethod
    def parse(cls, fields: dict[bytes, bytes]) -> Entry | None:
        """An entry from stream fields, or None when they are not one."""
        try:
            run_id = fields[b"run_id"].decode()
            op = fields.get(b"op", b"start").decode()
            raw_budget = fields.get(b"budget_ms", b"").decode()
            budget = float(raw_budget) if raw_budget else None
            chain = fields.get(b"chain", b"").decode()
        except (KeyError, UnicodeDecodeError, ValueError):
            return None
        if op not in ("start", "resume") or not run_id:
            return None
        return cls(run_id, cast(Literal["start", "resume"], op), budget, chain)


@dataclass(frozen=True, slots=True)
class Delivery:
    """An entry this runner holds: where it came from and its id there. ``raw`` keeps the
    entry's fields as read (what a dead letter shows when they are no entry)."""

    entry: Entry | None
    priority: Priority
    entry_id: str
    stream: str = ""
    raw: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class QueueDepth:
    """Entries waiting in one priority class (not yet taken), and the oldest one's age;
    ``chain`` names the chain of a chain's own stream ("" for the shared one)."""

    priority: Priority
    waiting: int
    oldest_age_s: float
    chain: str = ""


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """An entry taken out of the queue because handling it failed for good."""

    id: str
    run_id: str
    reason: str
    priority: str
    chain: str = ""
    op: str = "start"
    budget_ms: str = ""
    deliveries: int = 0
    dead_at: float = 0.0
    entry_id: str = ""
    consumer: str = ""

    def fields(self) -> dict[str, str]:
        """The dead-letter stream entry's fields (all text)."""
        return {
            "run_id": self.run_id,
            "reason": self.reason,
            "priority": self.priority,
            "chain": self.chain,
            "op": self.op,
            "budget_ms": self.budget_ms,
            "deliveries": str(self.deliveries),
            "dead_at": repr(self.dead_at),
            "entry_id": self.entry_id,
            "consumer": self.consumer,
        }

    @classmethod
    def parse(cls, dead_id: str, fields: dict[Any, Any]) -> DeadLetter:
        """A dead letter from its stream fields (missing or odd fields read as empty)."""
        text = {_text(k): _text(v) for k, v in fields.items()}

        def number(name: str) -> float:
            try:
                return float(text.get(name, "") or 0)
            except ValueError:
                return 0.0

        return cls(
            id=dead_id,
            run_id=text.get("run_id", ""),
            reason=text.get("reason", ""),
            priority=text.get("priority", "normal"),
            chain=text.get("chain", ""),
            op=text.get("op", "start"),
            budget_ms=text.get("budget_ms", ""),
            deliveries=int(number("deliveries")),
            dead_at=number("dead_at"),
            entry_id=text.get("entry_id", ""),
            consumer=text.get("consumer", ""),
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape of the API and ``chainrt dlq``."""
        return {
            "id": self.id,
            "run_id": self.run_id,
            "reason": self.reason,
            "priority": self.priority,
            "chain": self.chain,
            "op": self.op,
            "deliveries": self.deliveries,
            "dead_at": self.dead_at,
            "entry_id": self.entry_id,
            "consumer": self.consumer,
        }

    def entry(self) -> Entry:
        """The entry a retry queues: a resume (the run was marked failed when it died)."""
        try:
            budget = float(self.budget_ms) if self.budget_ms else None
        except ValueError:
            budget = None
        return Entry(self.run_id, "resume", budget, self.chain)

    def queue_priority(self) -> Priority:
        """The priority class it goes back to."""
        for priority in PRIORITIES:
            if priority == self.priority:
                return priority
        return "normal"


def dead_letter_of(
    delivery: Delivery, reason: str, deliveries: int, consumer: str, dead_id: str = ""
) -> DeadLetter:
    """The dead letter of ``delivery`` (its entry's fields, or what was read when there is no
    entry)."""
    entry = delivery.entry
    raw = dict(delivery.raw)
    budget = "" if entry is None or entry.budget_ms is None else repr(entry.budget_ms)
    return DeadLetter(
        id=dead_id,
        run_id=entry.run_id if entry is not None else raw.get("run_id", "")[:512],
        reason=reason[:2000],
        priority=delivery.priority,
        chain=entry.chain if entry is not None else raw.get("chain", "")[:200],
        op=entry.op if entry is not None else raw.get("op", "")[:20],
        budget_ms=budget,
        deliveries=deliveries,
        dead_at=time.time(),
        entry_id=delivery.entry_id,
        consumer=consumer,
    )


class RunQueue:
    """What ``chainrt serve`` needs of a queue. The default methods suit a queue without
    orphans (one process)."""

    max_deliveries: int = DEFAULT_MAX_DELIVERIES

    async def put(self, entry: Entry, priority: Priority) -> None:
        """Add an entry."""
        raise NotImplementedError

    async def take(self, wait_s: float) -> Delivery | None:
        """The next entry, critical first; None after ``wait_s`` without one."""
        raise NotImplementedError

    async def ack(self, delivery: Delivery) -> None:
        """The entry's run is final: forget it."""

    async def hand_back(self, delivery: Delivery) -> None:
        """Give the entry back so that another runner takes it at once."""
        if delivery.entry is not None:
            await self.put(delivery.entry, delivery.priority)

    async def fail(self, delivery: Delivery, reason: str) -> DeadLetter | None:
        """Handling the entry failed for a reason that will not change. Once it has been
        delivered ``max_deliveries`` times it moves to the dead letters (returned); until then
        it is left to be delivered again."""
        raise NotImplementedError

    async def touch(self, deliveries: list[Delivery]) -> None:
        """Keep entries this runner is working on from looking orphaned."""

    async def orphans(self, count: int) -> list[Delivery]:
        """Up to ``count`` entries whose holders stopped touching them."""
        return []

    async def depth(self) -> list[QueueDepth]:
        """Waiting entries per priority class (and chain)."""
        return []

    async def announce(self, chains: list[str], ttl_s: float) -> None:
        """Tell the fleet this runner lives and serves ``chains`` (for ``ttl_s``)."""

    async def served(self) -> set[str] | None:
        """The chains some live runner serves; None when the queue cannot know (one process)."""
        return None

    async def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """The dead letters, oldest first."""
        return []

    async def dead_letter(self, dead_id: str) -> DeadLetter | None:
        """One dead letter; None if absent."""
        return next((d for d in await self.dead_letters(100_000) if d.id == dead_id), None)

    async def dead_count(self) -> int:
        """How many dead letters there are."""
        return len(await self.dead_letters(100_000))

    async def retry_dead(self, dead_id: str) -> DeadLetter | None:
        """Queue a dead letter's run again (as a resume) and remove the letter; None if absent."""
        return None

    async def drop_dead(self, dead_id: str) -> DeadLetter | None:
        """Remove a dead letter; None if absent."""
        return None

    async def close(self) -> None:
        """Release connections."""


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
