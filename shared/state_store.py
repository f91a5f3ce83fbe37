"""Versioned State snapshots in Redis, written only by compare-and-set."""

from __future__ import annotations

from redis.asyncio import Redis

from .state import TaskState

__all__ = ["StateConflict", "TaskStateStore"]

_CAS = """
local current = redis.call('HGET', KEYS[1], 'version')
if (current == false and ARGV[1] == '0') or current == ARGV[1] then
  redis.call('HSET', KEYS[1], 'version', ARGV[2], 'state', ARGV[3])
  return 1
end
return 0
"""


class StateConflict(Exception):
    """Another writer saved a newer version first; reload and decide again."""


class TaskStateStore:
    def __init__(self, redis: Redis, prefix: str = "deckhands") -> None:
        self.redis = redis
        self.prefix = prefix
        self._cas = redis.register_script(_CAS)

    def _key(self, task_id: str) -> str:
        return f"{self.prefix}:task:{task_id}"

    async def load(self, task_id: str) -> TaskState | None:
        raw = await self.redis.hget(self._key(task_id), "state")  # type: ignore[misc]
        return None if raw is None else TaskState.model_validate_json(raw)

    async def save(self, state: TaskState) -> TaskState:
        """Write `state` as the next version of the one it was loaded as."""
        saved = state.model_copy(update={"version": state.version + 1})
        ok = await self._cas(
            keys=[self._key(state.task_id)],
            args=[str(state.version), str(saved.version), saved.model_dump_json()],
        )
        if not ok:
            raise StateConflict(f"task {state.task_id}: version {state.version} is stale")
        return saved

    async def create(self, state: TaskState) -> bool:
        """Save a brand-new task; False if the id exists."""
        try:
            await self.save(state.model_copy(update={"version": 0}))
        except StateConflict:
            return False
        return True

    async def claim_idempotency_key(self, key: str, task_id: str, ttl_s: int) -> str:
        """Bind `key` to `task_id` unless it is bound already; return the bound task id."""
        redis_key = f"{self.prefix}:idempotency:{key}"
        if await self.redis.set(redis_key, task_id, nx=True, ex=ttl_s):
            return task_id
        bound = await self.redis.get(redis_key)
        return bound.decode() if isinstance(bound, bytes) else str(bound)
