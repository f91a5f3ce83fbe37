"""Tenants and their API keys, kept in Redis by the gateway, which alone reads and writes them.

Keys in Redis (the `deckhands:` namespace the State store also uses):
- `deckhands:tenants`: sorted set of tenant ids, scored by creation time (the admin list);
- `deckhands:tenant:<id>`: the tenant (JSON);
- `deckhands:tenant:<id>:keys`: sorted set of the tenant's key prefixes, by creation time;
- `deckhands:apikey:<prefix>`: a key's record (JSON), kept after revocation for the listing;
- `deckhands:apikey-hash:<sha256>`: the credential itself, the one key a request looks up;
  revocation deletes it, so a revoked key fails from the next request on, on every replica.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field
from redis.asyncio import Redis
from redis.exceptions import RedisError

from shared.events import utc_now

from .api_keys import hash_api_key, issue_api_key, key_prefix_of
from .errors import ApiKeyNotFound, StorageUnavailable, TenantExists, TenantNotFound

__all__ = ["TENANT_ID_PATTERN", "ApiKeyRecord", "Caller", "NewApiKey", "Tenant", "TenantStore"]

TENANT_ID_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
_PREFIX = "deckhands"


class Tenant(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(pattern=TENANT_ID_PATTERN)
    name: str
    created_at: datetime = Field(default_factory=utc_now)


class ApiKeyRecord(BaseModel):
    """What is kept of a key: never the key itself."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prefix: str
    tenant_id: str
    name: str
    key_hash: str
    created_at: datetime = Field(default_factory=utc_now)
    revoked_at: datetime | None = None


class _Credential(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    prefix: str
    tenant_id: str


@dataclass(frozen=True)
class Caller:
    """Who a request authenticated as."""

    tenant_id: str
    key_prefix: str


@dataclass(frozen=True)
class NewApiKey:
    record: ApiKeyRecord
    key: str  # shown once, in the answer that creates it


class TenantStore:
    def __init__(self, redis: Redis, prefix: str = _PREFIX) -> None:
        self.redis = redis
        self.prefix = prefix

    def _tenants(self) -> str:
        return f"{self.prefix}:tenants"

    def _tenant(self, tenant_id: str) -> str:
        return f"{self.prefix}:tenant:{tenant_id}"

    def _tenant_keys(self, tenant_id: str) -> str:
        return f"{self.prefix}:tenant:{tenant_id}:keys"

    def _key_record(self, prefix: str) -> str:
        return f"{self.prefix}:apikey:{prefix}"

    def _credential(self, key_hash: str) -> str:
        return f"{self.prefix}:apikey-hash:{key_hash}"

    async def authenticate(self, key: str) -> Caller | None:
        """The caller a key belongs to; None if it is malformed, unknown or revoked."""
        prefix = key_prefix_of(key)
        if prefix is None:
            return None
        try:
            raw = await self.redis.get(self._credential(hash_api_key(key)))
        except RedisError as exc:
            raise StorageUnavailable(f"API key store (Redis) unavailable: {exc}") from exc
        if raw is None:
            return None
        credential = _Credential.model_validate_json(raw)
        if credential.prefix != prefix:  # cannot happen short of a hash collision
            return None
        return Caller(tenant_id=credential.tenant_id, key_prefix=prefix)

    async def create_tenant(self, tenant_id: str, name: str) -> Tenant:
        tenant = Tenant(id=tenant_id, name=name)
        try:
            if not await self.redis.set(self._tenant(tenant_id), tenant.model_dump_json(), nx=True):
                raise TenantExists(tenant_id)
            await self.redis.zadd(self._tenants(), {tenant_id: tenant.created_at.timestamp()})
        except RedisError as exc:
            raise StorageUnavailable(f"tenant store (Redis) unavailable: {exc}") from exc
        return tenant

    async def get_tenant(self, tenant_id: str) -> Tenant:
        try:
            raw = await self.redis.get(self._tenant(tenant_id))
        except RedisError as exc:
            raise StorageUnavailable(f"tenant store (Redis) unavailable: {exc}") from exc
        if raw is None:
            raise TenantNotFound(tenant_id)
        return Tenant.model_validate_json(raw)

    async def list_tenants(self) -> list[Tenant]:
        try:
            ids = await self.redis.zrange(self._tenants(), 0, -1)
            raws = await self.redis.mget([self._tenant(_text(i)) for i in ids]) if ids else []
        except RedisError as exc:
            raise StorageUnavailable(f"tenant store (Redis) unavailable: {exc}") from exc
        return [Tenant.model_validate_json(raw) for raw in raws if raw is not None]

    async def issue_key(self, tenant_id: str, name: str) -> NewApiKey:
        await self.get_tenant(tenant_id)
        issued = issue_api_key()
        record = ApiKeyRecord(
            prefix=issued.prefix, tenant_id=tenant_id, name=name, key_hash=issued.key_hash
        )
        credential = _Credential(prefix=issued.prefix, tenant_id=tenant_id)
        try:
            async with self.redis.pipeline(transaction=True) as tx:
                tx.set(self._key_record(issued.prefix), record.model_dump_json())
                tx.zadd(
                    self._tenant_keys(tenant_id), {issued.prefix: record.created_at.timestamp()}
                )
                tx.set(self._credential(issued.key_hash), credential.model_dump_json())
                await tx.execute()
        except RedisError as exc:
            raise StorageUnavailable(f"API key store (Redis) unavailable: {exc}") from exc
        return NewApiKey(record=record, key=issued.key)

    async def list_keys(self, tenant_id: str) -> list[ApiKeyRecord]:
        await self.get_tenant(tenant_id)
        try:
            prefixes = await self.redis.zrange(self._tenant_keys(tenant_id), 0, -1)
            raws = (
                await self.redis.mget([self._key_record(_text(p)) for p in prefixes])
                if prefixes
                else []
            )
        except RedisError as exc:
            raise StorageUnavailable(f"API key store (Redis) unavailable: {exc}") from exc
        return [ApiKeyRecord.model_validate_json(raw) for raw in raws if raw is not None]

    async def revoke_key(self, tenant_id: str, prefix: str) -> ApiKeyRecord:
        """Revoke a key (again: a no-op); its record stays, with the time of revocation."""
        try:
            raw = await self.redis.get(self._key_record(prefix))
            record = None if raw is None else ApiKeyRecord.model_validate_json(raw)
            if record is None or record.tenant_id != tenant_id:
                raise ApiKeyNotFound(tenant_id, prefix)
            if record.revoked_at is not None:
                return record
            revoked = record.model_copy(update={"revoked_at": utc_now()})
            async with self.redis.pipeline(transaction=True) as tx:
                tx.delete(self._credential(record.key_hash))
                tx.set(self._key_record(prefix), revoked.model_dump_json())
                await tx.execute()
        except RedisError as exc:
            raise StorageUnavailable(f"API key store (Redis) unavailable: {exc}") from exc
        return revoked


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
