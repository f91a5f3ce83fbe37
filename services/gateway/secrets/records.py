"""Tenants' secrets (and webhooks) outlive a Redis that loses its data: the gateway writes every
sealed record, every task's grant and every webhook to the NATS key-value bucket SECRETS_BUCKET
first (the store's
`durable`, services.gateway.tenants.records.TenantRecords on that bucket), and fills Redis again
from it when Redis lost them (its marker `deckhands:secrets-intact` is not "1": see
shared/loss_marker.py). Readers (the runtime, the controller, a checkout) read Redis only and
need no access to the bucket.

Filling never overwrites: a record Redis has (written since) wins over the bucket's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from redis.asyncio import Redis

from shared.loss_marker import LossMarker
from shared.periodic import every
from shared.secrets_store import SecretsStore

from ..tenants.records import TenantRecords
from ..webhooks.store import WebhookStore

__all__ = ["INTACT_KEY", "SecretsRefill"]

log = logging.getLogger("deckhands.gateway.secrets")

INTACT_KEY = "deckhands:secrets-intact"
_CHECK_EVERY_S = 5.0


class SecretsRefill:
    def __init__(
        self,
        redis: Redis,
        store: SecretsStore,
        webhooks: WebhookStore,
        records: TenantRecords,
        every_s: float = 0,
    ) -> None:
        self.redis = redis
        self.store = store
        self.webhooks = webhooks
        self.records = records
        self.marker = LossMarker(redis, INTACT_KEY)
        self.every_s = every_s or _CHECK_EVERY_S
        self._loop: asyncio.Task[None] | None = None

    async def refill_if_lost(self) -> int:
        """Put back what the bucket holds if Redis lost it; how many records were missing."""
        if await self.marker.intact():
            return 0
        token = await self.marker.begin_pass()
        restored = 0
        for key, value in await self.records.values(">"):
            if await self.store.restore(key, value) or await self.webhooks.restore(key, value):
                restored += 1
        await self.marker.end_pass(token)  # unless lost again meanwhile: then filled again
        if restored:
            log.warning("Redis had lost tenants' secrets: %d records put back", restored)
        return restored

    async def start(self) -> None:
        try:
            await self.refill_if_lost()
        except Exception as exc:  # NATS or Redis away: the loop tries again
            log.warning("filling Redis with the tenants' secrets failed: %s", exc)
        self._loop = asyncio.create_task(
            every(self.every_s, self.refill_if_lost, "filling Redis with the secrets", log),
            name="secrets-refill",
        )

    async def stop(self) -> None:
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(BaseException):
                await self._loop
