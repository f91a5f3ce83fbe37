"""The bytes checkpoints take in the store, per task and per tenant (issue 28), in Redis.

The runtime alone writes these records: it adds what each checkpoint stored, and takes a
deleted task's bytes off its tenant's count. A Redis that lost them counts from zero again
(the store's own max_bytes still bounds everything).
"""

from __future__ import annotations

from redis.asyncio import Redis

from .checkpoint_point import CheckpointPoint
from .settings import RuntimeSettings

__all__ = ["CheckpointQuota", "QuotaUsed"]

_TASK_BYTES = "deckhands:checkpoint-bytes:task"  # hash: task -> bytes in the store
_TENANT_BYTES = "deckhands:checkpoint-bytes:tenant"  # hash: tenant -> bytes in the store
_TASK_TENANT = "deckhands:checkpoint-bytes:task-tenant"  # hash: task -> its tenant


class QuotaUsed(Exception):
    """Storing `adding` more bytes would pass the task's or its tenant's bound."""


class CheckpointQuota:
    def __init__(self, redis: Redis, settings: RuntimeSettings) -> None:
        self.redis = redis
        self.settings = settings

    async def check(self, command: CheckpointPoint, adding: int) -> None:
        s = self.settings
        task_bytes = int(await self.redis.hget(_TASK_BYTES, command.task_id) or 0)
        if task_bytes + adding > s.checkpoint_task_max_bytes:
            raise QuotaUsed(
                f"the task's checkpoints would take more than {s.checkpoint_task_max_bytes} "
                "bytes (DECKHANDS_CHECKPOINT_TASK_MAX_BYTES)"
            )
        if command.tenant_id:
            tenant_bytes = int(await self.redis.hget(_TENANT_BYTES, command.tenant_id) or 0)
            if tenant_bytes + adding > s.checkpoint_tenant_max_bytes:
                raise QuotaUsed(
                    "the tenant's checkpoints would take more than "
                    f"{s.checkpoint_tenant_max_bytes} bytes "
                    "(DECKHANDS_CHECKPOINT_TENANT_MAX_BYTES)"
                )

    async def add(self, command: CheckpointPoint, stored: int) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hincrby(_TASK_BYTES, command.task_id, stored)
            if command.tenant_id:
                pipe.hincrby(_TENANT_BYTES, command.tenant_id, stored)
                pipe.hset(_TASK_TENANT, command.task_id, command.tenant_id)
            await pipe.execute()

    async def forget(self, task_id: str) -> None:
        """The task was deleted: its bytes leave its tenant's count."""
        stored = int(await self.redis.hget(_TASK_BYTES, task_id) or 0)
        tenant = await self.redis.hget(_TASK_TENANT, task_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            if tenant is not None and stored:
                name = tenant if isinstance(tenant, str) else tenant.decode()
                pipe.hincrby(_TENANT_BYTES, name, -stored)
            pipe.hdel(_TASK_BYTES, task_id)
            pipe.hdel(_TASK_TENANT, task_id)
            await pipe.execute()
