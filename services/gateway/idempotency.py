"""Idempotency-Key: one namespace per tenant, each key bound to the whole request it came with.

`deckhands:idempotency:<tenant>:<key>` holds the request's fingerprint (a SHA-256 of its route,
its target and its body) and what it produced (a task id, an event id). The same request again
gets the same result; another request with the same key is a client bug and is refused (422)
rather than silently answered with the first request's result. Two tenants never share a key.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict
from redis.asyncio import Redis

from .errors import IdempotencyConflict

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


class IdempotencyKeys:
    def __init__(self, redis: Redis, ttl_s: int, prefix: str = _PREFIX) -> None:
        self.redis = redis
        self.ttl_s = ttl_s
        self.prefix = prefix

    def _key(self, tenant_id: str, key: str) -> str:
        return f"{self.prefix}:idempotency:{tenant_id}:{key}"

    async def claim(self, tenant_id: str, key: str, fingerprint: str, result: str) -> str:
        """Bind `key` to this request and `result` unless it is bound already; the result the
        key is bound to. IdempotencyConflict if it was used for another request."""
        binding = _Binding(fingerprint=fingerprint, result=result)
        redis_key = self._key(tenant_id, key)
        if await self.redis.set(redis_key, binding.model_dump_json(), nx=True, ex=self.ttl_s):
            return result
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

    async def release(self, tenant_id: str, key: str) -> None:
        await self.redis.delete(self._key(tenant_id, key))
