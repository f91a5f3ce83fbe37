"""The webhooks of tenants and tasks, and the record of every delivery attempt, in Redis.

Redis keys (the `deckhands:` namespace):
- `deckhands:webhook:tenant:<tenant>`: the tenant's default webhook (JSON);
- `deckhands:webhook:task:<task>`: the webhook a task was created with (its own, or the
  tenant's default at that time) and its tenant;
- `deckhands:webhook:delivery:<delivery id>`: hash, first attempt time, attempts, outcome;
- `deckhands:webhook:log:<task>`: list of attempts (JSON), newest last, at most LOG_KEPT.

The webhooks of tenants and tasks are also written first to the gateway's durable bucket
(`durable`: SECRETS_BUCKET, as `webhook-tenant.<tenant>` and `webhook-task.<task>`), from which
a Redis that lost its data is filled again (services/gateway/secrets/records.py); the delivery
records and log are Redis's only.
"""

from __future__ import annotations

import time

from pydantic import BaseModel, ConfigDict
from redis.asyncio import Redis

from shared.secrets_store import SecretsDurable

from .models import DeliveryAttempt, WebhookSpec

__all__ = ["LOG_KEPT", "DeliveryRecord", "TaskWebhook", "WebhookStore"]

LOG_KEPT = 200
_TTL_S = 30 * 86_400  # as long as the event log keeps a task's events
_PREFIX = "deckhands"


class TaskWebhook(BaseModel):
    """The webhook a task notifies, fixed when the task is created."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tenant_id: str
    spec: WebhookSpec


class DeliveryRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    first_attempt_at: float  # unix time
    attempts: int
    done: bool


class WebhookStore:
    def __init__(
        self, redis: Redis, prefix: str = _PREFIX, durable: SecretsDurable | None = None
    ) -> None:
        self.redis = redis
        self.prefix = prefix
        self.durable = durable

    def _tenant(self, tenant_id: str) -> str:
        return f"{self.prefix}:webhook:tenant:{tenant_id}"

    def _task(self, task_id: str) -> str:
        return f"{self.prefix}:webhook:task:{task_id}"

    def _delivery(self, delivery_id: str) -> str:
        return f"{self.prefix}:webhook:delivery:{delivery_id}"

    def _log(self, task_id: str) -> str:
        return f"{self.prefix}:webhook:log:{task_id}"

    # -- the tenant's default

    async def set_default(self, tenant_id: str, spec: WebhookSpec) -> None:
        raw = spec.model_dump_json()
        if self.durable is not None:
            await self.durable.put(f"webhook-tenant.{tenant_id}", raw.encode())
        await self.redis.set(self._tenant(tenant_id), raw)

    async def default(self, tenant_id: str) -> WebhookSpec | None:
        raw = await self.redis.get(self._tenant(tenant_id))
        return None if raw is None else WebhookSpec.model_validate_json(raw)

    async def clear_default(self, tenant_id: str) -> bool:
        if self.durable is not None:
            await self.durable.delete(f"webhook-tenant.{tenant_id}")
        return bool(await self.redis.delete(self._tenant(tenant_id)))

    # -- a task's

    async def attach(self, task_id: str, tenant_id: str, spec: WebhookSpec) -> None:
        raw = TaskWebhook(tenant_id=tenant_id, spec=spec).model_dump_json()
        if self.durable is not None:
            await self.durable.put(f"webhook-task.{task_id}", raw.encode())
        await self.redis.set(self._task(task_id), raw, ex=_TTL_S)

    async def of_task(self, task_id: str) -> TaskWebhook | None:
        raw = await self.redis.get(self._task(task_id))
        return None if raw is None else TaskWebhook.model_validate_json(raw)

    async def forget_task(self, task_id: str) -> None:
        if self.durable is not None:
            await self.durable.delete(f"webhook-task.{task_id}")
        await self.redis.delete(self._task(task_id), self._log(task_id))

    async def restore(self, key: str, value: bytes) -> bool:
        """Put back one durable record unless Redis has one; whether it was missing."""
        kind, _, owner = key.partition(".")
        if kind == "webhook-tenant":
            return bool(await self.redis.set(self._tenant(owner), value, nx=True))
        if kind == "webhook-task":
            return bool(await self.redis.set(self._task(owner), value, nx=True, ex=_TTL_S))
        return False

    # -- deliveries

    async def delivery(self, delivery_id: str) -> DeliveryRecord | None:
        raw = await self.redis.hgetall(self._delivery(delivery_id))
        if not raw:
            return None
        fields = {_text(k): _text(v) for k, v in raw.items()}
        return DeliveryRecord(
            first_attempt_at=float(fields.get("first", "0")),
            attempts=int(fields.get("attempts", "0")),
            done=fields.get("done") == "1",
        )

    async def begin_attempt(self, delivery_id: str) -> DeliveryRecord:
        """Count one more attempt (the first sets the clock of the deadline)."""
        key = self._delivery(delivery_id)
        async with self.redis.pipeline(transaction=True) as tx:
            tx.hsetnx(key, "first", repr(time.time()))
            tx.hincrby(key, "attempts", 1)
            tx.expire(key, _TTL_S)
            tx.hgetall(key)
            *_, raw = await tx.execute()
        fields = {_text(k): _text(v) for k, v in raw.items()}
        return DeliveryRecord(
            first_attempt_at=float(fields["first"]),
            attempts=int(fields["attempts"]),
            done=fields.get("done") == "1",
        )

    async def record(self, task_id: str, attempt: DeliveryAttempt) -> None:
        """Log the attempt; a delivered or abandoned notification is done (never sent again)."""
        async with self.redis.pipeline(transaction=True) as tx:
            tx.rpush(self._log(task_id), attempt.model_dump_json())
            tx.ltrim(self._log(task_id), -LOG_KEPT, -1)
            tx.expire(self._log(task_id), _TTL_S)
            if attempt.outcome != "retrying":
                tx.hset(self._delivery(attempt.delivery_id), "done", "1")
            await tx.execute()

    async def attempts(self, task_id: str) -> list[DeliveryAttempt]:
        raws = await self.redis.lrange(self._log(task_id), 0, -1)
        return [DeliveryAttempt.model_validate_json(raw) for raw in raws]


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
