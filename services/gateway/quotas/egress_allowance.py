"""A tenant's egress bytes per UTC day as a quota (issue 27, item 5), the gateway's half: the
allowance published where the egress proxies read it, and a task with a network policy refused
(429) once the day's bytes reach it. The proxies count the bytes and refuse connections past the
allowance mid-task (services/egress/usage.py); the keys: shared/egress_usage.py."""

from __future__ import annotations

from datetime import datetime

from redis.asyncio import Redis

from shared.egress_usage import ALLOWANCES_KEY, egress_bytes_key, utc_day

from ..errors import QuotaExceeded
from .limits import Quotas
from .reservations import seconds_to_next_day

__all__ = ["check_egress_allowance", "egress_bytes_today", "publish_egress_allowance"]


async def publish_egress_allowance(redis: Redis, tenant_id: str, allowance: int | None) -> None:
    """Where the proxies read it; a tenant with no limit is not there."""
    if allowance is None:
        await redis.hdel(ALLOWANCES_KEY, tenant_id)
    else:
        await redis.hset(ALLOWANCES_KEY, tenant_id, str(allowance))


async def egress_bytes_today(redis: Redis, tenant_id: str, now: datetime) -> int:
    return int(await redis.get(egress_bytes_key(tenant_id, utc_day(now))) or 0)


async def check_egress_allowance(
    redis: Redis, tenant_id: str, quotas: Quotas, now: datetime
) -> None:
    """QuotaExceeded once today's bytes reached the tenant's allowance; the allowance published
    again on the way (a Redis that lost it, a limit the operator changed in the server's
    settings)."""
    allowance = quotas.max_egress_bytes_per_day
    await publish_egress_allowance(redis, tenant_id, allowance)
    if allowance is None:
        return
    used = await egress_bytes_today(redis, tenant_id, now)
    if used >= allowance:
        raise QuotaExceeded(
            "max_egress_bytes_per_day",
            allowance,
            used,
            seconds_to_next_day(now),
            f"the tenant's sandboxes moved {used} bytes through the egress proxy today, its "
            f"allowance is {allowance}; a task with a network policy may start after midnight "
            "UTC (or ask the operator for more)",
        )
