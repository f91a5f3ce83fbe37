"""Request and response bodies of the admin API's tenants and of API keys (/v1/admin, /v1/keys)."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from ..http.models import ApiRequest, ApiView
from .store import TENANT_ID_PATTERN, ApiKeyRecord, Tenant

__all__ = [
    "ApiKeyList",
    "ApiKeyView",
    "CreateApiKeyRequest",
    "CreateTenantRequest",
    "DeletedTenantView",
    "DisableTenantRequest",
    "IssuedApiKey",
    "TenantList",
    "TenantView",
]


class CreateTenantRequest(ApiRequest):
    id: str = Field(
        pattern=TENANT_ID_PATTERN,
        description="The tenant's id: lowercase letters, digits and '-', at most 63.",
    )
    name: str = Field(default="", max_length=200, description="A name for people; the id if empty.")


class TenantView(ApiView):
    id: str
    name: str
    created_at: datetime
    disabled_at: datetime | None = Field(
        default=None, description="Since when its keys answer 403 (null: enabled)."
    )
    disabled_reason: str | None = None

    @classmethod
    def of(cls, tenant: Tenant) -> TenantView:
        return cls(
            id=tenant.id,
            name=tenant.name,
            created_at=tenant.created_at,
            disabled_at=tenant.disabled_at,
            disabled_reason=tenant.disabled_reason,
        )


class DisableTenantRequest(ApiRequest):
    reason: str = Field(
        default="",
        max_length=500,
        description="Why: every request with the tenant's keys is answered 403 with it.",
    )


class DeletedTenantView(ApiView):
    id: str
    keys_revoked: int
    tasks_stopped: int = Field(description="Tasks asked to stop (with ?force=true).")


class TenantList(ApiView):
    tenants: list[TenantView]


class CreateApiKeyRequest(ApiRequest):
    name: str = Field(default="", max_length=200, description="What the key is for.")


class ApiKeyView(ApiView):
    """A key as lists show it: never the key itself, which only its creation answer carries."""

    prefix: str = Field(description="The key's first characters (`dh_<id>`): how to name it.")
    tenant_id: str
    name: str
    created_at: datetime
    revoked_at: datetime | None
    last_used_at: datetime | None = Field(
        default=None, description="When it last authenticated a request (to the minute)."
    )
    created_by: str | None = Field(
        default=None, description="The prefix of the key that made it; null: the operator."
    )

    @classmethod
    def of(cls, record: ApiKeyRecord, last_used_at: datetime | None = None) -> ApiKeyView:
        return cls(
            prefix=record.prefix,
            tenant_id=record.tenant_id,
            name=record.name,
            created_at=record.created_at,
            revoked_at=record.revoked_at,
            last_used_at=last_used_at,
            created_by=record.created_by,
        )


class IssuedApiKey(ApiKeyView):
    key: str = Field(description="The key: shown this once, only its hash is kept.")


class ApiKeyList(ApiView):
    keys: list[ApiKeyView]
