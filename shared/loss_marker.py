"""A Redis key that says whether Redis lost what a process put in it (a FLUSHALL, a new Redis).

The key holds "1" while nothing was lost. A process that finds it missing puts back what Redis
held (from the log, a bucket, its own memory), then sets it again. Setting it plainly at the
end would hide a second loss that struck during the pass: what was put back before it is gone
again, and no one would look. So a pass starts by writing its own token under the key, and ends
by setting "1" only where its token is still there: a loss meanwhile removed the token, and the
next check runs the pass again. Of two processes on one pass, the one that started last sets it.
"""

from __future__ import annotations

import uuid

from redis.asyncio import Redis

__all__ = ["LossMarker"]

_INTACT = "1"

# "1" where the pass's token is still there: Redis lost nothing since the pass began.
_END_PASS = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  if ARGV[2] == '' then
    redis.call('SET', KEYS[1], '1')
  else
    redis.call('SET', KEYS[1], '1', 'EX', ARGV[2])
  end
  return 1
end
return 0
"""


class LossMarker:
    def __init__(self, redis: Redis, key: str, ttl_s: int | None = None) -> None:
        self.redis, self.key, self.ttl_s = redis, key, ttl_s
        self._end_pass = redis.register_script(_END_PASS)

    async def intact(self) -> bool:
        """False when Redis lost what it held since a pass last ended; also while a pass is
        under way (what it puts back may not all be there yet)."""
        value = await self.redis.get(self.key)
        return value is not None and (value.decode() if isinstance(value, bytes) else value) == (
            _INTACT
        )

    async def begin_pass(self) -> str:
        """The token that `end_pass` needs: written now, gone if Redis loses its data again."""
        token = f"pass:{uuid.uuid4().hex}"
        await self.redis.set(self.key, token, ex=self.ttl_s)
        return token

    async def end_pass(self, token: str) -> bool:
        """The key set to "1" if Redis lost nothing since `begin_pass` gave `token`, and no other
        pass began since; False otherwise (the next check runs the pass again)."""
        ttl = "" if self.ttl_s is None else str(self.ttl_s)
        return bool(await self._end_pass(keys=[self.key], args=[token, ttl]))

    async def mark(self) -> None:
        """The key set to "1" outright: for a store that was filled without a pass (tests, a
        fresh deployment's first start)."""
        await self.redis.set(self.key, _INTACT, ex=self.ttl_s)
