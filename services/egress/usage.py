"""A tenant's egress bytes per UTC day (issue 27, item 5), the proxy's half: every byte relayed
is counted here, added to the tenant's day in Redis about once a second (every replica adds its
own), and held to the allowance the gateway publishes (shared/egress_usage.py). Past it, a new
connection is refused with a 429 that says so, and one in progress is cut: the tenant's tasks
learn it at once, not at the next admission. Relaying never waits for Redis: a replica that
cannot reach it goes on with what it last knew.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from redis.asyncio import Redis
from redis.exceptions import RedisError

from shared.egress_usage import ALLOWANCES_KEY, BYTES_KEPT_S, egress_bytes_key, utc_day
from shared.events import utc_now

__all__ = ["EgressUsage"]

log = logging.getLogger("deckhands.egress")

_SEEN_S = 120.0  # a tenant with no traffic for this long is no longer read back


class EgressUsage:
    def __init__(self, redis: Redis | None, interval_s: float = 1.0) -> None:
        self.redis = redis
        self.interval_s = interval_s
        self._pending: dict[str, int] = {}  # bytes not yet added to Redis
        self._used: dict[str, int] = {}  # the day's total, as last read back
        self._seen: dict[str, float] = {}
        self._allowances: dict[str, int] = {}
        self._day = utc_day(utc_now())

    def add(self, tenant: str, count: int) -> None:
        self._pending[tenant] = self._pending.get(tenant, 0) + count
        self._seen[tenant] = time.monotonic()

    def allowance_used(self, tenant: str) -> int | None:
        """The tenant's allowance if its bytes today reached it (else None)."""
        allowance = self._allowances.get(tenant)
        if allowance is None:
            return None
        used = self._used.get(tenant, 0) + self._pending.get(tenant, 0)
        return allowance if used >= allowance else None

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            with contextlib.suppress(RedisError, OSError):
                await self.flush()

    async def flush(self) -> None:
        """Add what was relayed since the last flush to each tenant's day, read the totals and
        the allowances back."""
        if self.redis is None:
            return
        day = utc_day(utc_now())
        if day != self._day:  # a new day: yesterday's totals no longer count
            self._day, self._used = day, {}
        now = time.monotonic()
        tenants = [t for t, at in self._seen.items() if now - at < _SEEN_S]
        self._seen = {t: self._seen[t] for t in tenants}
        pending, self._pending = self._pending, {}
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for tenant in tenants:
                    key = egress_bytes_key(tenant, day)
                    pipe.incrby(key, pending.get(tenant, 0))
                    pipe.expire(key, BYTES_KEPT_S)
                pipe.hgetall(ALLOWANCES_KEY)
                answers = await pipe.execute()
        except (RedisError, OSError) as exc:
            for tenant, count in pending.items():  # counted at the next flush instead
                self._pending[tenant] = self._pending.get(tenant, 0) + count
            log.warning("egress bytes not counted in Redis yet: %s", exc)
            raise
        for tenant, total in zip(tenants, answers[0:-1:2], strict=True):
            self._used[tenant] = int(total)
        self._allowances = {_text(t): int(v) for t, v in answers[-1].items()}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
