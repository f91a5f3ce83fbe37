"""Versioned State snapshots in Redis, written only by compare-and-set."""

from __future__ import annotations

from redis.asyncio import Redis

from .loss_marker import LossMarker
from .state import TaskState

__all__ = ["StateConflict", "TaskStateStore"]

# The deadline index is written with the State it indexes, so neither can exist without the other.
_CAS = """
local current = redis.call('HGET', KEYS[1], 'version')
if (current == false and ARGV[1] == '0') or current == ARGV[1] then
  redis.call('HSET', KEYS[1], 'version', ARGV[2], 'state', ARGV[3])
  if ARGV[4] == '' then
    redis.call('ZREM', KEYS[2], ARGV[5])
  else
    redis.call('ZADD', KEYS[2], ARGV[4], ARGV[5])
  end
  return 1
end
return 0
"""

# The State, unless the caller holds its saved version already (1): one round trip either way.
_LOAD_IF_CHANGED = """
local current = redis.call('HGET', KEYS[1], 'version')
if current == false then return false end
if current == ARGV[1] then return 1 end
return redis.call('HGET', KEYS[1], 'state')
"""

# Bumps an overdue entry forward unless a save moved it meanwhile (then that save's value wins).
_POSTPONE = """
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) == tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
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
        self._postpone = redis.register_script(_POSTPONE)
        self._load_if_changed = redis.register_script(_LOAD_IF_CHANGED)
        self.deadlines_key = f"{prefix}:deadlines"
        self.intact_key = f"{prefix}:states-intact"
        self.marker = LossMarker(redis, self.intact_key)

    def _key(self, task_id: str) -> str:
        return f"{self.prefix}:task:{task_id}"

    async def load(self, task_id: str) -> TaskState | None:
        raw = await self.redis.hget(self._key(task_id), "state")
        return None if raw is None else TaskState.model_validate_json(raw)

    async def fresh(self, held: TaskState) -> TaskState | None:
        """`held` while it is the version saved last, else the State saved since (None: gone),
        in one round trip: a replica's own last write is not read or parsed again, and one
        another writer replaced is never used."""
        raw = await self._load_if_changed(keys=[self._key(held.task_id)], args=[str(held.version)])
        if raw is None:
            return None
        if raw == 1:
            return held
        return TaskState.model_validate_json(raw)

    async def load_many(self, task_ids: list[str]) -> list[TaskState | None]:
        """The States of `task_ids` (None where there is none), in one round trip."""
        if not task_ids:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for task_id in task_ids:
                pipe.hget(self._key(task_id), "state")
            raws = await pipe.execute()
        return [None if raw is None else TaskState.model_validate_json(raw) for raw in raws]

    async def delete(self, task_id: str) -> None:
        """Remove the task's State and its deadline (the task was deleted)."""
        async with self.redis.pipeline(transaction=True) as tx:
            tx.delete(self._key(task_id))
            tx.zrem(self.deadlines_key, task_id)
            await tx.execute()

    async def exists(self, task_id: str) -> bool:
        return bool(await self.redis.hexists(self._key(task_id), "state"))

    async def save(self, state: TaskState, new_version: int | None = None) -> TaskState:
        """Write `state` as the next version of the one it was loaded as (or as `new_version`)."""
        saved = state.model_copy(
            update={"version": state.version + 1 if new_version is None else new_version}
        )
        deadline = saved.awaiting_deadline
        ok = await self._cas(
            keys=[self._key(state.task_id), self.deadlines_key],
            args=[
                str(state.version),
                str(saved.version),
                saved.model_dump_json(),
                "" if deadline is None else repr(deadline.timestamp()),
                state.task_id,
            ],
        )
        if not ok:
            raise StateConflict(f"task {state.task_id}: version {state.version} is stale")
        return saved

    async def intact(self) -> bool:
        """False when Redis lost what it held (a FLUSHALL, a new empty Redis) since the
        controller last made sure every live task has its State (a recovery pass ended)."""
        return await self.marker.intact()

    async def mark_intact(self) -> None:
        """Redis holds every live task's State, said outright (no recovery pass)."""
        await self.marker.mark()

    async def overdue(self, now: float, limit: int = 200) -> list[tuple[str, float]]:
        """Tasks whose awaited answer was due before `now`, with their deadlines."""
        rows: list[tuple[bytes | str, float]] = await self.redis.zrangebyscore(
            self.deadlines_key, "-inf", now, start=0, num=limit, withscores=True
        )  # type: ignore[assignment]
        return [(k.decode() if isinstance(k, bytes) else k, float(s)) for k, s in rows]

    async def postpone(self, task_id: str, deadline: float, until: float) -> bool:
        """Move an overdue entry to `until`, unless a save changed it since it was read."""
        moved = await self._postpone(
            keys=[self.deadlines_key], args=[task_id, repr(deadline), repr(until)]
        )
        return bool(moved)

    async def create(self, state: TaskState, version: int = 1) -> bool:
        """Save a brand-new task (as `version`); False if the id exists."""
        try:
            await self.save(state.model_copy(update={"version": 0}), new_version=version)
        except StateConflict:
            return False
        return True
