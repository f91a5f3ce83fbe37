"""Whether the gateway can serve: NATS connected and Redis answering."""

from __future__ import annotations

import asyncio

from faststream.nats import NatsBroker
from redis.asyncio import Redis

from .models import ReadinessReport

__all__ = ["ReadinessService"]


class ReadinessService:
    def __init__(self, broker: NatsBroker, redis: Redis, *, timeout_s: float) -> None:
        self.broker = broker
        self.redis = redis
        self.timeout_s = timeout_s

    async def _nats(self) -> str:
        try:
            connection = self.broker.connection
        except Exception:
            return "error: not connected"
        if not connection.is_connected:
            suffix = " (reconnecting)" if connection.is_reconnecting else ""
            return f"error: not connected{suffix}"
        try:
            # A round trip proves the server still answers, not just that a socket is open.
            await connection.flush(timeout=self.timeout_s)  # type: ignore[arg-type]
        except Exception as exc:
            return f"error: {type(exc).__name__}: {exc}".strip()
        return "ok"

    async def _redis(self) -> str:
        try:
            await asyncio.wait_for(self.redis.ping(), self.timeout_s)
        except Exception as exc:
            return f"error: {type(exc).__name__}: {exc}".strip()
        return "ok"

    async def check(self) -> ReadinessReport:
        nats_status, redis_status = await asyncio.gather(self._nats(), self._redis())
        checks = {"nats": nats_status, "redis": redis_status}
        return ReadinessReport(ready=all(v == "ok" for v in checks.values()), checks=checks)
