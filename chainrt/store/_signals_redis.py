"""The signals of :mod:`chainrt.store._signals` in Redis: one string per signal, in the run's slot.

Imported by the Redis store only (a process on SQLite loads no Redis client).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._codec import FINAL_STATUSES, not_found
from ._redis_client import RedisConnection
from ._signals import (
    SIGNAL_KEEP_S,
    KeptSignal,
    SignalRecord,
    _decode,
    _encoded,
    _same,
    refused_for_status,
)

if TYPE_CHECKING:
    from ..redis.keys import StoreKeys

__all__ = ["RedisSignals"]


_PUT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {0} end
local status = redis.call('HGET', KEYS[1], 'status')
for i = 3, #ARGV do
  if status == ARGV[i] then return {3, status} end
end
local old = redis.call('GET', KEYS[2])
if old then return {2, status, old} end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
return {1, status}
"""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisSignals(RedisConnection):
    """The signal half of :class:`~chainrt.store._redis.RedisStore` (a base of it)."""

    max_record_bytes: int
    keys: StoreKeys

    async def put_signal(self, run_id: str, signal: SignalRecord) -> KeptSignal:
        """See :meth:`SqliteSignals.put_signal` (one Lua script in the run's slot)."""
        run_key = self.keys.run(run_id)
        key = self.keys.signal(run_id, signal.name)
        data = _encoded(run_id, signal, self.max_record_bytes)
        args = [data, str(SIGNAL_KEEP_S * 1000), *sorted(FINAL_STATUSES)]
        reply: list[Any] = await self._call(
            lambda: self._client.eval(_PUT, 2, run_key, key, *args), key=key
        )
        code = int(reply[0])
        if code == 0:
            raise not_found(run_id, self.url)
        status = _text(reply[1])
        if code == 3:
            raise refused_for_status(run_id, status)
        if code == 2:
            kept = _decode(reply[2], run_id, self.url)
            _same(kept, signal, run_id)
            return KeptSignal(signal=kept, status=status, stored=False)
        return KeptSignal(signal=signal, status=status, stored=True)

    async def get_signal(self, run_id: str, name: str) -> SignalRecord | None:
        """The signal ``name`` kept for ``run_id``, or None."""
        key = self.keys.signal(run_id, name)
        raw: bytes | str | None = await self._call(lambda: self._client.get(key), key=key)
        return None if raw is None else _decode(raw, run_id, self.url)
