"""HTTP route of /v1/quotas: the caller's quotas in force and what it uses of them. Logic
lives in TenantQuotas."""

from __future__ import annotations

from fastapi import APIRouter

from .auth import CallerDep
from .context import TenantQuotasDep
from .models import ErrorResponse, QuotasView, QuotaUsage
from .quotas import TenantQuotas

__all__ = ["quotas_view", "router"]

router = APIRouter(
    prefix="/v1/quotas",
    tags=["quotas"],
    responses={
        401: {"model": ErrorResponse, "description": "No API key, or an unknown or revoked one"},
        503: {"model": ErrorResponse, "description": "Redis unavailable; retry"},
    },
)


async def quotas_view(quotas: TenantQuotas, tenant_id: str) -> QuotasView:
    own = await quotas.limits(tenant_id)
    running, sandboxes, spent = await quotas.usage(tenant_id)
    return QuotasView(
        tenant_id=tenant_id,
        limits=quotas.quotas_of(own),
        own=own,
        usage=QuotaUsage(running_tasks=running, sandboxes=sandboxes, spend_usd_today=spent),
    )


@router.get("", response_model=QuotasView, summary="The caller's quotas and its use of them")
async def my_quotas(caller: CallerDep, quotas: TenantQuotasDep) -> QuotasView:
    return await quotas_view(quotas, caller.tenant_id)
