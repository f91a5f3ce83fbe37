"""HTTP routes of /v1/admin: tenants, their API keys and their limits, for the operator (the
admin key). Logic lives in TenantStore, TenantService and TenantQuotas. Every change is a line
of the audit log (services.gateway.tenants.audit)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, status

from ..context import TenantQuotasDep, TenantServiceDep, TenantStoreDep
from ..http.auth import AdminDep
from ..http.models import ErrorResponse, InvalidRequestResponse
from ..quotas.limits import TenantLimits
from ..quotas.models import QuotasView
from ..quotas.service import quotas_view
from ..tenants.api_keys import KEY_PREFIX_PATTERN
from ..tenants.audit import ADMIN, audit
from ..tenants.models import (
    ApiKeyList,
    ApiKeyView,
    CreateApiKeyRequest,
    CreateTenantRequest,
    DeletedTenantView,
    DisableTenantRequest,
    IssuedApiKey,
    TenantList,
    TenantView,
)
from ..tenants.store import TENANT_ID_PATTERN

__all__ = ["router"]

_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorResponse, "description": "No admin key, or a wrong one"},
    422: {"model": InvalidRequestResponse, "description": "An invalid field (each named)"},
    503: {"model": ErrorResponse, "description": "Redis unavailable; retry"},
}
_NO_TENANT: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorResponse, "description": "Unknown tenant"}
}

router = APIRouter(
    prefix="/v1/admin", tags=["admin"], dependencies=[AdminDep], responses=_RESPONSES
)

TenantId = Annotated[str, Path(pattern=TENANT_ID_PATTERN)]


@router.post(
    "/tenants",
    status_code=status.HTTP_201_CREATED,
    response_model=TenantView,
    responses={409: {"model": ErrorResponse, "description": "The tenant exists already"}},
    summary="Create a tenant",
)
async def create_tenant(body: CreateTenantRequest, tenants: TenantStoreDep) -> TenantView:
    tenant = await tenants.create_tenant(body.id, body.name or body.id)
    audit(ADMIN, "tenant.create", tenant=tenant.id, name=tenant.name)
    return TenantView.of(tenant)


@router.get("/tenants", response_model=TenantList, summary="Every tenant, oldest first")
async def list_tenants(tenants: TenantStoreDep) -> TenantList:
    return TenantList(tenants=[TenantView.of(t) for t in await tenants.list_tenants()])


@router.get(
    "/tenants/{tenant_id}", response_model=TenantView, responses=_NO_TENANT, summary="A tenant"
)
async def get_tenant(tenant_id: TenantId, tenants: TenantStoreDep) -> TenantView:
    return TenantView.of(await tenants.get_tenant(tenant_id))


@router.post(
    "/tenants/{tenant_id}/disable",
    response_model=TenantView,
    responses=_NO_TENANT,
    summary="Disable a tenant: its keys answer 403 with the reason; its tasks go on",
)
async def disable_tenant(
    tenant_id: TenantId, body: DisableTenantRequest, admin: TenantServiceDep
) -> TenantView:
    return TenantView.of(await admin.disable(tenant_id, body.reason))


@router.post(
    "/tenants/{tenant_id}/enable",
    response_model=TenantView,
    responses=_NO_TENANT,
    summary="Enable a disabled tenant: its keys work again",
)
async def enable_tenant(tenant_id: TenantId, admin: TenantServiceDep) -> TenantView:
    return TenantView.of(await admin.enable(tenant_id))


@router.delete(
    "/tenants/{tenant_id}",
    response_model=DeletedTenantView,
    responses={
        **_NO_TENANT,
        409: {"model": ErrorResponse, "description": "The tenant has live tasks (no force)"},
    },
    summary="Delete a tenant: its keys are revoked and its id is not given again",
)
async def delete_tenant(
    tenant_id: TenantId,
    admin: TenantServiceDep,
    force: Annotated[
        bool, Query(description="Stop the tenant's live tasks rather than refuse (409).")
    ] = False,
) -> DeletedTenantView:
    deleted = await admin.delete(tenant_id, force=force)
    return DeletedTenantView(
        id=deleted.tenant_id,
        keys_revoked=deleted.keys_revoked,
        tasks_stopped=deleted.tasks_stopped,
    )


@router.post(
    "/tenants/{tenant_id}/keys",
    status_code=status.HTTP_201_CREATED,
    response_model=IssuedApiKey,
    responses={
        **_NO_TENANT,
        409: {"model": ErrorResponse, "description": "As many working keys as allowed"},
    },
    summary="Issue an API key to the tenant (the answer is the only time the key is shown)",
)
async def issue_key(
    tenant_id: TenantId, body: CreateApiKeyRequest, tenants: TenantStoreDep
) -> IssuedApiKey:
    issued = await tenants.issue_key(tenant_id, body.name)
    audit(ADMIN, "key.create", tenant=tenant_id, key=issued.record.prefix, name=body.name)
    return IssuedApiKey(**ApiKeyView.of(issued.record).model_dump(), key=issued.key)


@router.get(
    "/tenants/{tenant_id}/keys",
    response_model=ApiKeyList,
    responses=_NO_TENANT,
    summary="The tenant's keys by prefix, revoked ones included, oldest first",
)
async def list_keys(tenant_id: TenantId, tenants: TenantStoreDep) -> ApiKeyList:
    records = await tenants.list_keys(tenant_id)
    used = await tenants.last_used([k.prefix for k in records])
    return ApiKeyList(keys=[ApiKeyView.of(k, used.get(k.prefix)) for k in records])


@router.delete(
    "/tenants/{tenant_id}/keys/{prefix}",
    response_model=ApiKeyView,
    responses={404: {"model": ErrorResponse, "description": "Unknown tenant or key"}},
    summary="Revoke a key: it fails from the next request on (revoking it again changes nothing)",
)
async def revoke_key(
    tenant_id: TenantId,
    prefix: Annotated[str, Path(pattern=KEY_PREFIX_PATTERN, description="`dh_<id>`")],
    tenants: TenantStoreDep,
) -> ApiKeyView:
    revoked = await tenants.revoke_key(tenant_id, prefix)
    audit(ADMIN, "key.revoke", tenant=tenant_id, key=prefix)
    return ApiKeyView.of(revoked)


@router.get(
    "/tenants/{tenant_id}/limits",
    response_model=QuotasView,
    responses=_NO_TENANT,
    summary="The tenant's limits (its own and those in force) and its use of them",
)
async def get_limits(
    tenant_id: TenantId, tenants: TenantStoreDep, quotas: TenantQuotasDep
) -> QuotasView:
    await tenants.get_tenant(tenant_id)
    return await quotas_view(quotas, tenant_id)


@router.put(
    "/tenants/{tenant_id}/limits",
    response_model=QuotasView,
    responses=_NO_TENANT,
    summary="Set the tenant's own limits (a field left out or null: the server's default)",
)
async def set_limits(
    tenant_id: TenantId, body: TenantLimits, tenants: TenantStoreDep, quotas: TenantQuotasDep
) -> QuotasView:
    await tenants.get_tenant(tenant_id)
    await quotas.set_limits(tenant_id, body)
    audit(ADMIN, "tenant.limits", tenant=tenant_id, **body.model_dump(exclude_none=True))
    return await quotas_view(quotas, tenant_id)
