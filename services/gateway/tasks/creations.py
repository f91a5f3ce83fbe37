"""Tasks the gateway accepted and asked the controller to make, shown until their State exists.

Only the controller writes a task's State (shared/task_creation.py): the gateway sends it a
creation request and answers 202 at once. Until the controller has taken the request (a few
milliseconds; longer when it is busy or down), the task has no State, yet its owner sees it:
the gateway keeps the request it sent (`deckhands:task-creation:<id>`, a hash: the request as
JSON, and `unqueued`, why it could not be sent) and shows the State the controller will make of
it. `TaskViews` is the State store as the gateway reads it: the controller's State, else that.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from shared.events import AgentState, TaskCreatedObservation
from shared.state import TaskState
from shared.state_store import TaskStateStore
from shared.task_creation import (
    CREATION_KEPT_S,
    CREATION_REQUEST,
    UNQUEUED,
    creation_key,
    state_from_created,
)

__all__ = ["TaskCreations", "TaskViews"]


class TaskCreations:
    def __init__(self, redis: Redis) -> None:
        self.redis = redis

    async def put(self, request: TaskCreatedObservation) -> TaskCreatedObservation:
        """Keep the request, unless one for the same task is kept already (a concurrent request
        with the same Idempotency-Key): then that one, which is what the controller makes."""
        async with self.redis.pipeline(transaction=True) as tx:
            self.put_in(tx, request)
            return self.kept(await tx.execute())

    @staticmethod
    def put_in(tx: Pipeline, request: TaskCreatedObservation) -> None:
        """Queue `put` on a transaction (the task's record goes in the same one); its answers,
        the last PUT_REPLIES of the transaction's, make `kept`."""
        key = creation_key(request.task_id)
        tx.hsetnx(key, CREATION_REQUEST, request.model_dump_json())
        tx.hget(key, CREATION_REQUEST)
        tx.expire(key, CREATION_KEPT_S)

    PUT_REPLIES = 3

    @staticmethod
    def kept(replies: list[Any]) -> TaskCreatedObservation:
        """The request kept, from the answers to what put_in queued (the last ones)."""
        _, kept, _ = replies[-TaskCreations.PUT_REPLIES :]
        return TaskCreatedObservation.model_validate_json(kept)

    async def mark_unqueued(self, task_id: str, reason: str) -> None:
        """The request could not be sent: the task shows as failed, with `reason`."""
        key = creation_key(task_id)
        async with self.redis.pipeline(transaction=True) as tx:
            tx.hset(key, UNQUEUED, reason)
            tx.expire(key, CREATION_KEPT_S)
            await tx.execute()

    async def views(self, task_ids: list[str]) -> list[TaskState | None]:
        """The State each task's kept request makes (None where none is kept), in one round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for task_id in task_ids:
                pipe.hmget(creation_key(task_id), [CREATION_REQUEST, UNQUEUED])
            rows = await pipe.execute()
        return [_view(request, unqueued) for request, unqueued in rows]

    async def forget(self, task_id: str) -> None:
        await self.redis.delete(creation_key(task_id))


def _view(request: bytes | str | None, unqueued: bytes | str | None) -> TaskState | None:
    if request is None:
        return None
    state = state_from_created(TaskCreatedObservation.model_validate_json(request))
    if unqueued is None:
        return state
    reason = unqueued.decode() if isinstance(unqueued, bytes) else unqueued
    return state.model_copy(update={"agent_state": AgentState.ERROR, "reason": reason})


class TaskViews(TaskStateStore):
    """A task's State as the gateway shows it: the controller's, or while the controller has
    not made it yet, the State its creation request makes (version 0: not written yet)."""

    def __init__(self, redis: Redis, creations: TaskCreations | None = None) -> None:
        super().__init__(redis)
        self.creations = creations or TaskCreations(redis)

    async def load(self, task_id: str) -> TaskState | None:
        state = await super().load(task_id)
        if state is not None:
            return state
        return (await self.creations.views([task_id]))[0]

    async def load_many(self, task_ids: list[str]) -> list[TaskState | None]:
        states = await super().load_many(task_ids)
        missing = [task_id for task_id, state in zip(task_ids, states, strict=True) if not state]
        if not missing:
            return states
        views = dict(zip(missing, await self.creations.views(missing), strict=True))
        return [state or views[task_id] for task_id, state in zip(task_ids, states, strict=True)]

    # Only the controller writes States (shared/redis_records.py; Redis refuses the gateway's
    # user too): the writes of the store it reads through are not the gateway's to call.

    async def save(self, state: TaskState, new_version: int | None = None) -> TaskState:
        raise _not_ours("save")

    async def create(self, state: TaskState, version: int = 1) -> bool:
        raise _not_ours("create")

    async def delete(self, task_id: str) -> None:
        raise _not_ours("delete")

    async def postpone(self, task_id: str, deadline: float, until: float) -> bool:
        raise _not_ours("postpone")

    async def mark_intact(self) -> None:
        raise _not_ours("mark_intact")


def _not_ours(method: str) -> TypeError:
    return TypeError(f"TaskViews.{method}: only the controller writes a task's State")
