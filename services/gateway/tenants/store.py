"""Tenants and their API keys: kept durably in the NATS key-value bucket of TenantRecords (the
source of truth), cached in Redis for the one lookup every request makes.

What Redis holds (the `deckhands:` namespace the State store also uses), each a cache refilled
from the bucket on a miss, so a Redis that lost its data (FLUSHALL, a restart without its
files) loses nothing:
- `deckhands:apikey-hash:<sha256>`: the credential a request looks up (`-` for a key the bucket
  does not know, for a minute); revocation deletes it, so a revoked key fails from the next
  request on, on every replica;
- `deckhands:tenant:<id>`: the tenant, with whether it is disabled or deleted;
- `deckhands:apikey-used:<prefix>`: when a key was last used (Redis only, at most one write a
  minute per key and gateway; it is lost with Redis).

Every write goes to the bucket first, then to Redis: a write that fails half-way leaves the
bucket right and is repeated by retrying the request. Listings read the bucket.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field
from redis.asyncio import Redis
from redis.exceptions import RedisError

from shared.events import utc_now

from ..errors import (
    ApiKeyNotFound,
    GatewayError,
    StorageUnavailable,
    TenantExists,
    TenantNotFound,
)
from .api_keys import hash_api_key, issue_api_key, key_prefix_of
from .credential_read import credential_and_tenant
from .records import TenantRecords

__all__ = [
    "TENANT_ID_PATTERN",
    "ApiKeyRecord",
    "Caller",
    "LastKey",
    "NewApiKey",
    "Tenant",
    "TenantDisabled",
    "TenantStore",
    "TooManyKeys",
]

TENANT_ID_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
_PREFIX = "deckhands"
_UNKNOWN = b"-"
_UNKNOWN_TTL_S = 60
# Cached entries expire, so that one written from the bucket just as a revocation (or a tenant's
# disabling) removed it lasts minutes at most; an active key costs one bucket read per period.
_CACHED_TTL_S = 600
_USED_EVERY_S = 60.0


class TenantDisabled(GatewayError):
    """The key is right, but its tenant was disabled by the operator: 403, naming why."""

    status_code = 403


class TooManyKeys(GatewayError):
    """The tenant holds as many working keys as it may: 409 until one is revoked."""

    status_code = 409


class LastKey(GatewayError):
    """Revoking the tenant's last working key would lock it out: 409 unless forced."""

    status_code = 409


class Tenant(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(pattern=TENANT_ID_PATTERN)
    name: str
    created_at: datetime = Field(default_factory=utc_now)
    disabled_at: datetime | None = None
    disabled_reason: str | None = None
    deleted_at: datetime | None = None


class ApiKeyRecord(BaseModel):
    """What is kept of a key: never the key itself."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prefix: str
    tenant_id: str
    name: str
    key_hash: str
    created_at: datetime = Field(default_factory=utc_now)
    revoked_at: datetime | None = None
    created_by: str | None = Field(
        default=None, description="The key that created it (self-service); None: the admin."
    )


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


def _tenant_record(tenant_id: str) -> str:
    return f"tenant.{tenant_id}"


def _key_record(tenant_id: str, prefix: str) -> str:
    return f"apikey.{tenant_id}.{prefix}"


def _credential_record(key_hash: str) -> str:
    return f"credential.{key_hash}"


class TenantStore:
    def __init__(
        self,
        redis: Redis,
        records: TenantRecords,
        prefix: str = _PREFIX,
        *,
        max_keys: int = 20,
    ) -> None:
        self.redis = redis
        self.records = records
        self.prefix = prefix
        self.max_keys = max_keys
        self._used_written: dict[str, float] = {}

    def _tenant(self, tenant_id: str) -> str:
        return f"{self.prefix}:tenant:{tenant_id}"

    def _credential(self, key_hash: str) -> str:
        return f"{self.prefix}:apikey-hash:{key_hash}"

    def _used(self, prefix: str) -> str:
        return f"{self.prefix}:apikey-used:{prefix}"

    # -- the request path

    async def authenticate(self, key: str) -> Caller | None:
        """The caller a key belongs to; None if it is malformed, unknown or revoked, or its
        tenant is gone. TenantDisabled if its tenant is disabled."""
        prefix = key_prefix_of(key)
        if prefix is None:
            return None
        key_hash = hash_api_key(key)
        try:
            raw, tenant_raw = await credential_and_tenant(
                self.redis, self._credential(key_hash), self._tenant("")
            )
        except RedisError as exc:
            raise StorageUnavailable(f"API key store (Redis) unavailable: {exc}") from exc
        if raw is None:  # not cached (new, or Redis lost it): the bucket knows
            raw = await self.records.get(_credential_record(key_hash))
            try:
                if raw is None:
                    await self.redis.set(self._credential(key_hash), _UNKNOWN, ex=_UNKNOWN_TTL_S)
                else:
                    await self.redis.set(self._credential(key_hash), raw, ex=_CACHED_TTL_S)
            except RedisError as exc:
                raise StorageUnavailable(f"API key store (Redis) unavailable: {exc}") from exc
        if raw is None or raw == _UNKNOWN:
            return None
        credential = _Credential.model_validate_json(raw)
        if credential.prefix != prefix:  # cannot happen short of a hash collision
            return None
        tenant = (
            Tenant.model_validate_json(tenant_raw)
            if tenant_raw is not None
            else await self._cached_tenant(credential.tenant_id)
        )
        if tenant is None or tenant.deleted_at is not None:
            return None
        if tenant.disabled_at is not None:
            raise TenantDisabled(
                f"tenant {tenant.id!r} is disabled by the operator since "
                f"{tenant.disabled_at.isoformat()}: {tenant.disabled_reason or 'no reason given'}"
            )
        await self._mark_used(prefix)
        return Caller(tenant_id=credential.tenant_id, key_prefix=prefix)

    async def _mark_used(self, prefix: str) -> None:
        now = time.monotonic()
        if now - self._used_written.get(prefix, -_USED_EVERY_S) < _USED_EVERY_S:
            return
        self._used_written[prefix] = now
        if len(self._used_written) > 100_000:
            self._used_written.clear()
        try:
            await self.redis.set(self._used(prefix), utc_now().isoformat())
        except RedisError:
            pass  # a convenience for the listing: never a reason to refuse the request

    async def _cached_tenant(self, tenant_id: str) -> Tenant | None:
        try:
            raw = await self.redis.get(self._tenant(tenant_id))
        except RedisError as exc:
            raise StorageUnavailable(f"tenant store (Redis) unavailable: {exc}") from exc
        if raw is None:
            raw = await self.records.get(_tenant_record(tenant_id))
            if raw is None:
                return None
            await self._cache_tenant_raw(tenant_id, raw)
        return Tenant.model_validate_json(raw)

    async def _cache_tenant_raw(self, tenant_id: str, raw: bytes | str) -> None:
        try:
            await self.redis.set(self._tenant(tenant_id), raw, ex=_CACHED_TTL_S)
        except RedisError as exc:
            raise StorageUnavailable(f"tenant store (Redis) unavailable: {exc}") from exc

    async def _save_tenant(self, tenant: Tenant) -> None:
        raw = tenant.model_dump_json().encode()
        await self.records.put(_tenant_record(tenant.id), raw)
        await self._cache_tenant_raw(tenant.id, raw)

    # -- tenants

    async def create_tenant(self, tenant_id: str, name: str) -> Tenant:
        tenant = Tenant(id=tenant_id, name=name)
        raw = tenant.model_dump_json().encode()
        if not await self.records.create(_tenant_record(tenant_id), raw):
            existing = await self.records.get(_tenant_record(tenant_id))
            if existing is not None and Tenant.model_validate_json(existing).deleted_at:
                raise TenantExists(tenant_id, deleted=True)
            raise TenantExists(tenant_id)
        await self._cache_tenant_raw(tenant_id, raw)
        return tenant

    async def get_tenant(self, tenant_id: str) -> Tenant:
        """The tenant (disabled or not); TenantNotFound if there is none, or it was deleted."""
        tenant = await self._cached_tenant(tenant_id)
        if tenant is None or tenant.deleted_at is not None:
            raise TenantNotFound(tenant_id)
        return tenant

    async def list_tenants(self) -> list[Tenant]:
        tenants = [
            Tenant.model_validate_json(raw) for _, raw in await self.records.values("tenant.*")
        ]
        return sorted(
            (t for t in tenants if t.deleted_at is None), key=lambda t: (t.created_at, t.id)
        )

    async def disable(self, tenant_id: str, reason: str) -> Tenant:
        """Its keys answer 403 naming the reason from the next request on; its tasks go on."""
        tenant = await self.get_tenant(tenant_id)
        disabled = tenant.model_copy(
            update={"disabled_at": tenant.disabled_at or utc_now(), "disabled_reason": reason}
        )
        await self._save_tenant(disabled)
        return disabled

    async def enable(self, tenant_id: str) -> Tenant:
        tenant = await self.get_tenant(tenant_id)
        enabled = tenant.model_copy(update={"disabled_at": None, "disabled_reason": None})
        await self._save_tenant(enabled)
        return enabled

    async def delete_tenant(self, tenant_id: str) -> int:
        """Revoke every key of the tenant and leave a tombstone (the id is not given again, so
        that nobody inherits its tasks); the number of keys revoked."""
        tenant = await self.get_tenant(tenant_id)
        revoked = 0
        for record in await self._key_records(tenant_id):
            if record.revoked_at is None:
                await self._revoke(record)
                revoked += 1
        await self._save_tenant(tenant.model_copy(update={"deleted_at": utc_now()}))
        return revoked

    # -- keys

    async def issue_key(
        self, tenant_id: str, name: str, created_by: str | None = None
    ) -> NewApiKey:
        await self.get_tenant(tenant_id)
        working = [r for r in await self._key_records(tenant_id) if r.revoked_at is None]
        if len(working) >= self.max_keys:
            raise TooManyKeys(
                f"tenant {tenant_id!r} holds {len(working)} working API keys, the most it may "
                f"(DECKHANDS_MAX_API_KEYS_PER_TENANT={self.max_keys}): revoke one first"
            )
        issued = issue_api_key()
        record = ApiKeyRecord(
            prefix=issued.prefix,
            tenant_id=tenant_id,
            name=name,
            key_hash=issued.key_hash,
            created_by=created_by,
        )
        credential = _Credential(prefix=issued.prefix, tenant_id=tenant_id).model_dump_json()
        await self.records.put(
            _key_record(tenant_id, issued.prefix), record.model_dump_json().encode()
        )
        await self.records.put(_credential_record(issued.key_hash), credential.encode())
        try:
            await self.redis.set(self._credential(issued.key_hash), credential, ex=_CACHED_TTL_S)
        except RedisError as exc:
            raise StorageUnavailable(f"API key store (Redis) unavailable: {exc}") from exc
        return NewApiKey(record=record, key=issued.key)

    async def _key_records(self, tenant_id: str) -> list[ApiKeyRecord]:
        found = await self.records.values(f"apikey.{tenant_id}.*")
        records = [ApiKeyRecord.model_validate_json(raw) for _, raw in found]
        return sorted(records, key=lambda r: (r.created_at, r.prefix))

    async def list_keys(self, tenant_id: str) -> list[ApiKeyRecord]:
        """The tenant's keys, revoked ones too, oldest first."""
        await self.get_tenant(tenant_id)
        return await self._key_records(tenant_id)

    async def last_used(self, prefixes: list[str]) -> dict[str, datetime]:
        """When each key was last used, as far as Redis remembers (to the minute)."""
        if not prefixes:
            return {}
        try:
            raws = await self.redis.mget([self._used(p) for p in prefixes])
        except RedisError as exc:
            raise StorageUnavailable(f"API key store (Redis) unavailable: {exc}") from exc
        return {
            prefix: datetime.fromisoformat(_text(raw))
            for prefix, raw in zip(prefixes, raws, strict=True)
            if raw is not None
        }

    async def revoke_key(
        self, tenant_id: str, prefix: str, *, keep_one: bool = False
    ) -> ApiKeyRecord:
        """Revoke a key (again: a no-op but for the cache); its record stays, with the time of
        revocation. With `keep_one`, refuse (LastKey) to revoke the tenant's last working key."""
        raw = await self.records.get(_key_record(tenant_id, prefix))
        if raw is None:
            raise ApiKeyNotFound(tenant_id, prefix)
        record = ApiKeyRecord.model_validate_json(raw)
        if keep_one and record.revoked_at is None:
            working = [r for r in await self._key_records(tenant_id) if r.revoked_at is None]
            if [r.prefix for r in working] == [prefix]:
                raise LastKey(
                    f"{prefix} is tenant {tenant_id!r}'s last working key: revoking it would "
                    "leave no key but the operator's to make another. Create another key first "
                    "(POST /v1/keys), or send ?force=true"
                )
        return await self._revoke(record)

    async def _revoke(self, record: ApiKeyRecord) -> ApiKeyRecord:
        revoked = record
        if record.revoked_at is None:
            revoked = record.model_copy(update={"revoked_at": utc_now()})
            await self.records.put(
                _key_record(record.tenant_id, record.prefix), revoked.model_dump_json().encode()
            )
        await self.records.delete(_credential_record(record.key_hash))
        try:
            await self.redis.delete(self._credential(record.key_hash))
        except RedisError as exc:
            raise StorageUnavailable(f"API key store (Redis) unavailable: {exc}") from exc
        return revoked


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
