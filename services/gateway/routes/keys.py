"""HTTP routes of /v1/keys: a tenant manages its own API keys with one of them (self-service).
A key made here is shown once; the tenant's last working key is not revoked by accident (409
unless `?force=true`). Logic lives in TenantStore; every change is an audit log line."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, status

from ..context import TenantStoreDep
from ..http.auth import CallerDep
from ..http.models import ErrorResponse, InvalidRequestResponse
from ..tenants.api_keys import KEY_PREFIX_PATTERN
from ..tenants.audit import audit
from ..tenants.models import ApiKeyList, ApiKeyView, CreateApiKeyRequest, IssuedApiKey
from ..tenants.store import Caller

__all__ = ["router"]

_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorResponse, "description": "No API key, or an unknown or revoked one"},
    403: {"model": ErrorResponse, "description": "The tenant is disabled (the answer says why)"},
    422: {"model": InvalidRequestResponse, "description": "An invalid field (each named)"},
    503: {"model": ErrorResponse, "description": "The key store unavailable; retry"},
}

router = APIRouter(prefix="/v1/keys", tags=["keys"], responses=_RESPONSES)


def _actor(caller: Caller) -> str:
    return f"tenant:{caller.tenant_id}/{caller.key_prefix}"


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=IssuedApiKey,
    responses={409: {"model": ErrorResponse, "description": "As many working keys as allowed"}},
    summary="Make another key for the caller's tenant (the answer is the only time it is shown)",
)
async def create_key(
    body: CreateApiKeyRequest, caller: CallerDep, tenants: TenantStoreDep
) -> IssuedApiKey:
    issued = await tenants.issue_key(caller.tenant_id, body.name, created_by=caller.key_prefix)
    audit(
        _actor(caller),
        "key.create",
        tenant=caller.tenant_id,
        key=issued.record.prefix,
        name=body.name,
    )
    return IssuedApiKey(**ApiKeyView.of(issued.record).model_dump(), key=issued.key)


@router.get(
    "",
    response_model=ApiKeyList,
    summary="The caller's tenant's keys by prefix (revoked ones too), oldest first",
)
async def list_keys(caller: CallerDep, tenants: TenantStoreDep) -> ApiKeyList:
    records = await tenants.list_keys(caller.tenant_id)
    used = await tenants.last_used([k.prefix for k in records])
    return ApiKeyList(keys=[ApiKeyView.of(k, used.get(k.prefix)) for k in records])


@router.delete(
    "/{prefix}",
    response_model=ApiKeyView,
    responses={
        404: {"model": ErrorResponse, "description": "The tenant has no such key"},
        409: {"model": ErrorResponse, "description": "The tenant's last working key"},
    },
    summary="Revoke one of the tenant's keys (the caller's own too): it fails from the next "
    "request on",
)
async def revoke_key(
    prefix: Annotated[str, Path(pattern=KEY_PREFIX_PATTERN, description="`dh_<id>`")],
    caller: CallerDep,
    tenants: TenantStoreDep,
    force: Annotated[
        bool, Query(description="Revoke it even if it is the tenant's last working key.")
    ] = False,
) -> ApiKeyView:
    revoked = await tenants.revoke_key(caller.tenant_id, prefix, keep_one=not force)
    audit(_actor(caller), "key.revoke", tenant=caller.tenant_id, key=prefix, force=force)
    return ApiKeyView.of(revoked)
