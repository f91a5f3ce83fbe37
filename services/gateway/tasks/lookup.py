"""Finding a tenant's task: the lookups every route of /v1/tasks starts with."""

from __future__ import annotations

import asyncio

from redis.exceptions import RedisError

from shared.admission import QueuePlace, queue_place
from shared.events import TERMINAL_STATES
from shared.state import TaskState

from ..errors import StorageUnavailable, TaskNotFound
from ..quotas.service import TenantQuotas
from ..workspace.repositories import RepositoryCheck
from .attachments import TaskAttachments
from .creations import TaskViews
from .idempotency import IdempotencyKeys
from .records import TaskRecord, TaskRecords
from .values import OwnedTask, valid_task_id

__all__ = ["TaskLookup"]

# A sub-task belongs to its root task's tenant; delegation is far shallower than this.
_MAX_DELEGATION_DEPTH = 64


class TaskLookup:
    """A tenant's task found (another tenant's is not found), its owner walked up to its root,
    its place in the queue, and the gateway's record of it dropped. The base of TaskService,
    which holds what it uses."""

    store: TaskViews
    records: TaskRecords
    idempotency: IdempotencyKeys
    quotas: TenantQuotas
    pool_name: str
    repositories: RepositoryCheck | None
    attachments: TaskAttachments | None

    async def queue_place(self, state: TaskState) -> QueuePlace | None:
        """The task's place in the queue for a sandbox, while it waits for one (its first
        action, or its sandbox prepared while the agent thinks)."""
        if state.agent_state in TERMINAL_STATES:
            return None
        try:
            return await queue_place(self.store.redis, self.pool_name, state.task_id)
        except RedisError as exc:
            raise StorageUnavailable(f"task state store (Redis) unavailable: {exc}") from exc

    async def get(self, task_id: str, tenant_id: str) -> TaskState:
        return (await self.get_owned(task_id, tenant_id)).state

    async def get_owned(self, task_id: str, tenant_id: str) -> OwnedTask:
        """The task, if it is the tenant's. Another tenant's task is not found, exactly like a
        task that does not exist: its id tells a caller nothing."""
        if not valid_task_id(task_id):
            raise TaskNotFound(task_id)
        try:
            state, record = await asyncio.gather(
                self.store.load(task_id), self.records.cached(task_id)
            )
            if state is not None and record is None and state.parent_task_id is None:
                record = await self.records.get(task_id)  # Redis lost it: the durable copy
            owner = None if state is None else await self._owner(state, record)
            if state is None and not await self.store.intact():
                await self._restoring(task_id, tenant_id, record)
        except RedisError as exc:
            raise StorageUnavailable(f"task state store (Redis) unavailable: {exc}") from exc
        if state is None or owner != tenant_id:
            raise TaskNotFound(task_id)
        return OwnedTask(state, record)

    async def _restoring(self, task_id: str, tenant_id: str, record: TaskRecord | None) -> None:
        """Redis lost its data and the controller has not rebuilt every State from the logs
        yet: a task of the caller's (its durable record says so) is being restored, not gone."""
        record = record or await self.records.get(task_id)
        if record is not None and record.tenant_id == tenant_id:
            raise StorageUnavailable(
                f"task {task_id} is being restored from its log after the task state store "
                "lost its data; ask again shortly"
            )

    async def _owner(self, state: TaskState, record: TaskRecord | None) -> str | None:
        """The tenant of a task: its record's, or for a sub-task its root task's."""
        walked = False
        for _ in range(_MAX_DELEGATION_DEPTH):
            if record is not None:
                return record.tenant_id
            parent_id = state.parent_task_id
            if parent_id is None:
                if walked:  # the root's record, which Redis may have lost
                    root = await self.records.get(state.task_id)
                    return None if root is None else root.tenant_id
                return None  # made before tenants existed, or by hand: nobody's
            walked = True
            record = await self.records.cached(parent_id)
            if record is None:
                parent = await self.store.load(parent_id)
                if parent is None:
                    return None
                state = parent
        return None

    async def get_with_sub_tasks(
        self, task_id: str, tenant_id: str
    ) -> tuple[OwnedTask, list[TaskState]]:
        """The task and the sub-tasks it delegated (those whose State exists)."""
        owned = await self.get_owned(task_id, tenant_id)
        subs = [await self._load(sub_id) for sub_id in owned.state.sub_tasks]
        return owned, [sub for sub in subs if sub is not None]

    async def forget(self, task_id: str, record: TaskRecord) -> None:
        """Drop the gateway's record of a deleted task (the last of it to go) and free the
        Idempotency-Key it was created with."""
        if record.idempotency_key is not None:
            await self.idempotency.release(record.tenant_id, record.idempotency_key)
        await self.quotas.forget(record.tenant_id, task_id)
        if self.repositories is not None:
            await self.repositories.forget(task_id)
        if self.attachments is not None:
            await self.attachments.forget(task_id)
        await self.records.remove(task_id, record)

    async def _load(self, task_id: str) -> TaskState | None:
        try:
            return await self.store.load(task_id)
        except RedisError as exc:
            raise StorageUnavailable(f"task state store (Redis) unavailable: {exc}") from exc
