"""What the runtime remembers in Redis, so any replica (or a restarted one) can carry on.

- task bindings: task id -> container id and the replica whose engine holds it
  (`<container>@<replica>`; a binding written before replicas were named has no `@`), claimed
  with SET NX so one task never gets two sandboxes and a sandbox is never bound twice;
- replica names alive: a replica's orders and sandboxes are only taken over once it is gone;
- replica heartbeats: which replicas are alive, so a replica's warm sandboxes are only
  reaped once it is gone;
- the action ledger: executed action id -> the observation published for it, so a redelivered
  ExecuteAction republishes that observation instead of running the command again, and a
  "running" marker so a concurrent duplicate waits instead of running it twice.
"""

from __future__ import annotations

from redis.asyncio import Redis

from shared.loss_marker import LossMarker

__all__ = ["ActionLedger", "TaskBindings"]

_DELETE_IF = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
# A binding names `<container>` or `<container>@<replica>`: these compare the container only.
_UNBIND_IF = """
local v = redis.call('GET', KEYS[1])
if v and (v == ARGV[1] or string.sub(v, 1, string.len(ARGV[1]) + 1) == ARGV[1] .. '@') then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
_REHOLD_IF = """
local v = redis.call('GET', KEYS[1])
if v and (v == ARGV[1] or string.sub(v, 1, string.len(ARGV[1]) + 1) == ARGV[1] .. '@') then
  redis.call('SET', KEYS[1], ARGV[1] .. '@' .. ARGV[2], 'KEEPTTL')
  return 1
end
return 0
"""
_REFRESH_IF = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('EXPIRE', KEYS[1], ARGV[2])
end
return 0
"""


def _text(value: bytes | str | None) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _split(value: str | None) -> tuple[str, str | None] | None:
    """A binding's value as (container id, holding replica or None)."""
    if value is None:
        return None
    container_id, _, replica = value.partition("@")
    return container_id, (replica or None)


class TaskBindings:
    def __init__(self, redis: Redis, pool_name: str, ttl_s: int, replica: str = "") -> None:
        self.redis = redis
        self.prefix = f"deckhands:runtime:{pool_name}"
        self.ttl_s = ttl_s
        self.replica = replica  # this replica's name: what it binds is held by its engine
        self._delete_if = redis.register_script(_DELETE_IF)
        self._unbind_if = redis.register_script(_UNBIND_IF)
        self._rehold_if = redis.register_script(_REHOLD_IF)

    def _task_key(self, task_id: str) -> str:
        return f"{self.prefix}:task:{task_id}"

    def _value(self, container_id: str) -> str:
        return f"{container_id}@{self.replica}" if self.replica else container_id

    async def get(self, task_id: str) -> str | None:
        """The container the task is bound to."""
        held = await self.held(task_id)
        return held[0] if held is not None else None

    async def held(self, task_id: str) -> tuple[str, str | None] | None:
        """(container id, the replica whose engine holds it, None if not recorded)."""
        return _split(_text(await self.redis.get(self._task_key(task_id))))

    async def holder(self, task_id: str) -> str | None:
        """The replica holding the task's sandbox (None: unbound, or not recorded)."""
        held = await self.held(task_id)
        return held[1] if held is not None else None

    async def bind(self, task_id: str, container_id: str) -> str:
        """Bind unless the task is bound already; return the container the task is bound to."""
        held = await self.bind_held(task_id, container_id)
        return held[0]

    async def bind_held(self, task_id: str, container_id: str) -> tuple[str, str | None]:
        """Bind unless the task is bound already; return what the task is bound to (container,
        holding replica)."""
        key = self._task_key(task_id)
        if await self.redis.set(key, self._value(container_id), nx=True, ex=self.ttl_s):
            return container_id, (self.replica or None)
        bound = _split(_text(await self.redis.get(key)))
        if bound is None:  # expired between the two calls: try once more
            return await self.bind_held(task_id, container_id)
        return bound

    async def rehold(self, task_id: str, container_id: str) -> bool:
        """Record this replica as the holder of the task's sandbox (it adopted the container,
        on the engine it shares with the replica that is gone); False if the task is bound to
        another container now."""
        if not self.replica:
            return False
        return bool(
            await self._rehold_if(keys=[self._task_key(task_id)], args=[container_id, self.replica])
        )

    async def touch(self, task_id: str) -> None:
        await self.redis.expire(self._task_key(task_id), self.ttl_s)

    async def unbind(self, task_id: str, container_id: str) -> None:
        """Remove the binding only if it still names this container."""
        await self._unbind_if(keys=[self._task_key(task_id)], args=[container_id])

    async def all(self) -> dict[str, str]:
        """Every binding of this pool: task id -> container id."""
        return {task: cid for task, (cid, _) in (await self.all_held()).items()}

    async def all_held(self) -> dict[str, tuple[str, str | None]]:
        """Every binding of this pool: task id -> (container id, holding replica)."""
        found: dict[str, tuple[str, str | None]] = {}
        start = len(self._task_key(""))
        async for raw in self.redis.scan_iter(match=self._task_key("*"), count=500):
            key = _text(raw) or ""
            value = _split(_text(await self.redis.get(key)))
            if value is not None:
                found[key[start:]] = value
        return found

    # -- sandboxes stopped while their task waits (their binding stays)

    def _stopped_key(self, container_id: str) -> str:
        return f"{self.prefix}:stopped:{container_id}"

    async def mark_stopped(self, container_id: str, at: float) -> None:
        await self.redis.set(self._stopped_key(container_id), repr(at), ex=self.ttl_s)

    async def stopped_at(self, container_id: str) -> float | None:
        """Unix time we stopped this sandbox on purpose, or None if we did not."""
        value = _text(await self.redis.get(self._stopped_key(container_id)))
        return float(value) if value is not None else None

    async def clear_stopped(self, container_id: str) -> None:
        await self.redis.delete(self._stopped_key(container_id))

    # -- whether Redis still holds what this replica wrote

    def marker(self, replica_id: str) -> LossMarker:
        """ "1" while Redis holds what this replica wrote. Expiring is harmless (the next check
        binds what is bound already) and keeps no key of a replica that died."""
        return LossMarker(self.redis, f"{self.prefix}:intact:{replica_id}", ttl_s=86_400)

    # -- replicas

    async def heartbeat(self, replica_id: str, ttl_s: int) -> None:
        await self.redis.set(f"{self.prefix}:replica:{replica_id}", "1", ex=ttl_s)

    async def replica_alive(self, replica_id: str) -> bool:
        return bool(await self.redis.exists(f"{self.prefix}:replica:{replica_id}"))

    async def replica_gone(self, replica_id: str) -> None:
        await self.redis.delete(
            f"{self.prefix}:replica:{replica_id}", f"{self.prefix}:intact:{replica_id}"
        )

    # -- replica names (several processes may share one, on one engine)

    async def name_heartbeat(self, ttl_s: int) -> None:
        if self.replica:
            await self.redis.set(f"{self.prefix}:name:{self.replica}", "1", ex=ttl_s)

    async def name_alive(self, replica: str) -> bool:
        """Whether some process of the replica `replica` sent a heartbeat lately."""
        if replica == self.replica:
            return True
        return bool(await self.redis.exists(f"{self.prefix}:name:{replica}"))


# One round trip per step of an action: begin (recorded result, or claim), complete (record the
# result and drop the claim).
_BEGIN = """
local recorded = redis.call('GET', KEYS[1])
if recorded then return {'recorded', recorded} end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'EX', ARGV[2]) then return {'claimed', ''} end
return {'busy', ''}
"""
_COMPLETE = """
redis.call('SET', KEYS[1], ARGV[2], 'NX', 'EX', ARGV[3])
if redis.call('GET', KEYS[2]) == ARGV[1] then redis.call('DEL', KEYS[2]) end
return redis.call('GET', KEYS[1])
"""


class ActionLedger:
    def __init__(self, redis: Redis, ttl_s: int) -> None:
        self.redis = redis
        self.ttl_s = ttl_s
        self._delete_if = redis.register_script(_DELETE_IF)
        self._refresh_if = redis.register_script(_REFRESH_IF)
        self._begin = redis.register_script(_BEGIN)
        self._complete = redis.register_script(_COMPLETE)

    async def begin(self, action_id: str, owner: str, claim_ttl_s: int) -> tuple[str, str | None]:
        """("recorded", observation json), ("claimed", None) or ("busy", None)."""
        state, value = await self._begin(
            keys=[self._result_key(action_id), self._running_key(action_id)],
            args=[owner, claim_ttl_s],
        )
        state = _text(state) or "busy"
        return state, (_text(value) if state == "recorded" else None)

    async def complete(self, action_id: str, owner: str, observation_json: str) -> str:
        """Record the observation unless one is recorded, release our claim; return the record."""
        stored = await self._complete(
            keys=[self._result_key(action_id), self._running_key(action_id)],
            args=[owner, observation_json, self.ttl_s],
        )
        return _text(stored) or observation_json

    @staticmethod
    def _result_key(action_id: str) -> str:
        return f"deckhands:runtime:observation:{action_id}"

    @staticmethod
    def _running_key(action_id: str) -> str:
        return f"deckhands:runtime:running:{action_id}"

    async def result(self, action_id: str) -> str | None:
        return _text(await self.redis.get(self._result_key(action_id)))

    async def record(self, action_id: str, observation_json: str) -> str:
        """Store the observation unless one is stored; return the one that is stored."""
        key = self._result_key(action_id)
        if await self.redis.set(key, observation_json, nx=True, ex=self.ttl_s):
            return observation_json
        return _text(await self.redis.get(key)) or observation_json

    async def start(self, action_id: str) -> bool:
        """Mark the action as sent to a sandbox; False if an earlier attempt already did."""
        key = f"deckhands:runtime:started:{action_id}"
        return bool(await self.redis.set(key, "1", nx=True, ex=self.ttl_s))

    async def claim(self, action_id: str, owner: str, ttl_s: int) -> bool:
        return bool(await self.redis.set(self._running_key(action_id), owner, nx=True, ex=ttl_s))

    async def refresh(self, action_id: str, owner: str, ttl_s: int) -> None:
        await self._refresh_if(keys=[self._running_key(action_id)], args=[owner, ttl_s])

    async def running(self, action_id: str) -> bool:
        return bool(await self.redis.exists(self._running_key(action_id)))

    async def finish(self, action_id: str, owner: str) -> None:
        await self._delete_if(keys=[self._running_key(action_id)], args=[owner])
