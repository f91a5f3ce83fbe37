"""Idempotency-Key: one namespace per tenant, each key bound to the whole request it came with.

`deckhands:idempotency:<tenant>:<key>` holds the request's fingerprint (a SHA-256 of its route,
its target and its body) and what it produced (a task id, an event id). The same request again
gets the same result; another request with the same key is a client bug and is refused (422)
rather than silently answered with the first request's result. Two tenants never share a key.

Durable in NATS key-value (`idem.<tenant>.<sha256 of the key>` in the tenants bucket), with
the time it expires: a retry after Redis lost its data still finds the task it made instead of
making a second one. Redis answers the retries it still holds.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from pydantic import BaseModel, ConfigDict
from redis.asyncio import Redis

from ..errors import IdempotencyConflict
from ..tenants.records import TenantRecords

__all__ = ["IdempotencyKeys", "request_fingerprint"]

_PREFIX = "deckhands"


def request_fingerprint(route: str, *parts: Any) -> str:
    """A digest of everything that makes a request what it is (canonical JSON of its parts)."""
    canonical = json.dumps([route, *parts], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


class _Binding(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    fingerprint: str
    result: str
    expires_at: float | None = None  # epoch seconds; set in the durable copy


class IdempotencyKeys:
    def __init__(
        self,
        redis: Redis,
        ttl_s: int,
        prefix: str = _PREFIX,
        durable: TenantRecords | None = None,
    ) -> None:
        self.redis = redis
        self.ttl_s = ttl_s
        self.prefix = prefix
        self.durable = durable

    def _key(self, tenant_id: str, key: str) -> str:
        return f"{self.prefix}:idempotency:{tenant_id}:{key}"

    @staticmethod
    def _durable_key(tenant_id: str, key: str) -> str:
        return f"idem.{tenant_id}.{hashlib.sha256(key.encode()).hexdigest()}"

    async def claim(self, tenant_id: str, key: str, fingerprint: str, result: str) -> str:
        """Bind `key` to this request and `result` unless it is bound already; the result the
        key is bound to. IdempotencyConflict if it was used for another request."""
        binding = _Binding(fingerprint=fingerprint, result=result)
        redis_key = self._key(tenant_id, key)
        if await self.redis.set(redis_key, binding.model_dump_json(), nx=True, ex=self.ttl_s):
            bound = await self._claim_durable(tenant_id, key, binding)
            if bound is not binding:  # bound before Redis lost it: that binding holds
                await self.redis.set(redis_key, bound.model_dump_json(), ex=self.ttl_s)
        else:
            raw = await self.redis.get(redis_key)
            if raw is None:  # expired between the two commands: bind it now
                return await self.claim(tenant_id, key, fingerprint, result)
            bound = _Binding.model_validate_json(raw)
        if bound.fingerprint != fingerprint:
            raise IdempotencyConflict(
                "this Idempotency-Key was already used for a different request; "
                "use a new key for a new request"
            )
        return bound.result

    async def _claim_durable(self, tenant_id: str, key: str, binding: _Binding) -> _Binding:
        """The durable binding: `binding` if the key had none (or an expired one), else the
        one it had."""
        if self.durable is None:
            return binding
        durable_key = self._durable_key(tenant_id, key)
        stored = binding.model_copy(update={"expires_at": time.time() + self.ttl_s})
        value = stored.model_dump_json().encode()
        for _ in range(5):
            if await self.durable.create(durable_key, value):
                return binding
            entry = await self.durable.entry(durable_key)
            if entry is None:
                continue  # released meanwhile: create it again
            raw, revision = entry
            held = _Binding.model_validate_json(raw)
            if held.expires_at is None or held.expires_at > time.time():
                return held
            if await self.durable.replace(durable_key, value, revision):
                return binding
        raise RuntimeError(f"Idempotency-Key of tenant {tenant_id}: kept changing under 5 tries")

    async def release(self, tenant_id: str, key: str) -> None:
        if self.durable is not None:
            await self.durable.delete(self._durable_key(tenant_id, key))
        await self.redis.delete(self._key(tenant_id, key))
